"""Benchmarks as episodes: one data model, dataset URIs, scorers and splits.

``load_dataset(uri)`` turns a ``--dataset`` URI into a :class:`Dataset` of
:class:`Episode` s (sessions of turns to ingest, then questions with gold answers,
evidence turn ids, task type and scorer); ``score`` / ``passed`` grade a prediction
with the question's own scorer; ``split_episodes`` makes train/dev/test splits by
episode. URIs (see :mod:`optloop.datasets._registry`)::

    builtin:tiny  builtin:suite  builtin:meme  builtin:assistant
    memfail:<coexisting|conditional_easy|conditional_hard|persona|long_hop>[:path]
    locomo:<path>  longmemeval:<path>  meme:<path>  jsonl:<path>
    synthetic:meme?seed=K&episodes=N&fillers=F&domain=workplace|household
    synthetic:suite?seed=K
    synthetic:recall?seed=K&episodes=N
    ...?tasks=a,b&offset=N&limit=N&questions=N   (any scheme)

Every load failure is an :class:`optloop.errors.DatasetError` naming file, line or
record, and field. Nothing in this package calls an LM.
"""

from __future__ import annotations

from optloop.datasets._model import Dataset, Episode, Question, ScorerName, Session, Turn
from optloop.datasets._registry import LOADERS, load_dataset, parse_uri
from optloop.datasets.jsonl import write_jsonl
from optloop.datasets.scorers import Judge, pass_threshold, passed, score
from optloop.datasets.split import split_episodes

__all__ = [
    "LOADERS",
    "Dataset",
    "Episode",
    "Judge",
    "Question",
    "ScorerName",
    "Session",
    "Turn",
    "load_dataset",
    "parse_uri",
    "pass_threshold",
    "passed",
    "score",
    "split_episodes",
    "write_jsonl",
]
