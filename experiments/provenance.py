"""The provenance header every results file carries: the command, the date, the commit, the model,
the machine.

A benchmark writes its JSON through :func:`stamped`, so the figures in it say once, at the top, how
they were made; ``python -m experiments.report`` shows that header above them in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's commit (``+`` when it has uncommitted changes), or ``unknown`` outside a git
    checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def machine() -> str:
    """``2 CPUs (x86_64), 24 GiB, Linux``: what the timings were taken on."""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"{os.cpu_count()} CPUs ({platform.machine()}){memory}, {platform.system()}"


def command_of(module: str, argv: Sequence[str] | None = None) -> str:
    """``python -m module args``, quoted for a shell: the command a benchmark ran as (``argv``, by
    default this process's arguments)."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def flag_of(command: str, flag: str) -> str | None:
    """The value ``command`` gives ``flag`` (``--flag VALUE`` or ``--flag=VALUE``), if any."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(f"{flag}="):
            return word.split("=", 1)[1]
    return None


def provenance(model: str, command: str | None = None) -> dict[str, str]:
    """The header: ``command`` (default: this process's own, as ``python -m module args``), today's
    date (UTC), the commit, ``model`` and the machine."""
    if command is None:
        module = sys.modules["__main__"].__spec__
        head = ["python", "-m", module.name] if module is not None else ["python", sys.argv[0]]
        command = shlex.join([*head, *sys.argv[1:]])
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": commit(),
        "model": model,
        "machine": machine(),
    }


def stamped(data: dict[str, Any], model: str, command: str | None = None) -> dict[str, Any]:
    """``data`` with its provenance header first (an older header is replaced)."""
    return {
        "provenance": provenance(model, command),
        **{k: v for k, v in data.items() if k != "provenance"},
    }


def model_of(args: Any) -> str:
    """The model a benchmark's ``--lm`` flag named, as a results header states it."""
    from optloop.lm import LMSettings
    from optloop.lm.settings import bundled_model_path

    settings = LMSettings.from_spec(getattr(args, "lm", None))
    if settings.backend == "openai":
        name = f"openai:{settings.model}"
    else:
        name = (
            Path(settings.model).name
            if settings.model
            else f"{bundled_model_path().name} (embedded, llama.cpp)"
        )
    if proposer := getattr(args, "proposer_lm", None):
        name += f"; {model_of(argparse.Namespace(lm=proposer))} writes"
    return name
