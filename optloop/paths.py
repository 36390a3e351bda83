"""Where optloop keeps its state.

``OPTLOOP_HOME`` (default ``./.optloop``) holds caches and run state: the LM
call cache, system stores, checkpoints. The MLflow store lives apart, under
``./mlruns`` (``OPTLOOP_MLRUNS``), so ``mlflow ui`` can be pointed at it alone.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir(*, create: bool = True) -> Path:
    """The state directory, created on first use (``create=False``: only its path, for reading before a
    command has validated its input)."""
    path = Path(os.environ.get("OPTLOOP_HOME", ".optloop")).expanduser().resolve()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def mlruns_dir() -> Path:
    """The MLflow store directory, created on first use."""
    path = Path(os.environ.get("OPTLOOP_MLRUNS", "mlruns")).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Replace ``path`` in one step (parent created), so a killed process never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)
    return path
