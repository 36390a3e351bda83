"""``python -m optloop.run`` as a subprocess, its state and MLflow store in a test's directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_cli(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``optloop.run args`` from the checkout, its state in ``tmp_path/state`` and its MLflow store
    in ``tmp_path/ml``; ``env`` on top of this process's environment."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "optloop.run",
            *args,
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={
            **os.environ,
            "OPTLOOP_HOME": str(tmp_path / "state"),
            "OPTLOOP_MLRUNS": str(tmp_path / "ml"),
            **(env or {}),
        },
    )
