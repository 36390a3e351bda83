"""Dataset URIs: ``<scheme>:<rest>[?key=value&...]`` -> :class:`Dataset`.

===================================================  ==============================================
``builtin:<name>``                                   shipped in code: tiny (``builtin:``), suite,
                                                     meme, assistant
``memfail:<task>[:path]``                            coexisting, conditional_easy,
                                                     conditional_hard, persona, long_hop
``locomo:<path>``                                    official ``locomo10.json`` layout
``longmemeval:<path>``                               official LongMemEval JSON
``meme:<path>``                                      MEME records (JSON list / JSONL)
``jsonl:<path>``                                     one Episode per line (the model's JSON)
``synthetic:meme?seed=&episodes=&fillers=&domain=``  generated MEME-style episodes
``synthetic:suite?seed=``                            generated end-to-end memory check-list
``synthetic:recall?seed=&episodes=``                 generated plain fact recall (three facts, two
                                                     asked, per episode)
``agentic:<path>``                                   agent memories with workspace, status, branch
                                                     status
``agentic:generate?records=&seed=``                  generated agentic probes (``probes=``,
                                                     ``workspaces=``)
===================================================  ==============================================

Query parameters every scheme accepts, applied in this order after loading:
``tasks=a,b`` keeps questions of those task types (episodes left without questions
are dropped), ``offset=N`` skips episodes, ``limit=N`` keeps at most N episodes,
``questions=N`` keeps at most N questions per episode (``locomo:`` samples them instead,
stratified by category and seeded, and cuts conversations with ``sessions=N``; see
:mod:`optloop.datasets.locomo`). Anything else is passed to the loader, which rejects what it
does not know. All of this happens before any LM call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from optloop.datasets._io import dataset_error, int_param
from optloop.datasets._model import Dataset, Episode
from optloop.datasets.agentic import load_agentic
from optloop.datasets.builtin import load_builtin
from optloop.datasets.jsonl import load_jsonl
from optloop.datasets.locomo import PARAMS as LOCOMO_PARAMS
from optloop.datasets.locomo import load_locomo
from optloop.datasets.longmemeval import load_longmemeval
from optloop.datasets.meme import load_meme
from optloop.datasets.memfail import load_memfail
from optloop.datasets.synthetic import load_synthetic
from optloop.errors import DatasetError

logger = logging.getLogger(__name__)

Loader = Callable[[str, dict[str, str]], tuple[str, list[Episode]]]
"""``loader(rest, params) -> (dataset name, episodes)``; raises DatasetError."""

LOADERS: dict[str, Loader] = {
    "builtin": load_builtin,
    "memfail": load_memfail,
    "locomo": load_locomo,
    "longmemeval": load_longmemeval,
    "meme": load_meme,
    "jsonl": load_jsonl,
    "synthetic": load_synthetic,
    "agentic": load_agentic,
}
COMMON_PARAMS = ("tasks", "offset", "limit", "questions")
_TAKES_PARAMS = {"synthetic", "agentic", "locomo"}
# Common parameters a scheme reads itself, with its own meaning (locomo samples its questions
# stratified by category instead of keeping the first N).
_OWN_PARAMS: dict[str, tuple[str, ...]] = {"locomo": LOCOMO_PARAMS}


def parse_uri(uri: str) -> tuple[str, str, dict[str, str]]:
    """Split ``scheme:rest?k=v&...`` into its parts; a DatasetError when malformed."""
    text = uri.strip()
    scheme, sep, rest = text.partition(":")
    if not sep or not scheme:
        raise DatasetError(
            f"{uri!r}: not a dataset URI (expected <scheme>:<rest>, schemes: {', '.join(LOADERS)})"
        )
    scheme = scheme.lower()
    if scheme not in LOADERS:
        raise DatasetError(
            f"{uri}: unknown dataset scheme {scheme!r} (one of: {', '.join(LOADERS)})"
        )
    rest, _, query = rest.partition("?")
    params: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise dataset_error(
                uri, None, key or part, "query parameter needs a value (key=value)"
            )
        if key in params:
            raise dataset_error(uri, None, key, "query parameter given twice")
        params[key] = value
    return scheme, rest, params


def load_dataset(uri: str) -> Dataset:
    """Load the dataset a URI names (see the module docstring for the schemes).

    Fails with a one-line :class:`~optloop.errors.DatasetError` that names the file,
    the line or record and the field for a malformed source, and the scheme, task or
    parameter for a bad URI.
    """
    scheme, rest, params = parse_uri(uri)
    own = _OWN_PARAMS.get(scheme, ())
    common = {k: params.pop(k) for k in COMMON_PARAMS if k in params and k not in own}
    if params and scheme not in _TAKES_PARAMS:
        name = sorted(params)[0]
        raise dataset_error(
            uri, None, name, f"unknown query parameter (accepted: {', '.join(COMMON_PARAMS)})"
        )
    name, episodes = LOADERS[scheme](rest, params)

    seen: set[str] = set()
    for episode in episodes:
        if episode.id in seen:
            raise DatasetError(f"{uri}: duplicate episode id {episode.id!r}")
        seen.add(episode.id)

    if "tasks" in common:
        wanted = {t.strip() for t in common["tasks"].split(",") if t.strip()}
        known = {q.task_type for e in episodes for q in e.questions}
        if not wanted or not wanted <= known:
            bad = sorted(wanted - known) or [common["tasks"]]
            raise dataset_error(
                uri,
                None,
                "tasks",
                f"no questions of task {bad[0]!r} (tasks here: {', '.join(sorted(known))})",
            )
        episodes = [
            e.model_copy(update={"questions": [q for q in e.questions if q.task_type in wanted]})
            for e in episodes
            if any(q.task_type in wanted for q in e.questions)
        ]
    offset = int_param(uri, common, "offset", 0) or 0
    limit = int_param(uri, common, "limit", 1)
    episodes = episodes[offset:] if limit is None else episodes[offset : offset + limit]
    per_episode = int_param(uri, common, "questions", 1)
    if per_episode is not None:
        episodes = [
            e.model_copy(update={"questions": e.questions[:per_episode]}) for e in episodes
        ]
    if not episodes:
        raise dataset_error(uri, None, "offset", "no episodes left after offset/limit")
    logger.info(
        "dataset %s: %d episodes, %d questions",
        name,
        len(episodes),
        sum(len(e.questions) for e in episodes),
    )
    return Dataset(name=name, uri=uri, episodes=episodes)
