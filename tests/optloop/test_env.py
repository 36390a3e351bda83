"""Offline hygiene: ``import optloop`` changes nothing; a command applies the offline defaults
first, never overriding the user."""

from __future__ import annotations

import json
import subprocess
import sys

from optloop.offline import OFFLINE_DEFAULTS, offline_defaults

BASE = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}


def _env_after(code: str, env: dict[str, str]) -> dict[str, str]:
    script = f"{code}; import json, os; print(json.dumps(dict(os.environ)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


def test_importing_optloop_and_its_pipeline_leaves_the_environment_alone():
    env = _env_after("import optloop, optloop.pipeline, optloop.loop.runner", BASE)
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
