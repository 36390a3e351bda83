"""The planted-fault catalogue: the preregistered faults load, carry their ground truth, and apply.

No LLM and no embedding model: site faults are applied to a fake module (or to MD-flat on a
scripted ``DummyLM``), store faults to a real BM25 store, knob faults checked against each system's
knobs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dspy
import numpy as np
import pytest
from dspy.utils import DummyLM

from optloop.attribution.taxonomy import ErrorType
from optloop.datasets import Session, Turn
from optloop.embed import Embedder
from optloop.faults.catalogue import CATALOGUE, faults_for
from optloop.faults.corruptions import (
    compress_old,
    first_memory_only,
    shift_numbers,
    strip_specifics,
    truncate_facts,
)
from optloop.faults.model import OperationFault
from optloop.lm import Accounting
from signatures.mem0 import ExtractedMemory

NEW = {f.name: f for f in CATALOGUE if f.added == "preregistered"}


class HashEmbedder(Embedder):
    """Bag-of-words hashed into 64 dimensions: deterministic, no model loaded."""

    @property
    def name(self) -> str:
        return "hash-64"

    @property
    def dim(self) -> int:
        return 64

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
            out[row, 0] += 0.01  # no all-zero vector
        return out


def scripted_lm(*answers: dict) -> DummyLM:
    lm = DummyLM(list(answers), adapter=dspy.JSONAdapter())
    lm.accounting = Accounting()
    return lm


class FakeSystem:
    """Just what ``OperationFault.apply`` touches: sites whose module has a ``forward``, and
    knobs."""

    def __init__(self, sites: dict[str, Any], knobs: dict[str, Any] | None = None):
        self._sites = {
            name: SimpleNamespace(module=SimpleNamespace(forward=fn)) for name, fn in sites.items()
        }
        self._knobs = dict(knobs or {})

    def prompt_sites(self) -> dict[str, Any]:
        return self._sites

    def set_knob(self, name: str, value: Any) -> None:
        if name not in self._knobs:
            raise KeyError(name)
        self._knobs[name] = value


def call_site(
    fault: OperationFault, returns: dict[str, Any], **inputs: Any
) -> tuple[dspy.Prediction, dict[str, Any]]:
    """Apply ``fault`` to a fake site that records its inputs and returns ``returns``; call it with
    ``inputs``."""
    seen: dict[str, Any] = {}

    def forward(**kwargs: Any) -> dspy.Prediction:
        seen.update(kwargs)
        return dspy.Prediction(**returns)

    assert fault.site is not None
    system = FakeSystem({fault.site: forward})
    fault.apply(system)  # type: ignore[arg-type]
    return system.prompt_sites()[fault.site].module.forward(**inputs), seen


# --- the catalogue -------------------------------------------------------------------------------


EVERY_SYSTEM = {
    "mem0",
    "graphiti",
    "long_context",
    "rag_bm25",
    "rag_embedding",
    "md_flat",
    "tiered",
    "gated",
}

EXPECTED = {  # name: (stage, systems, target, type)
    "store-loses-alternate-writes": (
        "store",
        {"mem0", "rag_bm25", "rag_embedding", "long_context"},
        "library:{system}.store",
        ErrorType.EXTRACTION,
    ),
    "store-shifts-numbers": (
        "update",
        {"mem0", "rag_bm25", "rag_embedding", "long_context"},
        "library:{system}.store",
        ErrorType.UPDATE,
    ),
    "mdflat-curate-compresses": ("update", {"md_flat"}, "md_flat.curate", ErrorType.UPDATE),
    "mem0-extract-truncates": ("extraction", {"mem0"}, "mem0.extract", ErrorType.EXTRACTION),
    "mdflat-curate-truncates-new": (
        "extraction",
        {"md_flat"},
        "md_flat.curate",
        ErrorType.EXTRACTION,
    ),
    "threshold-strict": (
        "retrieval",
        {"mem0", "rag_embedding"},
        "knob:threshold",
        ErrorType.RETRIEVAL,
    ),
    "query-drops-specifics": (
        "retrieval",
        {"mem0", "rag_bm25", "rag_embedding"},
        "retrieve.query",
        ErrorType.RETRIEVAL,
    ),
    "graphiti-recipe-nodes-only": (
        "retrieval",
        {"graphiti"},
        "knob:search_recipe",
        ErrorType.RETRIEVAL,
    ),
    "answer-echoes-question": (
        "answer",
        EVERY_SYSTEM,
        "answer",
        ErrorType.RESPONSE,
    ),
    "answer-sees-first-memory": (
        "answer",
        EVERY_SYSTEM,
        "answer",
        ErrorType.RESPONSE,
    ),
}


def test_the_new_faults_carry_their_ground_truth_and_cover_every_stage():
    assert set(NEW) == set(EXPECTED)
    for name, (_, systems, target, error_type) in EXPECTED.items():
        fault = NEW[name]
        assert (set(fault.systems), fault.target, fault.error_type) == (
            systems,
            target,
            error_type,
        ), name
    assert {stage for stage, *_ in EXPECTED.values()} == {
        "store",
        "update",
        "extraction",
        "retrieval",
        "answer",
    }
    names = [f.name for f in CATALOGUE]
    assert len(names) == len(set(names)) and len(CATALOGUE) >= 12 + len(NEW)
    assert all(f.added == "original" for f in CATALOGUE[:12])
    # The target of a store fault names the system it runs on; a fault is listed for each of its
    # systems.
    assert NEW["store-loses-alternate-writes"].target.format(system="mem0") == "library:mem0.store"
    assert "answer-echoes-question" in [f.name for f in faults_for("graphiti")]
    assert [
        f.name for f in faults_for("mem0", ["threshold-strict", "mdflat-curate-compresses"])
    ] == ["threshold-strict"]


def test_knob_faults_set_knobs_their_systems_have_to_values_they_accept():
    from systems import get_system
    from systems.graphiti_system import SEARCH_RECIPES

    for fault in (NEW["threshold-strict"], NEW["graphiti-recipe-nodes-only"]):
        for system in fault.systems:
            assert set(fault.knobs) <= set(get_system(system).default_knobs), (fault.name, system)
    assert NEW["threshold-strict"].knobs == {"threshold": 0.99}
    assert NEW["graphiti-recipe-nodes-only"].knobs["search_recipe"] in SEARCH_RECIPES
    system = FakeSystem({}, {"top_k": 5, "threshold": 0.1})
    NEW["threshold-strict"].apply(system)  # type: ignore[arg-type]
    assert system._knobs == {"top_k": 5, "threshold": 0.99}


# --- the transformations -------------------------------------------------------------------------


def test_pure_transforms():
    assert shift_numbers("3 cats since 2023, at 10:30") == "4 cats since 2024, at 11:31"
    assert shift_numbers("no numbers") == "no numbers"
    assert strip_specifics("When did Alice move to Paris in 2021?") == "When did move to in"
    # every capitalized word after the first goes, the pronoun "I" with the names (as written,
    # before any run)
    assert strip_specifics("What did I do on Monday in March?") == "What did do on in"
    assert first_memory_only({"memories": "- a\n- b", "question": "q"}) == {
        "memories": "- a",
        "question": "q",
    }
    assert first_memory_only({"memories": "", "question": "q"})["memories"] == "(no memories)"
    assert truncate_facts(["User's dog is named Biscuit", "short"], {}) == [
        "User's dog is named",
        "short",
    ]


def test_mem0_extract_truncates_every_extracted_memory_and_keeps_its_type():
    memories = [
        ExtractedMemory(id="0", text="User's dog is named Biscuit", attributed_to="user"),
        ExtractedMemory(id="1", text="User lives in Denver since 2019", attributed_to="user"),
    ]
    prediction, _ = call_site(
        NEW["mem0-extract-truncates"], {"memory": memories}, user_content="..."
    )
    assert [m.text for m in prediction.memory] == ["User's dog is named", "User lives in Denver"]
    assert all(
        isinstance(m, ExtractedMemory) and m.attributed_to == "user" for m in prediction.memory
    )


def test_query_drops_specifics_replaces_the_rewrite_with_the_question_less_its_names_and_numbers():
    prediction, seen = call_site(
        NEW["query-drops-specifics"],
        {"query": "Alice Paris 2021"},
        question="When did Alice move to Paris in 2021?",
    )
    assert prediction.query == "When did move to in"
    assert seen == {
        "question": "When did Alice move to Paris in 2021?"
    }  # the site's own call was made
    assert NEW["query-drops-specifics"].query_site


def test_answer_faults_echo_the_question_and_cut_the_context_to_its_first_memory():
    prediction, seen = call_site(
        NEW["answer-echoes-question"],
        {"answer": "Biscuit"},
        memories="- User's dog is named Biscuit.",
        question="What is my dog's name?",
    )
    assert prediction.answer == "What is my dog's name?"
    assert seen["memories"] == "- User's dog is named Biscuit."
    prediction, seen = call_site(
        NEW["answer-sees-first-memory"],
        {"answer": "Denver"},
        memories="- User lives in Denver.\n- User's dog is named Biscuit.",
        question="What is my dog's name?",
    )
    assert seen == {"memories": "- User lives in Denver.", "question": "What is my dog's name?"}
    assert prediction.answer == "Denver"  # the model's answer, from what it was shown


def test_md_flat_faults_compress_old_facts_and_truncate_new_ones():
    file = "\n".join(
        f"- [2024-03-0{i}] {fact}"
        for i, fact in enumerate(
            [
                "User's dog is named Biscuit.",
                "User lives in Denver near the park.",
                "User works as a nurse.",
            ],
            1,
        )
    )
    facts = [
        "User's dog is named Biscuit.",
        "User lives in Denver near the park.",
        "User works as a nurse.",
        "User moved to Austin in May.",
    ]
    assert compress_old(facts, {"memory_file": file}) == [
        "User's dog is named Biscuit.; User lives in Denver near the park.;",
        "User moved to Austin in May.",
    ]
    assert compress_old(facts[3:], {"memory_file": file}) == ["User moved to Austin in May."]
    prediction, _ = call_site(
        NEW["mdflat-curate-truncates-new"], {"facts": facts}, memory_file=file, session="s"
    )
    assert prediction.facts == [*facts[:3], "User moved to Austin"]


def test_md_flat_curation_fault_applies_to_the_real_system(tmp_path):
    from systems.baselines import MarkdownFlatSystem

    lm = scripted_lm(
        {"facts": ["User's dog is named Biscuit.", "User lives in Denver.", "User is a nurse."]},
        {
            "facts": [
                "User's dog is named Biscuit.",
                "User lives in Denver.",
                "User is a nurse.",
                "User moved to Austin in May 2024.",
            ]
        },
    )
    system = MarkdownFlatSystem(lm, tmp_path / "md", embedder=HashEmbedder())
    NEW["mdflat-curate-compresses"].apply(system)
    system.ingest(
        [
            Session(id="s1", turns=[Turn(id="s1:t1", role="user", content="...")]),
            Session(id="s2", turns=[Turn(id="s2:t1", role="user", content="...")]),
        ]
    )
    assert [m.text for m in system.all_memories()] == [
        "User's dog is named Biscuit.; User lives in Denver.; User is a",
        "User moved to Austin in May 2024.",
    ]


# --- store faults on a real store ----------------------------------------------------------------


def _bm25(tmp_path: Path):
    from systems.baselines import BM25RagSystem

    return BM25RagSystem(scripted_lm(), tmp_path / "bm25", embedder=HashEmbedder())


SESSIONS = [
    Session(
        id="s1",
        turns=[
            Turn(id=f"s1:t{i}", role="user", content=c)
            for i, c in enumerate(
                ["I have 3 cats.", "I live in Denver.", "I was born in 1990."], 1
            )
        ],
    ),
    Session(
        id="s2",
        turns=[
            Turn(id=f"s2:t{i}", role="user", content=c)
            for i, c in enumerate(["I moved to Austin.", "I now have 4 cats."], 1)
        ],
    ),
]


def test_store_loses_every_other_write_of_each_session_from_the_first(tmp_path):
    system = _bm25(tmp_path)
    NEW["store-loses-alternate-writes"].apply(system)
    system.ingest(SESSIONS[:1])
    assert [m.id for m in system.all_memories()] == ["s1:t1", "s1:t3"]
    system.ingest(SESSIONS[1:])
    assert [m.id for m in system.all_memories()] == ["s1:t1", "s1:t3", "s2:t1"]
    assert [m.text for m in system.retrieve("cats")][:1] == [
        "user: I have 3 cats."
    ]  # the index was rebuilt


def test_store_shifts_the_numbers_of_earlier_sessions_only(tmp_path):
    system = _bm25(tmp_path)
    NEW["store-shifts-numbers"].apply(system)
    system.ingest(SESSIONS[:1])
    assert [m.text for m in system.all_memories()] == [
        "user: I have 3 cats.",
        "user: I live in Denver.",
        "user: I was born in 1990.",
    ]
    system.ingest(SESSIONS[1:])
    assert [m.text for m in system.all_memories()] == [
        "user: I have 4 cats.",
        "user: I live in Denver.",
        "user: I was born in 1991.",
        "user: I moved to Austin.",
        "user: I now have 4 cats.",
    ]


def test_the_original_store_faults_still_spare_the_first_session(tmp_path):
    system = _bm25(tmp_path)
    next(f for f in CATALOGUE if f.name == "store-deletes-old").apply(system)
    system.ingest(SESSIONS[:1])
    assert len(system.all_memories()) == 3
    system.ingest(SESSIONS[1:])
    assert [m.id for m in system.all_memories()] == ["s2:t1", "s2:t2"]


@pytest.mark.parametrize("name", sorted(NEW))
def test_every_new_fault_is_listed_for_a_real_system_and_describes_itself(name):
    from systems import SYSTEMS

    fault = NEW[name]
    assert fault.description and set(fault.systems) <= set(SYSTEMS)
    assert (fault.site is None) == (fault.after_session is not None or bool(fault.knobs))
