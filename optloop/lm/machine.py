"""One machine, many runs: a machine-wide budget of llama.cpp threads.

Every process that runs the embedded model (llama.cpp in-process) takes a *slot* before each model
call and gives it back after. A slot is an exclusive ``fcntl.flock`` on one of
``OPTLOOP_LLAMA_SLOTS`` lock files (default 1) in ``OPTLOOP_LOCK_DIR`` (default a per-user
directory in the system temp dir); each slot's holder runs llama.cpp with ``cpu_count // slots``
threads, so at most ``cpu_count`` llama.cpp threads run on the machine at a time, however many
runs share it. The kernel releases a flock when its holder dies, so a killed run never leaves the
machine locked; the lock files are never deleted. Why one slot rather than a split of the cores:
``docs/architecture.md`` ("The LM layer", one machine, many runs).

This module uses only the standard library, so tests can load it without DSPy.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_DIR_ENV = "OPTLOOP_LOCK_DIR"
SLOTS_ENV = "OPTLOOP_LLAMA_SLOTS"


def lock_dir() -> Path:
    """Where machine-wide lock files live: ``$OPTLOOP_LOCK_DIR``, else
    ``<tmp>/optloop-<uid>-locks``."""
    configured = os.environ.get(LOCK_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(tempfile.gettempdir()) / f"optloop-{os.getuid()}-locks"


def count_from_env(name: str, default: int) -> int:
    """A whole number of at least 1 from the environment variable ``name`` (``default`` when
    unset); anything else is a ``ConfigError`` naming the variable."""
    raw = os.environ.get(name, str(default)).strip()
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        from optloop.errors import ConfigError

        raise ConfigError(f"{name}={raw!r} must be a whole number of at least 1")
    return count


def llama_slots() -> int:
    """How many processes may run llama.cpp at once on this machine (``OPTLOOP_LLAMA_SLOTS``,
    default 1)."""
    return count_from_env(SLOTS_ENV, 1)


def threads_per_slot(slots: int | None = None, cpus: int | None = None) -> int:
    """llama.cpp threads for one slot's holder: the machine's cores shared out over the slots."""
    return max(1, (cpus or os.cpu_count() or 1) // (slots or llama_slots()))


class MachineSlots:
    """A file semaphore of ``slots`` exclusive flocks, shared by every process on the machine.

    ``with slots.hold() as waited:`` blocks until a slot is free; ``waited`` is the
    seconds it waited. Threads of one process exclude each other too (each hold
    opens its own file description), though callers usually serialize them first.
    """

    POLL_S = 0.05  # with several slots: how often a waiter looks for any free one

    def __init__(
        self, name: str = "llama", slots: int | None = None, directory: Path | None = None
    ):
        self.name = name
        self.slots = slots or llama_slots()
        self.directory = directory or lock_dir()
        self._warned = False

    def path(self, index: int) -> Path:
        return self.directory / f"{self.name}.{index}.lock"

    def _open(self, index: int) -> int:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(self.path(index), os.O_RDWR | os.O_CREAT, 0o600)

    def _try(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    @contextlib.contextmanager
    def hold(self) -> Iterator[float]:
        started = time.perf_counter()
        fds: list[int] = []
        try:
            for i in range(self.slots):
                fds.append(self._open(i))
        # a read-only or foreign temp dir: run, uncoordinated, rather than fail
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            if not self._warned:
                logger.warning(
                    "cannot use %s for machine-wide %s slots (%s); model calls are not "
                    "coordinated with other processes; set %s to a writable directory",
                    self.directory,
                    self.name,
                    exc,
                    LOCK_DIR_ENV,
                )
                self._warned = True
            yield 0.0
            return
        held: int | None = None
        try:
            start = (os.getpid() + threading.get_ident()) % self.slots
            order = [(start + i) % self.slots for i in range(self.slots)]
            while held is None:
                held = next((i for i in order if self._try(fds[i])), None)
                if held is None and self.slots == 1:
                    # sleeps in the kernel until the holder lets go: no polling
                    fcntl.flock(fds[0], fcntl.LOCK_EX)
                    held = 0
                elif held is None:
                    time.sleep(self.POLL_S)
            waited = time.perf_counter() - started
            if waited > 1:
                logger.debug(
                    "waited %.1fs for a %s slot (another process's model call)", waited, self.name
                )
            yield waited
        finally:
            for i, fd in enumerate(fds):
                if i == held:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
