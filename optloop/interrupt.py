"""SIGTERM and SIGINT turned into one ``KeyboardInterrupt``, so a long command saves its state and
stops."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def interruptible() -> Iterator[list[str]]:
    """SIGTERM and SIGINT (Ctrl-C) raise ``KeyboardInterrupt`` in the main thread, once: the run
    checkpoints, ends its MLflow runs as KILLED and stops. A repeated signal is ignored while it
    does (SIGKILL still stops it at once). Yields the names of the signals received."""
    got: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: Any) -> None:
        got.append(signal.Signals(signum).name)
        if len(got) == 1:
            raise KeyboardInterrupt(got[0])
        print(
            f"optloop: {got[-1]} again: still saving the run (SIGKILL stops at once)",
            file=sys.stderr,
        )

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
