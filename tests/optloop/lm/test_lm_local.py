"""Integration tests on the real embedded model (SmolLM2-135M-Instruct, llama.cpp in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Literal

import dspy
import pytest
from pydantic import BaseModel

from optloop.lm import LMSettings, OptloopLM, configure_dspy, prompt_site

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


class Person(BaseModel):
    name: str
    age: int
    city: str


class Fact(BaseModel):
    subject: str
    relation: str
    value: str


class Event(BaseModel):
    title: str
    date: str
    attendees: list[str]


class Sentiment(dspy.Signature):
    """Classify the sentiment of the text."""

    text: str = dspy.InputField()
    label: Literal["positive", "negative", "neutral"] = dspy.OutputField()


class Keywords(dspy.Signature):
    """List the keywords of the text."""

    text: str = dspy.InputField()
    keywords: list[str] = dspy.OutputField()


class ExtractPerson(dspy.Signature):
    """Extract the person described in the text."""

    text: str = dspy.InputField()
    person: Person = dspy.OutputField()


class ExtractFacts(dspy.Signature):
    """Extract every fact stated in the text as subject, relation, value."""

    text: str = dspy.InputField()
    facts: list[Fact] = dspy.OutputField()


class YesNo(dspy.Signature):
    """Answer the question with true or false."""

    question: str = dspy.InputField()
    answer: bool = dspy.OutputField()


class CountItems(dspy.Signature):
    """Count the items mentioned in the text."""

    text: str = dspy.InputField()
    count: int = dspy.OutputField()


class Triage(dspy.Signature):
    """Summarize the ticket, tag it and set its priority."""

    ticket: str = dspy.InputField()
    title: str = dspy.OutputField()
    tags: list[str] = dspy.OutputField()
    priority: Literal["low", "medium", "high"] = dspy.OutputField()
    confidence: float = dspy.OutputField()


class ExtractEvent(dspy.Signature):
    """Extract the event from the message."""

    message: str = dspy.InputField()
    event: Event = dspy.OutputField()
    nickname: str | None = dspy.OutputField(desc="the organizer's nickname, if any")


CASES = [
    (Sentiment, {"text": "I love this new phone, it is fantastic."}, {"label": str}),
    (Sentiment, {"text": "The delivery was late and the box was broken."}, {"label": str}),
    (Sentiment, {"text": "The meeting is at 3pm."}, {"label": str}),
    (
        Keywords,
        {"text": "Alice adopted a golden retriever named Max in Denver."},
        {"keywords": list},
    ),
    (
        Keywords,
        {"text": "Quarterly revenue grew 12 percent thanks to cloud sales."},
        {"keywords": list},
    ),
    (ExtractPerson, {"text": "Maria is 34 years old and lives in Porto."}, {"person": Person}),
    (ExtractPerson, {"text": "Kenji, aged 51, moved to Osaka last spring."}, {"person": Person}),
    (
        ExtractPerson,
        {"text": "My neighbour Tom turned 8 yesterday; we live in Leeds."},
        {"person": Person},
    ),
    (
        ExtractFacts,
        {"text": "I work at Acme as a chemist. My wife Ana teaches piano."},
        {"facts": list},
    ),
    (
        ExtractFacts,
        {"text": "My favourite color is green and I was born in 1990."},
        {"facts": list},
    ),
    (
        ExtractFacts,
        {"text": "Bob's car is a red Volvo. Bob's dog is called Rex."},
        {"facts": list},
    ),
    (YesNo, {"question": "Is Paris the capital of France?"}, {"answer": bool}),
    (YesNo, {"question": "Is the sun cold?"}, {"answer": bool}),
    (CountItems, {"text": "I bought apples, pears and plums."}, {"count": int}),
    (CountItems, {"text": "Two cats, one dog."}, {"count": int}),
    (
        Triage,
        {"ticket": "Login page crashes on Safari since the last release."},
        {"title": str, "tags": list, "priority": str, "confidence": float},
    ),
    (
        Triage,
        {"ticket": "Please change the footer color to blue."},
        {"title": str, "tags": list, "priority": str, "confidence": float},
    ),
    (
        ExtractEvent,
        {"message": "Team lunch on 2024-05-02 with Sam and Priya, organized by Robert (Bobby)."},
        {"event": Event},
    ),
    (
        ExtractEvent,
        {"message": "Board meeting Friday 10 March; attendees: Lee, Ortiz."},
        {"event": Event},
    ),
    (
        ExtractEvent,
        {"message": "Birthday party for Zoe on June 3rd, everyone from class 4B invited."},
        {"event": Event},
    ),
    (Keywords, {"text": "The hiking trail near Lake Tahoe closes in winter."}, {"keywords": list}),
    (CountItems, {"text": "She speaks English, French, German and Italian."}, {"count": int}),
]


@pytest.fixture(scope="module")
def local_lm(tmp_path_factory) -> OptloopLM:
    cache = tmp_path_factory.mktemp("lm") / "cache.sqlite"
    return OptloopLM(LMSettings.from_spec("local", cache_path=cache, max_tokens=256))


def test_varied_schema_constrained_calls_never_fail_to_parse(local_lm):
    assert len(CASES) >= 20
    configure_dspy(local_lm)
    mark = local_lm.accounting.mark()
    failures = []
    for signature, inputs, expected in CASES:
        with prompt_site(signature.__name__):
            try:
                prediction = dspy.Predict(signature)(**inputs)
            except Exception as exc:  # noqa: BLE001 - counted, then asserted zero below
                failures.append(f"{signature.__name__}{inputs}: {type(exc).__name__}: {exc}")
                continue
        for name, kind in expected.items():
            value = getattr(prediction, name)
            if not isinstance(value, kind):
                failures.append(f"{signature.__name__}.{name} = {value!r} is not {kind.__name__}")
        if signature is Sentiment:
            assert prediction.label in {"positive", "negative", "neutral"}
        if signature is Triage:
            assert prediction.priority in {"low", "medium", "high"}
    assert failures == []
    usage = local_lm.accounting.totals(since=mark)
    records = local_lm.accounting.records[mark:]
    assert usage.calls == len(CASES) and usage.errors == 0 and usage.retries == 0
    assert all(rec.schema for rec in records), "every DSPy call must carry its output schema"
    assert set(local_lm.accounting.by_site(since=mark)) == {sig.__name__ for sig, _, _ in CASES}
    assert usage.completion_tokens > 0 and usage.prompt_tokens > 0


def test_library_style_response_formats_are_constrained_too(local_lm):
    schema = {
        "type": "object",
        "properties": {
            "memory": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["id", "text"],
                },
            }
        },
        "required": ["memory"],
    }
    messages = [
        {"role": "system", "content": "Extract memories as JSON."},
        {"role": "user", "content": "I am vegetarian and I live in Oslo."},
    ]
    out = local_lm.json(messages, schema)
    assert isinstance(out["memory"], list) and all({"id", "text"} <= set(m) for m in out["memory"])
    plain_json = local_lm.text(messages, response_format={"type": "json_object"})
    assert isinstance(json.loads(plain_json), (dict, list))


def test_free_text_call(local_lm):
    answer = local_lm.text("Name one fruit.", max_tokens=24)
    assert isinstance(answer, str) and answer.strip()
    outputs = local_lm("Say hello in one word.", max_tokens=8)  # DSPy's plain-call convenience
    assert isinstance(outputs, list) and isinstance(outputs[0], str)


def test_repeated_call_is_served_from_cache_without_the_model(local_lm):
    messages = [{"role": "user", "content": "Give one color."}]
    first = local_lm.text(messages, max_tokens=8)
    before = local_lm.accounting.totals()
    second = local_lm.text(messages, max_tokens=8)
    after = local_lm.accounting.totals()
    assert second == first
    assert after.model_calls == before.model_calls and after.cache_hits == before.cache_hits + 1
    assert local_lm.accounting.records[-1].cached


def test_cache_survives_a_process_restart(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        from optloop.lm import LMSettings, OptloopLM
        lm = OptloopLM(LMSettings.from_spec("local", cache_path=sys.argv[1]))
        text = lm.text("Name a planet.", max_tokens=12)
        print(json.dumps({"text": text, "cached": lm.accounting.records[-1].cached,
                          "model_loaded": lm.backend.loaded,
                          "model_calls": lm.accounting.totals().model_calls}))
        """
    )
    cache = str(tmp_path / "cache.sqlite")

    def run() -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", script, cache],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
            check=True,
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["cached"] is False and first["model_loaded"] is True and first["model_calls"] == 1
    assert second == {**first, "cached": True, "model_loaded": False, "model_calls": 0}


def test_rollout_ids_give_distinct_cache_entries(local_lm):
    messages = [{"role": "user", "content": "Invent a name for a cat."}]
    local_lm.text(messages, temperature=1.0, rollout_id=1, max_tokens=8)
    local_lm.text(messages, temperature=1.0, rollout_id=2, max_tokens=8)
    assert [r.cached for r in local_lm.accounting.records[-2:]] == [False, False]
    local_lm.text(messages, temperature=1.0, rollout_id=1, max_tokens=8)
    assert local_lm.accounting.records[-1].cached


def test_a_call_records_the_prompt_tokens_its_context_already_held(local_lm):
    system = "You keep notes about the user. " * 40
    first, second = (
        [{"role": "system", "content": system}, {"role": "user", "content": text}]
        for text in ("I moved to Bergen in May.", "My sister plays the cello.")
    )
    mark = local_lm.accounting.mark()
    with prompt_site("notes"):
        local_lm.text(first, max_tokens=8)
        local_lm.text(second, max_tokens=8)
    one, two = local_lm.accounting.records[mark:]
    assert not one.cached and not two.cached
    # the second call's context held the shared system message: only its own tail was computed
    assert two.reused_prompt_tokens >= 200
    assert two.reused_prompt_tokens < two.prompt_tokens
    assert one.reused_prompt_tokens < two.reused_prompt_tokens
    usage = local_lm.accounting.totals(since=mark)
    assert usage.reused_prompt_tokens == one.reused_prompt_tokens + two.reused_prompt_tokens
