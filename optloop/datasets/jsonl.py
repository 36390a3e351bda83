"""The project's own format for user data: ``jsonl:<path>``.

One :class:`~optloop.datasets.Episode` per line, exactly the pydantic model's JSON
(``episode.model_dump_json()``); blank lines are skipped. Minimal line::

    {"id": "e1",
     "sessions": [{"id": "s1", "timestamp": "2024-05-01",
                   "turns": [{"id": "s1:t1", "role": "user", "content": "My cat is Miso."}]}],
     "questions": [{"id": "e1:q1", "question": "What is my cat's name?", "gold": "Miso",
                    "evidence_ids": ["s1:t1"], "task_type": "exact_recall", "scorer": "contains"}]}

Scorers: exact, contains, contains_all, f1, f1_multi, yes_no, multiple_choice (with
``options`` and a letter gold), abstain (with ``"abstain": true``), llm_judge. Unknown
keys are rejected so a typo cannot silently drop a field. :func:`write_jsonl` writes
the same format.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optloop.datasets._io import existing_file, read_jsonl_models
from optloop.datasets._model import Episode


def load_jsonl(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Load one episode per line; returns the dataset name and its episodes."""
    path = existing_file(rest, "jsonl")
    return f"jsonl:{path.stem}", read_jsonl_models(path, Episode, "one Episode")


def write_jsonl(episodes: Iterable[Episode], path: str | Path) -> Path:
    """Write episodes in the ``jsonl:`` format; returns the path written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for episode in episodes:
            handle.write(episode.model_dump_json() + "\n")
    return path
