"""``optloop ui``: the MLflow UI on optloop's store, bound to loopback, safe offline.

    optloop ui                      # http://127.0.0.1:5000, the store under mlruns/
                                    # (OPTLOOP_MLRUNS)
    optloop ui --port 5001

Open the experiment ``optloop-<system>``: one parent run per ``optloop run``, its children the
candidates; tick two parent runs and press Compare. MLflow's GenAI job runner is off unless
MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise: it imports litellm, which without
LITELLM_LOCAL_MODEL_COST_MAP tries to download its cost map at import and, with no internet,
keeps the server from ever serving. ``make ui`` runs the same.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from optloop.cli.command import CommandParser, parse_command
from optloop.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("optloop ui", __doc__)
    parser.add_argument("--port", type=int, default=5000, help="port to serve on (default 5000)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only)",
    )
    parser.add_argument(
        "--tracking-uri",
        help="the store to show (default sqlite:///mlruns/mlflow.db, or MLFLOW_TRACKING_URI)",
    )
    return parser


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``mlflow ui`` command line and environment for ``args`` (nothing is started)."""
    from optloop.services import tracking

    uri = tracking.resolve_uri(args.tracking_uri)
    if uri.startswith("sqlite:///"):
        from pathlib import Path

        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get(
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"
        ),
    }
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        "1",
    ]
    return command, env


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: give a port from 1 to 65535")
    command, env = server_command(args)
    print(f"optloop ui: http://{args.host}:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    # the server replaces this process: its exit code is the command's
    os.execvpe(command[0], command, env)
    return 0  # not reached
