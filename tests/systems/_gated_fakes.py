"""Fakes for the gated tests: an LM scripted per prompt site, a bag-of-words embedder, a small
agentic episode.

No model is loaded. ``ScriptedLM({"gated.admit": fn_or_list, "answer": ...})`` answers each call by
the active prompt site (:func:`optloop.lm.current_site`): the next item of the site's list, or
``fn(fields)`` where ``fields`` are the call's input fields as the JSONAdapter rendered them.
``calls`` lists ``(site, fields)`` in order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import numpy as np

from optloop.datasets import Episode
from optloop.datasets.agentic import AgenticEpisode, AgenticFact, AgenticProbe, to_episode
from optloop.embed import Embedder
from tests.systems._site_lm import Reply, SiteLM

ScriptedLM = (
    SiteLM  # the per-site scripted LM shared with the tiered tests (tests/systems/_site_lm.py)
)


def candidate_ids(fields: dict[str, str]) -> list[str]:
    """The ``[n]`` ids of the candidates a gate call was shown."""
    return re.findall(r"^\[(\d+)\]", fields.get("candidates", ""), re.M)


def gate_all(verdict: str, reason: str = "scripted") -> Callable[[dict[str, str]], Reply]:
    """A gate reply giving ``verdict`` to every candidate it is shown."""
    return lambda fields: {
        "decisions": [
            {"id": i, "verdict": verdict, "reason": reason} for i in candidate_ids(fields)
        ]
    }


def answer_with(pattern: str, fallback: str = "I don't know") -> Callable[[dict[str, str]], Reply]:
    """An answer that copies the first match of ``pattern`` from its memories (a model that reads
    its context)."""

    def reply(fields: dict[str, str]) -> Reply:
        found = re.search(pattern, fields.get("memories", ""))
        return {"answer": found.group(0) if found else fallback}

    return reply


class BowEmbedder(Embedder):
    """Hashed bag of words: deterministic, instant, similar texts share words."""

    dim = 512

    @property
    def name(self) -> str:  # type: ignore[override]
        return "test:bow"

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out + 1e-3


def fact(
    id: str,
    run: str,
    key: str | None,
    value: str | None,
    content: str,
    workspace: str = "billing",
    path: str = "services/api",
    status: str = "active",
    branch: str = "completed",
) -> AgenticFact:
    return AgenticFact(
        id=id,
        run=run,
        key=key,
        value=value,
        content=content,
        workspace=workspace,
        path=path,
        status=status,
        branch=branch,
    )  # type: ignore[arg-type]


def small_record() -> AgenticEpisode:
    """Two workspaces; the API port superseded, a failed run's host, a rolled-back TTL, a failed
    run's true bucket."""
    facts = [
        fact(
            "f1",
            "r1",
            "api.port",
            "21001",
            "The API server listens on port 21001.",
            status="superseded",
        ),
        fact(
            "f2",
            "r1",
            "db.host",
            "db-alpha-11",
            "The API connects to the database host db-alpha-11.",
        ),
        fact(
            "f3",
            "r2",
            "api.port",
            "22002",
            "The API server listens on port 22002.",
            workspace="search",
        ),
        fact(
            "f4",
            "r3",
            "api.port",
            "23003",
            "Set the API server port to 23003 in services/api/config.yaml.",
        ),
        fact(
            "f5",
            "r4",
            "db.host",
            "db-beta-44",
            "Pointed the API's database connection at db-beta-44.",
            branch="failed",
        ),
        fact(
            "f6",
            "r5",
            "logs.bucket",
            "logs-gamma-606",
            "Service logs are shipped to bucket logs-gamma-606.",
            path="infra",
            branch="failed",
        ),
        fact("f7", "r6", "cache.ttl", "301s", "The API cache TTL is 301s."),
        fact(
            "f8", "r7", "cache.ttl", "707s", "Set the API cache TTL to 707s.", branch="rolled_back"
        ),
    ]
    probes = [
        AgenticProbe(
            id="p-super",
            question="Which port does the API server listen on?",
            gold="23003",
            workspace="billing",
            path="services/api",
            category="superseded",
            key="api.port",
            recall=["23003"],
            distractors=["21001"],
        ),
        AgenticProbe(
            id="p-dead",
            question="Which database host does the API connect to?",
            gold="db-alpha-11",
            workspace="billing",
            path="services/api",
            category="dead_branch",
            key="db.host",
            recall=["db-alpha-11"],
            distractors=["db-beta-44"],
        ),
        AgenticProbe(
            id="p-failed",
            question="Which bucket receives the service logs?",
            gold="logs-gamma-606",
            workspace="billing",
            path="infra",
            category="failed_branch_truth",
            key="logs.bucket",
            recall=["logs-gamma-606"],
        ),
        AgenticProbe(
            id="p-ttl",
            question="What is the cache TTL of the API?",
            gold="301s",
            workspace="billing",
            path="services/api",
            category="dead_branch",
            key="cache.ttl",
            recall=["301s"],
            distractors=["707s"],
        ),
    ]
    return AgenticEpisode(id="small", facts=facts, probes=probes)


def small_episode() -> Episode:
    return to_episode(small_record())
