"""Where optloop keeps its state.

``OPTLOOP_HOME`` (default ``./.optloop``) holds caches and run state: the LM
call cache, system stores, checkpoints. The MLflow store lives apart, under
``./mlruns`` (``OPTLOOP_MLRUNS``), so ``mlflow ui`` can be pointed at it alone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def state_dir(*, create: bool = True) -> Path:
    """The state directory, created on first use (``create=False``: only its path, for reading
    before a command has validated its input)."""
    path = Path(os.environ.get("OPTLOOP_HOME", ".optloop")).expanduser().resolve()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def mlruns_dir(*, create: bool = True) -> Path:
    """The MLflow store directory, created on first use (``create=False``: only its path)."""
    path = Path(os.environ.get("OPTLOOP_MLRUNS", "mlruns")).expanduser().resolve()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Replace ``path`` in one step (parent created), so a killed process never leaves half a
    file. The data is on disk before the rename (a full disk fails the write, not the file's later
    reading), and a write that fails leaves ``path`` as it was and no temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    payload = data if isinstance(data, bytes) else data.encode("utf-8")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own error is the one to report
            tmp.unlink(missing_ok=True)
        raise
    return path
