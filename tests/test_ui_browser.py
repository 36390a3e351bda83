"""The MLflow UI in a real browser: two optloop runs, compared side by side.

Headless Debian Chromium (``/usr/bin/chromium``, installed by ``make system-deps``; no
browser is downloaded) opens MLflow's compare page for two real ``optloop.run`` parent
runs on a store of their own, served by ``mlflow ui`` on a free loopback port. The
rendered DOM must name both runs and a loop metric: those assertions are the test.

What the page shows is what optloop logged, not what the model answered, so the two runs
ask a schema-valid stub endpoint (``optloop.testing.chaos.FaultyEndpoint`` with no LM, as
the reliability tests do): seconds a run instead of minutes on the embedded model. The
closed loop on the embedded model, MLflow store included, is proven by
``tests/optloop/loop/test_loop_integration.py``. With ``OPTLOOP_UPDATE_SCREENSHOT=1`` the runs
use the embedded model, so the figures are real ones, and a screenshot of the page (an
artifact, nothing is asserted of its pixels) replaces the committed one,
``experiments/results/mlflow_compare.png``; a plain test run takes none and leaves the tree
clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from optloop.testing.chaos import FaultyEndpoint

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT_COPY = REPO / "experiments" / "results" / "mlflow_compare.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RUNS = {"ui-a": ["--seed", "0"], "ui-b": ["--seed", "1"]}
SYSTEM = "md_flat"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason="no Debian chromium at /usr/bin/chromium (`make system-deps` installs it)",
    ),
]

# As `make ui` starts it: MLflow's GenAI job runner imports litellm, which without the bundled
# cost map fetches one at import and, offline, hangs the server; viewing runs needs no jobs.
UI_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _chromium(
    *args: str, profile: Path, budget_ms: int = 20000, timeout: float = 240
) -> subprocess.CompletedProcess:
    """One headless Chromium run, no network but loopback, a fresh profile."""
    shutil.rmtree(profile, ignore_errors=True)
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _wait_until_up(server: subprocess.Popen, url: str, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow ui exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(
        f"mlflow ui did not answer {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
    )


def _optloop_run(name: str, extra: list[str], log: Path, base_url: str | None) -> None:
    """``optloop.run`` on ``SYSTEM``, budget 1: against the endpoint at ``base_url``, or on the
    embedded model when it is None."""
    endpoint = ["--lm", "openai:smollm2", "--lm-base-url", base_url] if base_url else []
    cmd = [
        sys.executable,
        "-m",
        "optloop.run",
        "--system",
        SYSTEM,
        "--dataset",
        "builtin:tiny",
        "--allow-small-splits",
        "--budget",
        "1",
        "--run-name",
        name,
        *endpoint,
        *extra,
    ]
    with log.open("w") as out:
        done = subprocess.run(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=1500, check=False
        )
    assert done.returncode == 0, (
        f"{' '.join(cmd[1:])} exited {done.returncode}:\n{log.read_text()[-3000:]}"
    )


def _parent_runs(tracking_uri: str) -> tuple[str, dict[str, str]]:
    """The experiment id and {run name: run id} of the two parent runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(f"optloop-{SYSTEM}")
    assert experiment is not None, "optloop.run made no experiment"
    ids = {}
    for run in client.search_runs([experiment.experiment_id], max_results=500):
        if run.info.run_name in RUNS and "mlflow.parentRunId" not in run.data.tags:
            assert run.info.status == "FINISHED", (run.info.run_name, run.info.status)
            assert "acc_test_after" in run.data.metrics
            ids[run.info.run_name] = run.info.run_id
    assert set(ids) == set(RUNS), ids
    return experiment.experiment_id, ids


@pytest.mark.timeout(3600)
def test_mlflow_ui_compares_two_optloop_runs_in_chromium(tmp_path):
    mlruns = Path(os.environ["OPTLOOP_MLRUNS"])  # the conftest's per-test store, inherited below
    screenshot = bool(os.environ.get("OPTLOOP_UPDATE_SCREENSHOT"))
    # the stub, unless the screenshot is refreshed: see the module docstring
    with contextlib.nullcontext() if screenshot else FaultyEndpoint(None) as endpoint:
        for name, extra in RUNS.items():
            base_url = endpoint.base_url if endpoint is not None else None
            _optloop_run(name, extra, tmp_path / f"{name}.log", base_url)
    tracking_uri = f"sqlite:///{mlruns.resolve() / 'mlflow.db'}"
    experiment_id, ids = _parent_runs(tracking_uri)

    port = _free_port()
    log = tmp_path / "mlflow-ui.log"
    env = {**os.environ, **UI_ENV}
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_cli)] if mlflow_cli.exists() else [sys.executable, "-m", "mlflow"]
    cmd += [
        "ui",
        "--backend-store-uri",
        tracking_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with log.open("w") as out:
        server = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_until_up(server, f"{base}/health", log)
        # MLflow 3.17's own link from the runs table ("Compare"): getCompareRunPageRoute.
        run_ids = [ids[name] for name in RUNS]
        url = (
            f"{base}/#/compare-runs?runs={json.dumps(run_ids)}"
            f"&experiments={json.dumps([experiment_id])}"
        )
        url = url.replace(" ", "")

        wanted = ["Comparing 2 Runs", *RUNS, *run_ids, "acc_test_after"]
        missing = wanted
        for budget_ms in (20000, 60000):  # a loaded machine may need longer for the page's fetches
            dom = _chromium(
                "--dump-dom", url, profile=tmp_path / "chromium-profile", budget_ms=budget_ms
            )
            missing = [text for text in wanted if text not in dom.stdout]
            if not missing:
                break
        assert not missing, (
            f"the compare page lacks {missing}; chromium said:\n{dom.stderr[-2000:]}"
        )

        # The screenshot is an artifact for people, not a check: the DOM above is what the test
        # asserts. It is taken only to refresh the committed copy.
        if not screenshot:
            return
        png = tmp_path / "mlflow_compare.png"
        shot = _chromium(
            f"--screenshot={png}",
            "--window-size=1600,2050",
            url,
            profile=tmp_path / "chromium-profile",
            budget_ms=budget_ms,
        )  # the budget the DOM needed
        if not png.exists():
            warnings.warn(f"chromium took no screenshot: {shot.stderr[-500:]}", stacklevel=1)
        else:
            SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, SCREENSHOT_COPY)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
