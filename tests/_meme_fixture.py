"""The hand-written published-MEME fixture (``tests/fixtures/meme_published``) and a way to break a
copy of it.

One episode, ``fx_001``: five sessions (a fact session, a change-and-delete session, a
probe before and after) and two systems, ``flat`` (one memory line per fact, rewrites
and never records the deletion or the new team lead) and ``chunks`` (raw sessions
separated by ``---``). Four probes each; seven fail, each labelled with a stage.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "meme_published"
EPISODE = "src/data/fx001.json"


def copy_fixture(tmp_path: Path, change: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of the fixture under ``tmp_path``, its episode JSON passed through ``change``
    first."""
    root = tmp_path / "meme-eval"
    shutil.copytree(FIXTURE, root)
    if change is not None:
        path = root / EPISODE
        data = json.loads(path.read_text(encoding="utf-8"))
        change(data)
        path.write_text(json.dumps(data), encoding="utf-8")
    return root
