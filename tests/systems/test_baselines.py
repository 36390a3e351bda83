"""The baseline memory systems: long context, BM25 RAG, embedding RAG, MD-flat.

Unit tests never call an LLM: the raw-turn systems get a real ``OptloopLM``
that is never asked anything, and MD-flat's curation runs on ``DummyLM`` so
its parsing and bookkeeping are pinned exactly. The integration tests at the
end run each system on the embedded SmolLM2-135M, one question each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import dspy
import numpy as np
import pytest
from dspy.utils import DummyLM

from optloop.datasets import Session, Turn
from optloop.embed import Embedder, WrappedEmbedder, get_embedder
from optloop.errors import ConfigError
from optloop.lm import LMSettings, OptloopLM
from systems import get_system
from systems.base import MemorySystem
from systems.baselines import (
    BM25RagSystem,
    EmbeddingRagSystem,
    LongContextSystem,
    MarkdownFlatSystem,
    estimate_tokens,
)

RAW_SYSTEMS = [LongContextSystem, BM25RagSystem, EmbeddingRagSystem]


class CountingEmbedder(WrappedEmbedder):
    """The real embedder, counting how many texts it was asked to embed."""

    def __init__(self, inner: Embedder):
        super().__init__(inner)
        self.embedded = 0

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        self.embedded += len(texts)
        return super()._embed_batch(texts)


@pytest.fixture(scope="module")
def local_embedder() -> Embedder:
    return get_embedder("local")


@pytest.fixture
def embedder(local_embedder) -> CountingEmbedder:
    return CountingEmbedder(local_embedder)


@pytest.fixture
def lm() -> OptloopLM:
    """A real LM object the unit tests never call (the model loads only on a first call)."""
    return OptloopLM()


def session(sid: str, timestamp: str | None, *contents: str) -> Session:
    turns = [
        Turn(id=f"{sid}:t{j}", role="user" if j % 2 else "assistant", content=text)
        for j, text in enumerate(contents, 1)
    ]
    return Session(id=sid, timestamp=timestamp, turns=turns)


SESSIONS = [
    session(
        "s1",
        "2024-03-01",
        "I adopted a puppy from the shelter last week.",
        "How lovely, what breed is it?",
        "My sister Clara lives in Lisbon and works as an architect.",
    ),
    session(
        "s2",
        "2024-04-12",
        "The quarterly budget review moved to Friday afternoon.",
        "Noted, Friday it is.",
        "I signed up for the Velmora pottery class on Tuesdays.",
    ),
]


def curating_lm(*fact_lists: list[str]) -> DummyLM:
    """A DummyLM that answers successive md_flat.curate calls with these fact lists."""
    return DummyLM([{"facts": facts} for facts in fact_lists], adapter=dspy.JSONAdapter())


# ---------------------------------------------------------------------------
# Retrieval behaviour
# ---------------------------------------------------------------------------


def test_bm25_ranks_the_turn_with_the_query_words_first(lm, tmp_path):
    system = BM25RagSystem(lm, tmp_path, knobs={"top_k": 3})
    system.ingest(SESSIONS)

    hits = system.retrieve("When is the pottery class at Velmora?")

    assert hits[0].id == "s2:t3"
    assert hits[0].score > 0 and all(hit.score <= hits[0].score for hit in hits)
    assert len(hits) <= 3
    assert system.retrieve("zeppelin xylophone") == []  # no shared word: no match, not a weak one


def test_bm25_ranks_a_matching_turn_first_even_in_a_two_turn_store(lm, tmp_path):
    # rank-bm25's Okapi idf is 0 for a term in half the documents and would rank the match last.
    system = BM25RagSystem(lm, tmp_path)
    system.ingest([session("s1", None, "I like green tea.", "The train was late today.")])

    hits = system.retrieve("tea")

    assert [hit.id for hit in hits] == ["s1:t1"]


def test_embedding_rag_ranks_a_paraphrase_first(lm, tmp_path, embedder):
    system = EmbeddingRagSystem(lm, tmp_path, embedder=embedder, knobs={"threshold": None})
    system.ingest(SESSIONS)

    hits = system.retrieve("Did they get a new dog?")

    assert hits[0].id == "s1:t1"  # "adopted a puppy": no content word in common with the question
    assert len(hits) == 5
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)


def test_embedding_rag_drops_turns_below_the_threshold(lm, tmp_path, embedder):
    system = EmbeddingRagSystem(lm, tmp_path, embedder=embedder, knobs={"threshold": None})
    system.ingest(SESSIONS)
    question = "Did they get a new dog?"
    first, second = system.retrieve(question)[:2]

    system.set_knob("threshold", (first.score + second.score) / 2)
    assert [hit.id for hit in system.retrieve(question)] == ["s1:t1"]
    system.set_knob("threshold", 0.999)
    assert system.retrieve(question) == []


def test_long_context_keeps_the_most_recent_turns_that_fit_and_reports_the_rest(lm, tmp_path):
    system = LongContextSystem(lm, tmp_path)
    system.ingest(SESSIONS)
    everything = system.retrieve("anything")
    assert [m.id for m in everything] == [
        f"s{s}:t{t}" for s in (1, 2) for t in (1, 2, 3)
    ]  # chronological
    assert system.truncation()["dropped"] == 0

    # A budget that holds exactly the last two turns.
    last_two = [f"- [2024-04-12] {m.text}\n" for m in everything[-2:]]
    system.set_knob("max_context_tokens", sum(estimate_tokens(line) for line in last_two))
    kept = system.retrieve("anything", k=100)  # k and the question do not matter

    assert [m.id for m in kept] == ["s2:t2", "s2:t3"]
    assert system.truncation() == {
        "kept": 2,
        "dropped": 4,
        "tokens": system.knobs()["max_context_tokens"],
        "budget_tokens": system.knobs()["max_context_tokens"],
    }
    assert all(m.metadata["truncation"]["dropped"] == 4 for m in kept)


def test_long_context_refuses_a_query_site_it_would_never_use(lm, tmp_path):
    with pytest.raises(ConfigError, match="query"):
        LongContextSystem(lm, tmp_path, query_site=True)


@pytest.mark.parametrize("cls", RAW_SYSTEMS)
def test_raw_turn_items_carry_their_provenance(cls, lm, tmp_path, embedder):
    system = cls(lm, tmp_path, embedder=embedder)
    system.ingest(SESSIONS)

    memories = system.all_memories()

    assert [m.id for m in memories] == [turn.id for s in SESSIONS for turn in s.turns]
    for memory, (sess, turn) in zip(
        memories, [(s, t) for s in SESSIONS for t in s.turns], strict=True
    ):
        assert memory.metadata["turn_ids"] == [turn.id]
        assert memory.metadata["session_id"] == sess.id
        assert memory.metadata["timestamp"] == sess.timestamp
        assert turn.content in memory.text


def test_registry_names_the_four_baselines():
    assert get_system("long_context") is LongContextSystem
    assert get_system("rag_bm25") is BM25RagSystem
    assert get_system("rag_embedding") is EmbeddingRagSystem
    assert get_system("md_flat") is MarkdownFlatSystem


# ---------------------------------------------------------------------------
# State: persistence, isolation, reset
# ---------------------------------------------------------------------------


def make(
    cls: type[MemorySystem],
    lm: OptloopLM,
    run_dir: Path,
    embedder: Embedder,
    curations: list[list[str]] | None = None,
) -> MemorySystem:
    if cls is MarkdownFlatSystem:
        return cls(
            curating_lm(
                *(curations or [["Clara lives in Lisbon."], ["The budget review is on Friday."]])
            ),
            run_dir,
            embedder=embedder,
        )
    return cls(lm, run_dir, embedder=embedder)


@pytest.mark.parametrize("cls", [*RAW_SYSTEMS, MarkdownFlatSystem])
def test_a_new_instance_on_the_same_run_dir_sees_the_stored_memories(cls, lm, tmp_path, embedder):
    first = make(cls, lm, tmp_path, embedder)
    first.ingest(SESSIONS)
    embedded_at_ingest = embedder.embedded

    second = make(cls, lm, tmp_path, embedder)

    assert second.all_memories() == first.all_memories()
    assert second.all_memories()
    assert embedder.embedded == embedded_at_ingest  # stored vectors are read back, not recomputed
    assert [m.id for m in second.retrieve("Lisbon", k=2)] == [
        m.id for m in first.retrieve("Lisbon", k=2)
    ]


@pytest.mark.parametrize("cls", [*RAW_SYSTEMS, MarkdownFlatSystem])
def test_ingesting_a_session_again_stores_nothing_new(cls, lm, tmp_path, embedder):
    system = make(cls, lm, tmp_path, embedder)
    system.ingest(SESSIONS)
    before = system.all_memories()

    system.ingest(
        SESSIONS[1:]
    )  # md_flat's DummyLM has no third answer: a curation call would fail

    assert system.all_memories() == before


@pytest.mark.parametrize("cls", [*RAW_SYSTEMS, MarkdownFlatSystem])
def test_instances_with_different_run_dirs_share_nothing(cls, lm, tmp_path, embedder):
    one = make(cls, lm, tmp_path / "one", embedder)
    two = make(cls, lm, tmp_path / "two", embedder)

    one.ingest(SESSIONS)

    assert one.all_memories()
    assert two.all_memories() == []
    assert list((tmp_path / "two").iterdir()) == []


@pytest.mark.parametrize("cls", [*RAW_SYSTEMS, MarkdownFlatSystem])
def test_reset_empties_the_system_and_its_run_dir(cls, lm, tmp_path, embedder):
    system = make(cls, lm, tmp_path, embedder)
    system.ingest(SESSIONS)

    system.reset()

    assert system.all_memories() == []
    assert system.retrieve("Lisbon") == []
    assert list(tmp_path.iterdir()) == []
    assert make(cls, lm, tmp_path, embedder).all_memories() == []


def test_embedding_rag_embeds_turns_whose_vectors_were_lost(lm, tmp_path, embedder):
    EmbeddingRagSystem(lm, tmp_path, embedder=embedder).ingest(SESSIONS)
    (tmp_path / "vectors.npy").unlink()  # e.g. killed between writing turns and vectors

    system = EmbeddingRagSystem(lm, tmp_path, embedder=embedder)

    assert system.retrieve("Did they get a new dog?")[0].id == "s1:t1"
    assert json.loads((tmp_path / "vectors.json").read_text())["count"] == 6


# ---------------------------------------------------------------------------
# MD-flat curation (DummyLM: the bookkeeping, not the model)
# ---------------------------------------------------------------------------


def test_md_flat_writes_one_dated_line_per_curated_fact(tmp_path, embedder):
    system = MarkdownFlatSystem(
        curating_lm(
            [
                "- [2024-03-01] Clara lives in Lisbon.",
                "The user adopted a puppy.",
                "clara lives in lisbon",
                "  ",
            ],
        ),
        tmp_path,
        embedder=embedder,
    )

    system.ingest(SESSIONS[:1])

    # The copied "- [date] " prefix is stripped, the duplicate and the blank fact dropped.
    assert system.memory_path.read_text() == (
        "- [2024-03-01] Clara lives in Lisbon.\n- [2024-03-01] The user adopted a puppy.\n"
    )
    facts = system.all_memories()
    assert [f.metadata["session_id"] for f in facts] == ["s1", "s1"]
    assert facts[0].metadata["turn_ids"] == ["s1:t1", "s1:t2", "s1:t3"]


def test_md_flat_keeps_a_fact_with_line_breaks_on_one_line(tmp_path, embedder):
    system = MarkdownFlatSystem(
        curating_lm(["Clara lives in Lisbon\nand works at the port.", "The user\r\nhas a puppy."]),
        tmp_path,
        embedder=embedder,
    )

    system.ingest(SESSIONS[:1])

    assert system.memory_path.read_text() == (
        "- [2024-03-01] Clara lives in Lisbon and works at the port.\n"
        "- [2024-03-01] The user has a puppy.\n"
    )
    reloaded = MarkdownFlatSystem(curating_lm([]), tmp_path, embedder=embedder)
    assert [f.text for f in reloaded.all_memories()] == [
        "Clara lives in Lisbon and works at the port.",
        "The user has a puppy.",
    ]


def test_md_flat_curation_updates_and_deletes_by_rewriting_the_file(tmp_path, embedder):
    system = MarkdownFlatSystem(
        curating_lm(
            ["Clara lives in Lisbon.", "The user adopted a puppy."],
            # The second curation keeps one fact verbatim, drops the other, adds a new one.
            [
                "- [2024-03-01] Clara lives in Lisbon.",
                "The user takes a pottery class on Tuesdays.",
            ],
        ),
        tmp_path,
        embedder=embedder,
    )

    system.ingest(SESSIONS)

    facts = {f.text: f.metadata for f in system.all_memories()}
    assert list(facts) == ["Clara lives in Lisbon.", "The user takes a pottery class on Tuesdays."]
    assert (
        facts["Clara lives in Lisbon."]["session_id"] == "s1"
    )  # kept facts keep their provenance
    assert facts["Clara lives in Lisbon."]["timestamp"] == "2024-03-01"
    assert facts["The user takes a pottery class on Tuesdays."]["session_id"] == "s2"
    assert facts["The user takes a pottery class on Tuesdays."]["turn_ids"] == [
        "s2:t1",
        "s2:t2",
        "s2:t3",
    ]
    log = [json.loads(line) for line in (tmp_path / "curations.jsonl").read_text().splitlines()]
    assert [entry["session_id"] for entry in log] == ["s1", "s2"]
    assert log[1]["removed"] == ["The user adopted a puppy."]
    assert log[1]["added"] == ["The user takes a pottery class on Tuesdays."]


def test_md_flat_shows_the_curation_the_current_file_and_the_dated_session(tmp_path, embedder):
    dummy = curating_lm(["Clara lives in Lisbon."], ["Clara lives in Lisbon."])
    system = MarkdownFlatSystem(dummy, tmp_path, embedder=embedder)

    system.ingest(SESSIONS)

    second_prompt = "\n".join(m["content"] for m in dummy.history[-1]["messages"])
    assert "- [2024-03-01] Clara lives in Lisbon." in second_prompt
    assert "Session s2 (2024-04-12)" in second_prompt
    assert "user: I signed up for the Velmora pottery class on Tuesdays." in second_prompt
    assert system.prompt_sites()["md_flat.curate"].stage == "ingest"


def test_md_flat_returns_the_whole_file_or_the_top_k_closest_facts(tmp_path, embedder):
    system = MarkdownFlatSystem(
        curating_lm(
            [
                "Clara lives in Lisbon.",
                "The user adopted a puppy.",
                "The budget review is on Friday.",
            ],
        ),
        tmp_path,
        embedder=embedder,
    )
    system.ingest(SESSIONS[:1])

    assert (
        len(system.retrieve("What pet did they get?")) == 3
    )  # top_k 0: the whole file, as MD-flat
    system.set_knob("top_k", 1)
    assert [m.text for m in system.retrieve("What pet did they get?")] == [
        "The user adopted a puppy."
    ]


def test_md_flat_reads_a_hand_edited_file(tmp_path, embedder):
    system = MarkdownFlatSystem(
        curating_lm(["Clara lives in Lisbon."]), tmp_path, embedder=embedder
    )
    system.ingest(SESSIONS[:1])
    with system.memory_path.open("a") as out:
        out.write("# Notes\n- The user prefers tea.\n")

    reloaded = MarkdownFlatSystem(curating_lm(), tmp_path, embedder=embedder)

    facts = reloaded.all_memories()
    assert [f.text for f in facts] == ["Clara lives in Lisbon.", "The user prefers tea."]
    assert facts[0].metadata["session_id"] == "s1"
    assert (
        facts[1].metadata["session_id"] is None
    )  # no provenance is known for a hand-written line


# ---------------------------------------------------------------------------
# Integration: the embedded SmolLM2-135M, one question per system
# ---------------------------------------------------------------------------

QUESTION = "Which city does Clara live in?"
STOPWORDS = {
    "the",
    "and",
    "from",
    "with",
    "that",
    "this",
    "user",
    "they",
    "their",
    "have",
    "last",
    "what",
    "week",
}


@pytest.fixture(scope="module")
def real_lm(tmp_path_factory) -> OptloopLM:
    """One embedded LM for the module; its cache lives in a temp dir so reruns really call the
    model."""
    return OptloopLM(
        LMSettings.from_spec("local", cache_path=tmp_path_factory.mktemp("lm") / "cache.sqlite")
    )


def answer_prompt(lm: OptloopLM) -> str:
    return "\n".join(m["content"] for m in lm.history[-1]["messages"])


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3} - STOPWORDS


@pytest.mark.integration
@pytest.mark.parametrize("cls", RAW_SYSTEMS)
def test_raw_turn_system_answers_from_the_retrieved_turn(cls, real_lm, tmp_path, local_embedder):
    system = cls(real_lm, tmp_path, embedder=local_embedder)
    system.ingest(SESSIONS)
    assert len(system.all_memories()) == 6
    mark = real_lm.accounting.mark()

    memories = system.retrieve(QUESTION)
    answer = system.answer(QUESTION, memories)

    if cls is LongContextSystem:
        assert [m.id for m in memories] == [m.id for m in system.all_memories()]  # everything fits
    else:
        assert memories[0].id == "s1:t3"  # "My sister Clara lives in Lisbon ..."
    assert isinstance(answer, str) and answer.strip()
    assert "Clara lives in Lisbon" in answer_prompt(
        real_lm
    )  # the evidence reached the answer prompt
    calls = real_lm.accounting.by_site(since=mark)
    assert list(calls) == ["answer"] and calls["answer"].calls == 1 and calls["answer"].errors == 0


@pytest.mark.integration
def test_md_flat_curates_a_memory_file_from_the_sessions(real_lm, tmp_path, local_embedder):
    system = MarkdownFlatSystem(real_lm, tmp_path, embedder=local_embedder)
    mark = real_lm.accounting.mark()

    system.ingest(SESSIONS)
    memories = system.retrieve(QUESTION)
    answer = system.answer(QUESTION, memories)

    calls = real_lm.accounting.by_site(since=mark)
    assert calls["md_flat.curate"].calls == 2 and calls["md_flat.curate"].errors == 0
    assert calls["answer"].calls == 1
    # The 135M model curates poorly; what must hold is the mechanism: a file of fact lines,
    # facts drawn from the conversation, each with the provenance of a real session.
    lines = [line for line in system.memory_path.read_text().splitlines() if line.startswith("- ")]
    assert len(lines) >= 1 and len(lines) == len(system.all_memories())
    session_words = words(" ".join(turn.content for s in SESSIONS for turn in s.turns))
    assert any(words(fact.text) & session_words for fact in system.all_memories())
    turns_of = {s.id: [t.id for t in s.turns] for s in SESSIONS}
    for fact in system.all_memories():
        assert fact.metadata["turn_ids"] == turns_of[fact.metadata["session_id"]]
    assert len((tmp_path / "curations.jsonl").read_text().splitlines()) == 2
    assert len(memories) == len(lines)  # the whole file goes into context
    assert isinstance(answer, str) and answer.strip()
