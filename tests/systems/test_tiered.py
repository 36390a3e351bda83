"""The ``tiered`` assistant memory: schema, extraction, supersede, forget, retrieval, the graph.

Unit tests never load a model: the prompt sites run on :class:`SiteLM`, which answers each
call by its site (the extraction stage's ``{key, value, category}`` objects, the summary,
the answer), so the bookkeeping is pinned exactly. The embedder is the bundled MiniLM, as in the
baseline tests. The one integration test at the end runs the embedded SmolLM2-135M over
``builtin:assistant`` (minutes); ``-m "not integration"`` skips it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from optloop.attribution import ErrorType, attribute, default_judges
from optloop.datasets import Dataset, Episode, Question, Session, Turn, load_dataset
from optloop.embed import Embedder, get_embedder
from optloop.errors import ConfigError
from optloop.faults.catalogue import faults_for
from optloop.faults.planted import run_planted
from optloop.faults.planted_report import summarize
from optloop.product.export import Bundle, render
from optloop.tracing.recorder import record_episode
from signatures.tiered import Category, ExtractedFact
from systems import get_system
from systems.tiered import (
    CATEGORIES,
    DB_FILE,
    FORGOTTEN,
    GENERAL,
    TieredSystem,
    category_of,
    conversation,
    forget,
    forget_request,
    parse_facts,
    recent_summaries,
    redact,
    subject_words,
)
from tests.systems._site_lm import SiteLM, echo_memories


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("local")


def session(sid: str, timestamp: str | None, *user_then_assistant: str) -> Session:
    turns = [
        Turn(id=f"{sid}:t{j}", role="user" if j % 2 else "assistant", content=text)
        for j, text in enumerate(user_then_assistant, 1)
    ]
    return Session(id=sid, timestamp=timestamp, turns=turns)


def facts(*pairs: str, category: str = "general") -> list[dict]:
    """Extraction objects from ``"key|value"`` shorthands (the test's notation, not the site's)."""
    return [
        {"key": key, "value": value, "category": category}
        for key, value in (p.split("|", 1) for p in pairs)
    ]


def extractor(table: dict[str, list[str]]):
    """An extraction script: the facts (``key|value`` shorthands) for a message containing one of
    ``table``'s phrases, else none."""

    def reply(fields: dict[str, str]) -> dict:
        message = fields.get("message", "")
        found = next((pairs for phrase, pairs in table.items() if phrase in message), [])
        return {"facts": facts(*found)}

    return reply


def make(
    tmp_path: Path, embedder: Embedder, scripts: dict | None = None, **knobs
) -> tuple[TieredSystem, SiteLM]:
    lm = SiteLM(scripts)
    return TieredSystem(lm, tmp_path / "tiered", embedder=embedder, knobs=knobs or None), lm


LIVE_MOVE = [
    session(
        "s1",
        "2024-11-04",
        "I live in Valdemoro.",
        "Noted.",
        "The code for my storage unit is 5829.",
        "Saved.",
    ),
    session(
        "s2",
        "2024-11-12",
        "Big news, I just moved to Ourense!",
        "Congratulations!",
        "Please forget the code for my storage unit, I don't want it stored anymore.",
        "Done.",
    ),
]
LIVE_MOVE_EXTRACT = extractor(
    {
        "Valdemoro": ["home_city|Valdemoro"],
        "5829": ["storage_unit_code|5829"],
        "Ourense": ["home_city|Ourense"],
    }
)


def live_move_summaries(fields: dict[str, str]) -> dict:
    text = fields["conversation"]
    if "Valdemoro" in text:
        return {
            "summary": "The user lives in Valdemoro. The code for the user's storage unit is 5829."
        }
    return {"summary": "The user moved to Ourense and asked to forget a code."}


# ---------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------


def test_every_tier_lives_in_one_sqlite_file_under_the_run_dir(tmp_path, embedder):
    system, _ = make(tmp_path, embedder)

    assert sorted(p.name for p in system.run_dir.iterdir()) == [DB_FILE]
    db = sqlite3.connect(system.db_path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"meta", "sessions", "stm", "mtm", "ltm", "forgotten", "extractions"} <= tables
    columns = {row[1] for row in db.execute("PRAGMA table_info(ltm)")}
    assert {
        "key",
        "label",
        "value",
        "category",
        "status",
        "superseded_by",
        "session_id",
        "turn_id",
        "grounded",
        "embedding",
    } <= columns
    assert {row[1] for row in db.execute("PRAGMA table_info(mtm)")} >= {
        "summary",
        "created_at",
        "expires_at",
    }
    # One live row per key is a constraint of the file, not a convention of the code.
    db.execute(
        "INSERT INTO ltm(key, label, value, category, status, grounded, embedding) "
        "VALUES ('k', 'k', 'a', 'general', 'live', 1, x'00')"
    )
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO ltm(key, label, value, category, status, grounded, embedding) "
            "VALUES ('k', 'k', 'b', 'general', 'live', 1, x'00')"
        )


def test_registry_sites_knobs_and_value_spaces(tmp_path, embedder):
    system, _ = make(tmp_path, embedder)

    assert get_system("tiered") is TieredSystem
    sites = system.prompt_sites()
    assert set(sites) == {"tiered.extract", "tiered.summarize", "answer"}
    assert sites["tiered.extract"].stage == sites["tiered.summarize"].stage == "ingest"
    assert sites["tiered.extract"].op_kinds == ("extract", "store", "update")
    assert "key, a value and a category" in sites["tiered.extract"].instructions
    assert (
        set(system.knobs())
        == set(TieredSystem.knob_values)
        == {"top_k", "threshold", "mtm_summaries", "stm_turns", "search_recipe"}
    )
    for name, value in system.knobs().items():
        assert value in TieredSystem.knob_values[name]
    assert TieredSystem.search_knob == "search_recipe"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("top_k", -1),
        ("top_k", 2.5),
        ("mtm_summaries", True),
        ("threshold", "high"),
        ("search_recipe", "bm25"),
        ("search_recipe", "category:"),
    ],
)
def test_bad_knob_values_are_refused(tmp_path, embedder, name, value):
    system, _ = make(tmp_path, embedder)
    with pytest.raises(ConfigError, match=name):
        system.set_knob(name, value)
    with pytest.raises(ConfigError, match=name):
        TieredSystem(SiteLM(), tmp_path / "other", embedder=embedder, knobs={name: value})


# ---------------------------------------------------------------------------
# Reading the extraction stage's objects
# ---------------------------------------------------------------------------


def test_the_extraction_site_answers_a_schema_of_key_value_category_objects(tmp_path, embedder):
    system, _ = make(tmp_path, embedder)
    signature = system.prompt_sites()["tiered.extract"].module.signature

    assert signature.output_fields["facts"].annotation == list[ExtractedFact]
    schema = ExtractedFact.model_json_schema()
    assert schema["required"] == ["key", "value", "category"]
    assert schema["properties"]["key"]["maxLength"] and schema["properties"]["value"]["maxLength"]
    # The categories the model may write are the ones the store files facts under.
    assert set(Category.__args__) == {*CATEGORIES, GENERAL}


def test_keys_are_normalized_in_code_and_known_keys_reused():
    parsed = parse_facts(
        [
            ExtractedFact(key="Sister Name", value="Lena", category="family"),
            {"key": "my_home-city", "value": " Porto ", "category": "general"},
            {"key": "FLIGHT_NUMBER", "value": "QZ 4471.", "category": "travel"},
            # the same words as a key already given; a known key, spelt otherwise
            {"key": "city_home", "value": "Porto", "category": "home"},
            {"key": "sisters_name", "value": "Lena", "category": "family"},
        ],
        known_keys=["home_city", "sister_name"],
    )

    assert [(f.key, f.label, f.value) for f in parsed.facts] == [
        ("sister_name", "sister name", "Lena"),
        ("home_city", "home city", "Porto"),
        ("flight_number", "flight number", "QZ 4471"),
    ]
    assert parsed.facts[0].written_keys == ["Sister Name", "sisters_name"]
    assert parsed.facts[1].written_keys == ["my_home-city", "city_home"]
    assert parsed.refused == []


def test_a_category_comes_from_the_key_else_from_the_model():
    parsed = parse_facts(
        facts("sister_name|Lena", category="work")
        + facts("locker|317", category="health")
        + facts("favourite_colour|green", category="nonsense")
    )

    assert [(f.key, f.category) for f in parsed.facts] == [
        ("sister_name", "family"),
        ("locker", "health"),
        ("favourite_colour", "general"),
    ]


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ("sister_name|Lena", "not a {key, value} object"),
        ({"key": "key", "value": "value", "category": "general"}, "placeholder"),
        ({"key": "", "value": "Lena", "category": "family"}, "empty key"),
        ({"key": "sister_name", "value": "unknown", "category": "family"}, "no value"),
        ({"key": "forget", "value": "sister_name", "category": "general"}, "not obeyed"),
        (
            {
                "key": "the user said that her only sister is called",
                "value": "Lena",
                "category": "family",
            },
            "sentence",
        ),
    ],
)
def test_items_that_store_nothing_are_kept_with_the_reason(item, reason):
    parsed = parse_facts([item, {"key": "pet", "value": "Rex", "category": "pets"}])

    assert [f.key for f in parsed.facts] == ["pet"]
    assert len(parsed.refused) == 1
    assert parsed.refused[0].item == item and reason in parsed.refused[0].reason


def test_several_values_for_one_key_in_one_answer_are_a_list_not_an_update():
    parsed = parse_facts(
        facts("birthday|Nayeli 4 March", "birthday|Cosmin 19 July", "birthday|nayeli 4 march")
    )

    assert [(f.key, f.value) for f in parsed.facts] == [
        ("birthday", "Nayeli 4 March, Cosmin 19 July")
    ]
    assert len(parsed.facts[0].written) == 3


def test_extraction_runs_after_every_user_message_with_context_and_known_keys(tmp_path, embedder):
    system, lm = make(tmp_path, embedder, {"tiered.extract": LIVE_MOVE_EXTRACT})

    system.ingest(LIVE_MOVE[:1])
    system.ingest(
        [
            session(
                "s2",
                "2024-11-06",
                "Hello again!",
                "Hi!",
                "Big news, I just moved to Ourense!",
                "Wow.",
            )
        ]
    )

    extract_calls = [fields for site, fields in lm.calls if site == "tiered.extract"]
    assert [c["message"] for c in extract_calls] == [
        "I live in Valdemoro.",
        "The code for my storage unit is 5829.",
        "Hello again!",
        "Big news, I just moved to Ourense!",
    ]
    assert extract_calls[0]["known_keys"] == "(none)"
    assert extract_calls[0]["conversation"] == "(start of conversation)"
    assert extract_calls[1]["conversation"] == "user: I live in Valdemoro.\nassistant: Noted."
    assert extract_calls[3]["known_keys"] == "home_city, storage_unit_code"
    assert (
        extract_calls[3]["conversation"] == "user: Hello again!\nassistant: Hi!"
    )  # STM: this conversation only
    assert lm.sites().count("tiered.summarize") == 2


def test_what_the_model_wrote_what_was_stored_and_what_was_refused_are_recorded(
    tmp_path, embedder
):
    written = [
        {"key": "Favourite Tea", "value": "rooibos", "category": "food"},
        {"key": "", "value": "just some words", "category": "general"},
        {"key": "favourite_colour", "value": "blue", "category": "general"},
    ]
    system, _ = make(tmp_path, embedder, {"tiered.extract": [{"facts": written}]})

    system.ingest(
        [
            session(
                "s1",
                "2024-09-02",
                "Please remember that my favourite herbal tea is rooibos.",
                "Noted.",
            )
        ]
    )

    (row,) = system.store.extractions()
    assert row["status"] == "extracted" and row["turn_id"] == "s1:t1"
    assert row["written"] == written  # what the model wrote, as written
    assert row["stored"] == [
        {
            "key": "favourite_tea",
            "value": "rooibos",
            "category": "food",
            "action": "stored",
            "written_keys": ["Favourite Tea"],
        },
        {
            "key": "favourite_colour",
            "value": "blue",
            "category": "general",
            "action": "stored",
            "written_keys": ["favourite_colour"],
        },
    ]
    assert row["refused"] == [{"item": written[1], "reason": "empty key"}]
    stored = {f.key: f for f in system.store.live_facts()}
    # "blue" was never said
    assert stored["favourite_tea"].grounded and not stored["favourite_colour"].grounded
    item = next(m for m in system.all_memories() if m.id == "ltm:favourite_tea")
    assert item.metadata["written_keys"] == ["Favourite Tea"]
    turn = next(t for t in system.store.stm_turns() if t.turn_id == "s1:t1")
    assert turn.extraction == "extracted: 2 fact(s), 1 item(s) refused"


# ---------------------------------------------------------------------------
# Supersede with history; forget
# ---------------------------------------------------------------------------


def test_a_later_value_supersedes_the_earlier_which_stays_as_history(tmp_path, embedder):
    system, _ = make(tmp_path, embedder, {"tiered.extract": LIVE_MOVE_EXTRACT})

    system.ingest(LIVE_MOVE[:1])
    system.ingest(
        [
            session(
                "s2",
                "2024-11-12",
                "Big news, I just moved to Ourense!",
                "Congratulations!",
                "Yes, I moved to Ourense last week.",
                "Lovely.",
            )
        ]
    )

    (live,) = [f for f in system.store.live_facts() if f.key == "home_city"]
    assert (live.value, live.version, live.session_id, live.turn_id) == (
        "Ourense",
        2,
        "s2",
        "s2:t1",
    )
    history = system.store.history("home_city")
    assert [(h["value"], h["status"]) for h in history] == [
        ("Valdemoro", "superseded"),
        ("Ourense", "live"),
    ]
    assert history[0]["superseded_by"] == history[1]["id"]
    # The same value again changes nothing: no third row.
    assert len(system.store.history("Home City")) == 2
    assert system.store.extractions()[-1]["stored"] == [
        {
            "key": "home_city",
            "value": "Ourense",
            "category": "home",
            "action": "unchanged",
            "written_keys": ["home_city"],
        }
    ]
    item = next(m for m in system.all_memories() if m.id == "ltm:home_city")
    assert item.text == "home city: Ourense" and item.metadata["version"] == 2


def test_forget_removes_the_key_its_history_and_every_copy_of_the_value(tmp_path, embedder):
    system, lm = make(
        tmp_path,
        embedder,
        {"tiered.extract": LIVE_MOVE_EXTRACT, "tiered.summarize": live_move_summaries},
    )

    system.ingest(LIVE_MOVE)

    extracted = [fields["message"] for site, fields in lm.calls if site == "tiered.extract"]
    assert (
        "Please forget the code for my storage unit, I don't want it stored anymore."
        not in extracted
    )
    assert [f.key for f in system.store.live_facts()] == ["home_city"]
    assert system.store.history("storage_unit_code") == []
    (request,) = system.store.forgotten()
    assert json.loads(request["keys"]) == ["storage_unit_code"] and request["turn_id"] == "s2:t3"
    assert request["rows_removed"] == 1 and request["texts_redacted"] == 1
    summary = next(s for s in system.store.summaries() if s.session_id == "s1")
    assert summary.summary == f"The user lives in Valdemoro. {FORGOTTEN}"
    turn = next(t for t in system.store.stm_turns() if t.turn_id == "s2:t3")
    assert turn.extraction == "skipped: forget request (storage_unit_code)"
    # Nothing in the file names the value any more: not a table, not the extraction log, not a free
    # page.
    system.close()
    assert b"5829" not in system.db_path.read_bytes()


@pytest.mark.parametrize(
    ("message", "what"),
    [
        (
            "Please forget the code for my storage unit, I don't want it stored anymore.",
            "the code for my storage unit",
        ),
        ("Could you delete my old address?", "my old address"),
        ("OK, please forget my cousin's name.", "my cousin's name"),
        ("Erase everything about my gym locker", "my gym locker"),
        ("I always forget my umbrella.", None),
        ("My sister told me to delete the photos.", None),
    ],
)
def test_only_a_message_that_starts_as_a_request_is_a_forget_request(message, what):
    assert forget_request(message) == what


def test_forget_matches_the_best_key_only(tmp_path, embedder):
    system, _ = make(
        tmp_path,
        embedder,
        {
            "tiered.extract": [
                {"facts": facts("gym_locker_code|4471", "door_code|9090", "cousin|Leocadia")}
            ]
        },
    )
    system.ingest(
        [
            session(
                "s1",
                "2024-01-01",
                "My gym locker code is 4471, the door code is 9090, and my cousin is Leocadia.",
                "Noted.",
            )
        ]
    )

    assert forget(system.store, "my locker code") == ["gym_locker_code"]
    assert forget(system.store, "my cousin's name") == [
        "cousin"
    ]  # the key's word matches; the value's would too
    assert forget(system.store, "my passport number") == []
    assert [f.key for f in system.store.live_facts()] == ["door_code"]
    assert (
        redact("Door 9090; code 90901.", ["9090"]) == f"Door {FORGOTTEN}; code 90901."
    )  # whole words only


# ---------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------

FAMILY = [
    session(
        "s1",
        "2025-01-10",
        "My sister is Marisol, my brother is Anselmo.",
        "Got it.",
        "I work as a hydrologist.",
        "Noted.",
    ),
    session("s2", "2025-01-18", "My train to Lugo leaves from platform 6.", "Safe travels!"),
    session(
        "s3", "2025-01-19", "What should I cook tonight?", "A stir-fry.", "Sounds good.", "Enjoy!"
    ),
]
FAMILY_SCRIPTS = {
    "tiered.extract": extractor(
        {
            "Marisol": ["sister_name|Marisol", "brother_name|Anselmo"],
            "hydrologist": ["occupation|hydrologist"],
            "Lugo": ["train_platform|6"],
        }
    ),
    "tiered.summarize": lambda fields: {
        "summary": "Summary of " + fields["conversation"].splitlines()[0] + "."
    },
}


def test_retrieval_injects_similar_facts_then_recent_summaries_then_the_conversation(
    tmp_path, embedder
):
    system, _ = make(tmp_path, embedder, FAMILY_SCRIPTS, top_k=1, mtm_summaries=2, stm_turns=2)
    system.ingest(FAMILY)

    items = system.retrieve("What is my brother's name?")

    assert [m.id for m in items] == [
        "ltm:brother_name",
        "mtm:s2",
        "mtm:s3",
        "stm:s3:t3",
        "stm:s3:t4",
    ]
    assert [m.metadata["kind"] for m in items] == ["fact", "summary", "summary", "turn", "turn"]
    assert items[0].text == "brother name: Anselmo" and items[0].score > 0.3
    assert system.retrieve("What is my brother's name?", k=3)[1].id in {
        "ltm:sister_name",
        "ltm:occupation",
    }

    system.set_knob("mtm_summaries", 0)
    system.set_knob("stm_turns", 0)
    system.set_knob("threshold", 0.99)
    assert system.retrieve("What is my brother's name?") == []


def test_stm_is_only_the_current_conversation(tmp_path, embedder):
    system, _ = make(tmp_path, embedder, FAMILY_SCRIPTS, stm_turns=12)
    system.ingest(FAMILY)

    assert {t.session_id for t in system.store.stm_turns()} == {"s3"}
    assert [m.id for m in conversation(system.store, system.knobs())] == [
        "stm:s3:t1",
        "stm:s3:t2",
        "stm:s3:t3",
        "stm:s3:t4",
    ]
    assert (
        TieredSystem(SiteLM(), system.run_dir, embedder=embedder).all_memories()
        == system.all_memories()
    )


def test_search_recipe_routes_or_filters_by_category(tmp_path, embedder):
    system, _ = make(tmp_path, embedder, FAMILY_SCRIPTS, top_k=5, threshold=None)
    system.ingest(FAMILY)
    facts = {f.key: f.category for f in system.store.live_facts()}
    assert facts == {
        "sister_name": "family",
        "brother_name": "family",
        "occupation": "work",
        "train_platform": "travel",
    }
    assert category_of("What is my brother's name?") == "family"

    system.set_knob("search_recipe", "category")
    assert {m.id for m in system.search("What is my brother's name?", 5)} == {
        "ltm:brother_name",
        "ltm:sister_name",
    }
    assert len(system.search("What is the weather like?", 5)) == 4  # routed nowhere: no filter
    # A summary is filed under the categories of the facts its conversation stored.
    summaries = recent_summaries(
        system.store, system.knobs(), "Which platform does my train leave from?"
    )
    assert [m.id for m in summaries] == ["mtm:s2"]

    system.set_knob("search_recipe", "category:archived")  # a category nothing is filed under
    assert system.search("What is my brother's name?", 5) == []
    assert recent_summaries(system.store, system.knobs(), "What is my brother's name?") == []
    assert [m.metadata["kind"] for m in system.retrieve("What is my brother's name?")] == [
        "turn"
    ] * 4


def test_summaries_expire_after_their_time_limit(tmp_path, embedder):
    system, _ = make(tmp_path, embedder, {"tiered.summarize": lambda f: {"summary": "A chat."}})
    system.ingest(
        [
            session("s1", "2024-01-01", "Hi.", "Hello."),
            session("s2", "2024-01-20", "Hi.", "Hello."),
            session("s3", "2024-02-15", "Hi.", "Hello."),
        ]
    )

    assert [s.session_id for s in system.store.summaries()] == [
        "s2",
        "s3",
    ]  # s1 expired on 2024-01-31
    assert system.store.summaries()[0].expires_at == "2024-02-19"


def test_a_run_dir_reopened_by_another_embedder_is_re_embedded(tmp_path, embedder):
    system, _ = make(tmp_path, embedder, FAMILY_SCRIPTS)
    system.ingest(FAMILY[:1])
    system.close()

    class Renamed(type(embedder)):
        @property
        def name(self) -> str:
            return "renamed-minilm"

    reopened = TieredSystem(SiteLM(), system.run_dir, embedder=Renamed())
    assert reopened.search("What is my brother's name?", 1)[0].id == "ltm:brother_name"
    assert sqlite3.connect(reopened.db_path).execute(
        "SELECT value FROM meta WHERE key = 'embedder'"
    ).fetchone() == ("renamed-minilm",)


# ---------------------------------------------------------------------------
# The execution graph
# ---------------------------------------------------------------------------

GRAPH_EPISODE = Episode(
    id="ep",
    sessions=LIVE_MOVE,
    questions=[
        Question(
            id="q1",
            question="Which town do I live in?",
            gold="Ourense",
            evidence_ids=["s2:t1"],
            task_type="update",
            scorer="contains",
            forbidden=["Valdemoro"],
        ),
        Question(
            id="q2",
            question="What is the code for my storage unit?",
            gold="forgotten",
            evidence_ids=["s2:t3"],
            task_type="forget",
            scorer="abstain",
            abstain=True,
            forbidden=["5829"],
        ),
    ],
)


def test_the_graph_records_every_extraction_store_update_and_delete(tmp_path, embedder):
    system, _ = make(
        tmp_path,
        embedder,
        {
            "tiered.extract": LIVE_MOVE_EXTRACT,
            "tiered.summarize": live_move_summaries,
            "answer": [{"answer": "Ourense"}, {"answer": "I don't know"}],
        },
    )

    graph, predictions = record_episode(system, GRAPH_EPISODE)

    assert predictions == {"q1": "Ourense", "q2": "I don't know"}
    ops = [(op.name, op.site, op.session_id) for op in graph.operations if op.category == "ingest"]
    assert ops[:3] == [
        ("extract", "tiered.extract", "s1"),
        ("extract", "tiered.extract", "s1"),
        ("summarize", "tiered.summarize", "s1"),
    ]
    assert ("store", None, "s1") in ops
    # s2: one extraction (the forget request is not extracted), the summary, then the store's
    # changes.
    assert [o for o in ops if o[2] == "s2" and o[1]] == [
        ("extract", "tiered.extract", "s2"),
        ("summarize", "tiered.summarize", "s2"),
    ]
    updates = [op for op in graph.operations if op.name == "update"]
    deletes = [op for op in graph.operations if op.name == "delete"]
    assert any(
        graph.variables[op.outputs[0]].name == "ltm:home_city" for op in updates
    )  # the supersede
    assert any(
        graph.variables[op.outputs[0]].name == "mtm:s1" for op in updates
    )  # the redacted summary
    deleted = {graph.variables[v].name for op in deletes for v in op.outputs}
    assert {
        "ltm:storage_unit_code",
        "stm:s1:t1",
        "stm:s1:t3",
    } <= deleted  # forgotten; the conversation rotated
    home = graph.latest("memory", "ltm:home_city")
    assert home.text == "home city: Ourense" and home.provenance == ["message:s2:t1@0"]
    assert home.data["metadata"]["table"] == "ltm" and home.data["metadata"]["version"] == 2
    # The trace shows what the model wrote (the site's output objects) and what was stored.
    first = next(op for op in graph.operations if op.site == "tiered.extract")
    assert [graph.variables[v].data for v in first.outputs] == [
        {"key": "home_city", "value": "Valdemoro", "category": "general"}
    ]
    assert home.data["metadata"]["written_keys"] == ["home_city"]
    assert home.data["metadata"]["category"] == "home"
    assert graph.meta["sites"]["tiered.extract"]["op_kinds"] == ["extract", "store", "update"]
    assert graph.meta["retrievable_kinds"] == ["fact", "summary"]
    assert not any(
        "5829" in v.text
        for v in graph.by_cls("memory")
        if v.status == "live" and graph.latest("memory", v.name) is v
    )


FACTS_EPISODE = Episode(
    id="facts",
    sessions=[
        session(
            "s1",
            "2024-10-01",
            "Quick facts about me: I was born in Tarragona, I work as a hydrologist, and my cat "
            "is called Pimento.",
            "Noted all three.",
        ),
        session("s2", "2024-10-03", "Any tips for lunch?", "A sandwich in the park."),
    ],
    questions=[
        Question(
            id="q1",
            question="What is my cat called?",
            gold="Pimento",
            evidence_ids=["s1:t1"],
            task_type="multi_fact",
            scorer="contains",
        ),
        Question(
            id="q2",
            question="What is my job?",
            gold="hydrologist",
            evidence_ids=["s1:t1"],
            task_type="multi_fact",
            scorer="contains",
        ),
    ],
)


def test_attribution_blames_the_extraction_stage_for_a_fact_it_dropped(tmp_path, embedder):
    episode = FACTS_EPISODE.model_copy(
        update={"id": "ep", "questions": FACTS_EPISODE.questions[:1]}
    )
    # The extraction stage keeps one fact of three; no summary carries the others.
    system, _ = make(
        tmp_path,
        embedder,
        {
            "tiered.extract": extractor({"Tarragona": ["birthplace|Tarragona"]}),
            "answer": echo_memories,
        },
    )

    graph, predictions = record_episode(system, episode)
    a = attribute(
        graph, episode.questions[0], predictions["q1"], default_judges(embedder), embedder=embedder
    )

    assert "Pimento" not in predictions["q1"]
    assert (a.error_type, a.target) == (ErrorType.EXTRACTION, "tiered.extract")
    assert graph.op(a.op_id).site == "tiered.extract" and graph.op(a.op_id).session_id == "s1"


# ---------------------------------------------------------------------------
# Planted faults on a scripted run (no model)
# ---------------------------------------------------------------------------


def test_the_catalogue_plants_tiered_faults_and_attribution_names_them(tmp_path, embedder):
    names = [f.name for f in faults_for("tiered")]
    assert {
        "tiered-extract-first-only",
        "tiered-extract-keys-only",
        "tiered-category-matches-nothing",
    } <= set(names)
    lm = SiteLM(
        {
            "tiered.extract": extractor(
                {"Tarragona": ["birthplace|Tarragona", "work|hydrologist", "cat_name|Pimento"]}
            ),
            "answer": echo_memories,
        }
    )
    dataset = Dataset(name="facts", uri="test:facts", episodes=[FACTS_EPISODE])

    run = run_planted(
        ["tiered"],
        dataset,
        lm,
        tmp_path / "planted",
        embedder=embedder,
        fault_names=[
            "tiered-extract-first-only",
            "tiered-extract-keys-only",
            "tiered-category-matches-nothing",
        ],
    )

    by_fault = {}
    for case in run.cases:
        by_fault.setdefault(case.fault, []).append(case)
    assert sorted(by_fault) == [
        "tiered-category-matches-nothing",
        "tiered-extract-first-only",
        "tiered-extract-keys-only",
    ]
    assert len(by_fault["tiered-extract-first-only"]) == 2  # birthplace kept, job and cat lost
    assert (
        len(by_fault["tiered-extract-keys-only"]) == 2
        and len(by_fault["tiered-category-matches-nothing"]) == 2
    )
    for case in run.cases:
        assert case.site_ok and case.type_ok, (
            case.fault,
            case.attribution.target,
            case.attribution.error_type,
        )
    assert summarize(run)["site_accuracy"] == 1.0


# ---------------------------------------------------------------------------
# Prompt pack
# ---------------------------------------------------------------------------


def test_a_prompt_pack_round_trips_into_a_tiered_system(tmp_path, embedder):
    instruction = "Write every fact as an object. Be exhaustive."
    bundle = Bundle(
        system="tiered",
        prompts={"tiered.extract": instruction, "answer": "Answer briefly."},
        knobs={"top_k": 3, "search_recipe": "category"},
        source={"run_id": "r1"},
        label="run r1",
    )

    pack = json.loads(render(bundle, "pack"))

    assert pack["format"] == "optloop.prompt-pack/1" and pack["system"] == "tiered"
    written = pack["sites"]["tiered.extract"]["outputs"]["facts"]
    assert written["desc"] == "one object per fact; an empty list when there is none"
    # The product decodes under the same schema as the site: {key, value, category} objects.
    assert written["schema"]["items"]["$ref"].endswith("ExtractedFact")
    assert written["schema"]["$defs"]["ExtractedFact"]["required"] == ["key", "value", "category"]
    assert set(pack["sites"]["tiered.extract"]["inputs"]) == {
        "known_keys",
        "conversation",
        "message",
    }
    system, _ = make(tmp_path, embedder)
    system.apply_pack(pack)
    assert system.prompt_sites()["tiered.extract"].instructions == instruction
    assert system.prompt_sites()["tiered.summarize"].changed is False
    assert system.knobs()["top_k"] == 3 and system.knobs()["search_recipe"] == "category"
    with pytest.raises(ConfigError, match="mem0"):
        system.apply_pack({**pack, "system": "mem0"})
    # A pack whose extraction answers another schema (Key|Value lines) is refused.
    older = json.loads(json.dumps(pack))
    older["sites"]["tiered.extract"]["outputs"]["facts"]["schema"] = {
        "items": {"type": "string"},
        "type": "array",
    }
    with pytest.raises(ConfigError, match="export the pack again"):
        make(tmp_path / "other", embedder)[0].apply_pack(older)


# ---------------------------------------------------------------------------
# The suite bench's view of a store
# ---------------------------------------------------------------------------


def test_the_suite_bench_reports_each_tier_and_the_sessions_whose_extraction_stored_a_fact(
    tmp_path, embedder
):
    from experiments.bench.baselines import memory_report

    system, _ = make(
        tmp_path,
        embedder,
        {"tiered.extract": LIVE_MOVE_EXTRACT, "tiered.summarize": live_move_summaries},
    )
    episode = Episode(
        id="ep",
        sessions=[*LIVE_MOVE, session("s3", "2024-11-20", "Hello!", "Hi!")],
        questions=GRAPH_EPISODE.questions,
    )
    system.ingest(episode.sessions)

    report = memory_report(episode)(system)

    assert report["tiers"]["ltm"] == ["home city: Ourense"]
    assert len(report["tiers"]["mtm"]) == 3
    assert report["tiers"]["stm"] == ["user: Hello!", "assistant: Hi!"]
    assert report["context"]["q1"][0] == "home city: Ourense"
    # s1 stored two facts; s2 superseded one (its forget request skips extraction); s3 stored none.
    assert report["extraction"] == {
        "s1": {"messages": 2, "written": 2, "stored": 2, "refused": 0},
        "s2": {"messages": 2, "written": 1, "stored": 1, "refused": 0},
        "s3": {"messages": 1, "written": 0, "stored": 0, "refused": 0},
    }


# ---------------------------------------------------------------------------
# Integration: the embedded SmolLM2-135M over builtin:assistant (minutes)
# ---------------------------------------------------------------------------


@pytest.mark.integration
def test_tiered_runs_builtin_assistant_on_the_embedded_lm(tmp_path, embedder):
    from optloop.attribution.judges import default_judges as judges_for
    from optloop.lm import LMSettings, OptloopLM
    from optloop.pipeline import Attributor, FreshStores, run_episode

    lm = OptloopLM(
        LMSettings.from_spec(
            "local", cache_path=tmp_path / "lm_cache.sqlite", **TieredSystem.local_decoding
        )
    )
    dataset = load_dataset("builtin:assistant")
    attributor = Attributor(judges_for(embedder), embedder)
    outcomes = []
    stored_facts = 0

    def make_system(episode: Episode) -> TieredSystem:
        return TieredSystem(lm, tmp_path / "runs" / episode.id, embedder=embedder)

    for episode in dataset.episodes:
        result = run_episode(
            episode,
            FreshStores(make_system, lm, dataset_uri=dataset.uri),
            lm=lm,
            attributor=attributor,
        )
        graph = result.graph
        user_turns = sum(1 for s in episode.sessions for t in s.turns if t.role == "user")
        forget_turns = sum(
            1
            for s in episode.sessions
            for t in s.turns
            if t.role == "user" and forget_request(t.content) is not None
        )
        extract_ops = [op for op in graph.operations if op.site == "tiered.extract"]
        summarize_ops = [op for op in graph.operations if op.site == "tiered.summarize"]
        # The mechanism, whatever the 135M model writes: one extraction per user message that is
        # not a forget request, one summary per conversation, every call answered without an LM
        # error.
        assert len(extract_ops) == user_turns - forget_turns
        assert len(summarize_ops) == len(episode.sessions)
        assert all(op.lm_error is None for op in extract_ops + summarize_ops)
        assert any(op.name == "store" for op in graph.operations)
        outcomes += result.outcomes
        assert all(o.attribution is not None for o in result.outcomes if not o.passed)
        # The forgotten value is gone from the store (the file reopened after the episode),
        # whatever the answer.
        reopened = TieredSystem(lm, tmp_path / "runs" / episode.id, embedder=embedder)
        stored = " ".join(m.text for m in reopened.all_memories())
        log = reopened.store.extractions()
        reopened.close()
        # Every extraction answer parsed (decoded under the schema): each row holds objects.
        assert all(isinstance(item, dict) for row in log for item in row["written"])
        stored_facts += sum(fact["action"] != "unchanged" for row in log for fact in row["stored"])
        for question in episode.questions:
            if question.task_type == "forget":
                assert not any(value in stored for value in question.forbidden)
    assert len(outcomes) == 20
    assert stored_facts > 0  # long-term memory fills on the embedded model
    accuracy = sum(o.passed for o in outcomes) / len(outcomes)
    print(
        f"tiered on builtin:assistant, embedded LM: accuracy {accuracy:.2f}, "
        f"{stored_facts} facts stored"
    )


def test_forgetting_an_attribute_redacts_the_sentence_that_gives_its_value():
    """ "Forget my cousin's name": a summary stores the value ("my cousin, Leocadia"), not the word
    "name"."""
    what = subject_words(forget_request("Please forget my cousin's name."))
    assert what == {"cousin"} and subject_words("my name") == {
        "name"
    }  # an attribute alone stays the subject
    text = redact(
        "The user is Marisol, my brother, and my cousin, Leocadia. Birgitta is my manager.",
        [],
        what,
    )
    assert "Leocadia" not in text and text.endswith("Birgitta is my manager.")
