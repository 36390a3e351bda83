"""The machine-wide llama.cpp slots, tested with plain processes that load no model.

The helper processes load ``optloop/lm/machine.py`` by its path (it needs only the
standard library), so each starts in milliseconds instead of importing DSPy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from optloop.errors import ConfigError
from optloop.lm import LMSettings, OptloopLM, llama_slots, threads_per_slot
from optloop.lm.machine import MachineSlots, lock_dir

MACHINE = Path(__file__).resolve().parents[3] / "optloop" / "lm" / "machine.py"

HOLDER = textwrap.dedent("""
    import importlib.util, json, sys, time
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("machine", sys.argv[1])
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    directory, slots, hold_s, out, go = (
        Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]), sys.argv[6]
    )
    out.with_suffix(".waiting").write_text("waiting")
    while go and not Path(go).exists():  # start together, however slowly each process started
        time.sleep(0.01)
    with machine.MachineSlots("llama", slots, directory).hold() as waited:
        start = time.time()
        out.with_suffix(".held").write_text("held")
        time.sleep(hold_s)
        end = time.time()
    out.write_text(json.dumps({"start": start, "end": end, "waited": waited}))
""")


def holder(
    tmp_path: Path, name: str, *, slots: int, hold_s: float, go: Path | None = None
) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(MACHINE),
            str(tmp_path / "locks"),
            str(slots),
            str(hold_s),
            str(out),
            str(go or ""),
        ]
    )
    return proc, out


def wait_for(path: Path, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def most_at_once(intervals: list[dict[str, float]]) -> int:
    events = sorted([(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize("slots", [1, 2])
def test_processes_never_hold_more_slots_than_there_are(tmp_path, slots):
    go = tmp_path / "go"
    procs = [holder(tmp_path, f"p{i}", slots=slots, hold_s=0.3, go=go) for i in range(4)]
    assert all(wait_for(out.with_suffix(".waiting")) for _, out in procs)
    go.write_text("go")
    for proc, _ in procs:
        assert proc.wait(60) == 0
    intervals = [json.loads(out.read_text()) for _, out in procs]
    assert most_at_once(intervals) <= slots
    if slots == 1:  # four holds of 0.3 s, one at a time: someone waited for the others
        assert max(i["waited"] for i in intervals) >= 0.5


def test_a_killed_holder_frees_its_slot(tmp_path):
    first, first_out = holder(tmp_path, "first", slots=1, hold_s=600)
    assert wait_for(first_out.with_suffix(".held"))
    second, second_out = holder(tmp_path, "second", slots=1, hold_s=0)
    assert wait_for(second_out.with_suffix(".waiting"))  # started, however slowly, and asking
    time.sleep(0.5)
    assert (
        second.poll() is None and not second_out.with_suffix(".held").exists()
    )  # waiting for the slot
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert second.wait(30) == 0 and json.loads(second_out.read_text())["waited"] > 0.1


def test_threads_share_the_machine_out_over_the_slots(monkeypatch):
    assert (
        threads_per_slot(1, cpus=2) == 2
        and threads_per_slot(2, cpus=2) == 1
        and threads_per_slot(4, cpus=2) == 1
    )
    assert threads_per_slot(2, cpus=16) == 8
    monkeypatch.setenv("OPTLOOP_LLAMA_SLOTS", "3")
    assert llama_slots() == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("OPTLOOP_LLAMA_SLOTS", bad)
        with pytest.raises(ConfigError, match="OPTLOOP_LLAMA_SLOTS"):
            llama_slots()


def test_the_lock_directory_is_machine_wide_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv("OPTLOOP_LOCK_DIR", raising=False)
    assert str(os.getuid()) in lock_dir().name and "OPTLOOP_HOME" not in str(lock_dir())
    assert not lock_dir().is_relative_to(
        Path(os.environ["OPTLOOP_HOME"])
    )  # separate homes still share it
    monkeypatch.setenv("OPTLOOP_LOCK_DIR", str(tmp_path / "l"))
    assert lock_dir() == tmp_path / "l"


class _InstantLlama:
    def create_chat_completion(self, **kwargs: Any) -> dict[str, Any]:
        return {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "hi"},
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


def test_a_local_model_call_waits_for_the_machine_slot_and_says_how_long(monkeypatch, tmp_path):
    from optloop.lm import LocalLlamaBackend
    from optloop.lm.llama import ContextPool

    monkeypatch.setenv("OPTLOOP_LOCK_DIR", str(tmp_path / "locks"))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setattr(
        LocalLlamaBackend, "_model", lambda self: ContextPool(lambda: _InstantLlama(), 1)
    )
    lm = OptloopLM(LMSettings.from_spec(f"local:{model}", cache=False))
    assert lm.backend.n_threads == threads_per_slot()
    done = threading.Event()
    with MachineSlots(
        "llama", 1, tmp_path / "locks"
    ).hold():  # another process's model call, in effect
        worker = threading.Thread(target=lambda: (lm.text("q"), done.set()))
        worker.start()
        assert not done.wait(0.5)  # blocked on the slot
    worker.join(10)
    assert done.is_set()
    record = lm.accounting.records[-1]
    # it waited (how long depends on when the thread got to the slot on a loaded machine: no timing
    # threshold)
    assert record.queued_s > 0 and record.seconds >= record.queued_s
    assert lm.accounting.totals().queued_s == record.queued_s


def test_an_unusable_lock_directory_degrades_to_uncoordinated_calls(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    slots = MachineSlots("llama", 1, blocker / "locks")
    with slots.hold() as waited, slots.hold():  # nothing is locked: nesting does not block
        assert waited == 0.0
    assert "not coordinated" in caplog.text
