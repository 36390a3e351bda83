"""Offline hygiene: ``import optloop`` changes nothing; a command applies the offline defaults
first, never overriding the user."""

from __future__ import annotations

import json
import subprocess
import sys

from optloop.offline import OFFLINE_DEFAULTS, offline_defaults, quiet_defaults

BASE = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}


def _env_after(code: str, env: dict[str, str]) -> dict[str, str]:
    script = f"{code}; import json, os; print(json.dumps(dict(os.environ)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


def test_importing_optloop_and_its_pipeline_leaves_the_environment_alone():
    env = _env_after("import optloop, optloop.pipeline, optloop.loop.runs.runner", BASE)
    assert not set(OFFLINE_DEFAULTS) & set(env)


def test_a_command_sets_the_offline_defaults_before_the_libraries_read_them():
    env = _env_after("import optloop.run, litellm; assert litellm.model_cost", BASE)
    assert env["MEM0_TELEMETRY"] == "False" and env["GRAPHITI_TELEMETRY_ENABLED"] == "false"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["HF_HUB_OFFLINE"] == "1"


def test_a_command_keeps_what_the_user_set():
    env = _env_after(
        "import optloop.run", {**BASE, "HF_HUB_OFFLINE": "0", "MEM0_TELEMETRY": "True"}
    )
    assert env["HF_HUB_OFFLINE"] == "0" and env["MEM0_TELEMETRY"] == "True"
    assert offline_defaults({"HF_HUB_OFFLINE": "0"}).keys() == OFFLINE_DEFAULTS.keys() - {
        "HF_HUB_OFFLINE"
    }


# A bar made as GEPA's engine makes its "GEPA Optimization" bar (tqdm imported after the command's
# start, no disable= of its own): it draws on stderr unless TQDM_DISABLE was set first.
GEPA_BAR = (
    "from tqdm import tqdm; bar = tqdm(total=3, desc='GEPA Optimization', unit='rollouts'); "
    "bar.update(3); bar.close()"
)


def _stderr(code: str, *argv: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=BASE, check=True
    ).stderr


def test_quiet_defaults_hide_tqdm_bars_unless_verbose_or_set_by_the_user():
    assert quiet_defaults(["--system", "mem0"], {}) == {"TQDM_DISABLE": "1"}
    assert quiet_defaults(["--verbose"], {}) == {}
    assert quiet_defaults([], {"TQDM_DISABLE": "0"}) == {}


def test_a_command_run_as_a_module_hides_third_party_bars_unless_verbose():
    """``python -m optloop.run``: the module's first statement, then its imports (tqdm's)."""
    run = (
        "import runpy, sys\n"
        "try:\n"
        "    runpy.run_module('optloop.run', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    assert "GEPA Optimization" not in _stderr(f"{run}{GEPA_BAR}", "--help")
    assert "GEPA Optimization" in _stderr(f"{run}{GEPA_BAR}", "--help", "--verbose")


def test_the_optloop_command_hides_them_before_it_imports_tqdm():
    command = "from optloop.cli.console import main; assert main(['ui', '--port', '0']) == 2\n"
    assert "GEPA Optimization" not in _stderr(f"{command}{GEPA_BAR}")


def test_importing_a_command_module_leaves_tqdm_alone():
    """A program that imports optloop.run (``optloop.optimize``) keeps its own bars."""
    assert "GEPA Optimization" in _stderr(f"import optloop.run\n{GEPA_BAR}")
