"""optloop against llama.cpp's own OpenAI-compatible server, by command-line flags alone.

The test starts ``python -m llama_cpp.server`` on the bundled SmolLM2 GGUF on a free loopback
port, as a user would (``tests/_llama_server.py``), and runs the CLIs with ``--lm openai:smollm2
--lm-base-url URL`` and nothing else: the schema mode (llama.cpp's server refuses ``json_schema``)
and the concurrency (it answers one request at a time) are found at start-up. Small datasets keep
it to a few minutes, in ``make test``; mem0's budget-1 run is ``slow`` (``make test-all``): mem0's
~8,600-token extraction prompt takes minutes a call on a 2-core CPU server. Run it under the
machine's LM lock (``flock /tmp/optloop-lm.lock``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._llama_server import MODEL_ALIAS, LlamaServer, llama_server, server_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(server_available() is not None, reason=str(server_available())),
]

RECALL = "synthetic:recall?seed=0&episodes=8"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> LlamaServer:
    with llama_server(tmp_path_factory.mktemp("llama-server")) as running:
        yield running


def cli(
    module: str, args: list[str], base_url: str, tmp_path: Path, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` against ``base_url``: ``module`` is ``optloop.run`` or
    ``optloop COMMAND``."""
    env = {
        **os.environ,
        "OPTLOOP_HOME": str(tmp_path / "state"),
        "OPTLOOP_MLRUNS": str(tmp_path / "mlruns"),
        "MEM0_TELEMETRY": "False",
    }
    for name in (
        "OPTLOOP_LM",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPTLOOP_CONCURRENCY",
        "OPTLOOP_LM_SCHEMA_MODE",
    ):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        *module.split(),
        *args,
        # small datasets keep these runs to minutes; their figures are not the point here
        *(["--allow-small-splits"] if module == "optloop.run" else []),
        "--lm",
        f"openai:{MODEL_ALIAS}",
        "--lm-base-url",
        base_url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_doctor_finds_the_schema_mode_and_the_concurrency(server, tmp_path):
    result = cli("optloop doctor", [], server.base_url, tmp_path)
    out = result.stdout + result.stderr
    print(out)  # pytest -rP shows it: the schema mode and the concurrency chosen, and why
    assert result.returncode == 0, out[-3000:]
    assert (
        "schema mode json_object, chosen by --lm-schema-mode auto; json_schema: refused (HTTP 500"
        in out
    )
    # the probe times 1 request against 4 at once: this one-slot server is read as 1 on a quiet
    # machine; other processes on the cores can make one lone request slow enough to read 2
    chosen = re.search(r"--concurrency (\d+) \(auto: ", out)
    assert chosen is not None and int(chosen.group(1)) <= 2, out[-3000:]
    assert "all checks passed" in out


def test_rag_bm25_budget_1_runs_and_attribute_reports(server, tmp_path):
    run = cli(
        "optloop.run",
        [
            "--system",
            "rag_bm25",
            "--query-rewrite",
            "--dataset",
            RECALL,
            "--optimizer",
            "edit",
            "--budget",
            "1",
            "--json",
            str(tmp_path / "run.json"),
        ],
        server.base_url,
        tmp_path,
    )
    print(run.stdout + run.stderr)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["lm"]["errors"] == 0 and result["n_test"] > 0 and not result["failed_calls"]
    attribute = cli(
        "optloop attribute",
        [
            "--system",
            "rag_bm25",
            "--dataset",
            RECALL,
            "--no-traces",
            "--json",
            str(tmp_path / "attr.json"),
        ],
        server.base_url,
        tmp_path,
    )
    print(attribute.stdout + attribute.stderr)
    assert attribute.returncode == 0, (attribute.stdout + attribute.stderr)[-3000:]
    report = json.loads((tmp_path / "attr.json").read_text())
    assert report["questions"] == 16 and report["failed_calls"] == 0


@pytest.mark.slow  # mem0's ~8,600-token extraction prompt: minutes a call on a 2-core CPU server
def test_mem0_budget_1_runs_at_the_default_concurrency(server, tmp_path):
    # mem0's ~8,600-token prompt on a 2-core CPU server takes up to 3 minutes a call when it is
    # evaluated in full: --lm-timeout (docs/servers.md). The run takes about 50 min on 2 cores
    # (experiments/results/servers.md).
    run = cli(
        "optloop.run",
        [
            "--system",
            "mem0",
            "--dataset",
            "builtin:tiny",
            "--optimizer",
            "edit",
            "--budget",
            "1",
            "--lm-timeout",
            "300",
            "--json",
            str(tmp_path / "run.json"),
        ],
        server.base_url,
        tmp_path,
        timeout=5400,
    )
    out = run.stdout + run.stderr
    print(out)
    assert run.returncode == 0, out[-3000:]
    assert "--concurrency 1 (auto" in out
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["lm"]["errors"] == 0 and result["n_test"] > 0


def test_an_over_long_prompt_is_a_request_error_naming_the_context(server):
    from optloop.lm import LMRequestError, LMSettings, OptloopLM

    lm = OptloopLM(
        LMSettings.from_spec(f"openai:{MODEL_ALIAS}", base_url=server.base_url, cache=False)
    )
    with pytest.raises(LMRequestError) as info:
        lm.text("memory " * 14000)
    message = str(info.value)
    print(f"{type(info.value).__name__} (exit {info.value.exit_code}): {message}")
    assert "the server's context is 12288" in message and "--n_ctx" in message
    assert lm.accounting.records[-1].attempts == 1


def test_a_run_whose_calls_fail_stops_with_exit_4_instead_of_reporting(tmp_path):
    # mem0's extraction prompt (~8,600 tokens) does not fit llama.cpp's default 2,048-token
    # context.
    with llama_server(tmp_path, n_ctx=2048) as small:
        run = cli(
            "optloop.run",
            [
                "--system",
                "mem0",
                "--dataset",
                "builtin:tiny",
                "--optimizer",
                "edit",
                "--budget",
                "1",
            ],
            small.base_url,
            tmp_path,
        )
    out = run.stdout + run.stderr
    print(f"exit {run.returncode}\n{out}")
    assert run.returncode == 4, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert (
        "LM calls failed after their retries in the train evaluation of candidate baseline" in last
    )
    assert "the server's context is 2048" in last and "--n_ctx" in last
    assert "test accuracy" not in out
