"""OptloopLM as a DSPy 3.4 engine LM: DSPy calls reach optloop's engine, warn about nothing, and
keep optloop's schemas, cache keys, rollouts and errors. Remote calls go to a loopback server
(``optloop/testing/scripted.py``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import dspy
import pytest

from optloop.errors import LMUnreachableError
from optloop.lm import LMSettings, OptloopEngine, OptloopLM, prompt_site
from optloop.testing.loopback import closed_port_url
from optloop.testing.scripted import ScriptedOpenAIServer

REPO = Path(__file__).resolve().parents[3]


def remote(url: str, **overrides) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:test-model", base_url=url, **overrides))


def test_a_dspy_call_goes_through_the_engine_and_warns_about_nothing():
    with ScriptedOpenAIServer([("ok", '{"answer": "Paris"}')]) as server:
        lm = remote(server.base_url)
        assert isinstance(lm, dspy.LM) and isinstance(lm.engine, OptloopEngine)
        assert "forward" not in vars(type(lm)) and "aforward" not in vars(type(lm))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), prompt_site("answer"):
                result = dspy.Predict("question -> answer")(question="Capital of France?")
    assert result.answer == "Paris"
    assert [
        str(w.message)[:80] for w in caught if "dspy" in w.filename or "optloop" in w.filename
    ] == []
    (record,) = lm.accounting.records
    assert record.site == "answer" and record.schema and not record.cached
    assert (
        lm.history and lm.history[-1]["usage"]["prompt_tokens"] == 7
    )  # DSPy's own bookkeeping still works


def test_importing_the_lm_layer_installs_no_warning_filters():
    script = textwrap.dedent("""
        import warnings
        import dspy, pydantic, tenacity  # third-party imports may set their own filters
        before = list(warnings.filters)
        import optloop.lm
        import optloop.lm.accounting, optloop.lm.cache, optloop.lm.dspy_lm, optloop.lm.endpoint
        import optloop.lm.engine, optloop.lm.llama, optloop.lm.machine, optloop.lm.requests, \\
            optloop.lm.settings
        print(warnings.filters == before)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.stdout.strip().splitlines()[-1] == "True", proc.stderr[-2000:]


def test_a_canonical_request_gets_a_canonical_response():
    from dspy.lm15 import Message, Request, Response

    with ScriptedOpenAIServer([("ok", "hello")]) as server:
        lm = remote(server.base_url)
        response = lm(Request(model=lm.model, messages=(Message.user("hi"),), system="be brief"))
    assert isinstance(response, Response) and response.text == "hello"
    assert server.requests[0]["body"]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert lm.accounting.totals().calls == 1


def test_async_calls_run_through_the_async_engine_with_the_task_site():
    with ScriptedOpenAIServer(
        [("respond", lambda body: ("ok", body["messages"][-1]["content"]))]
    ) as server:
        lm = remote(server.base_url)

        async def ask(site: str) -> list[str]:
            with prompt_site(site):
                return await lm.acall(f"from {site}")

        async def both():
            return await asyncio.gather(ask("a"), ask("b"))

        assert asyncio.run(both()) == [["from a"], ["from b"]]
    assert sorted((r.site, r.cached) for r in lm.accounting.records) == [
        ("a", False),
        ("b", False),
    ]


def test_rollouts_reach_the_engine_as_distinct_seeds_and_cache_entries():
    with ScriptedOpenAIServer([("ok", "x")]) as server:
        lm = remote(server.base_url)
        messages = [{"role": "user", "content": "Invent a name."}]
        for rollout in (1, 2, 1):
            lm.copy(rollout_id=rollout, temperature=1.0)(messages=messages)
        lm(
            messages=messages, rollout_id=2, temperature=1.0
        )  # per call, as DSPy's config= passes it
    seeds = [r["body"]["seed"] for r in server.requests]
    assert (
        len(seeds) == 2 and len(set(seeds)) == 2
    )  # rollout 1 again and rollout 2 again: cache hits
    assert [r.cached for r in lm.accounting.records] == [False, False, True, True]


def test_a_call_may_bypass_the_cache_through_dspy():
    with ScriptedOpenAIServer([("ok", "x")]) as server:
        lm = remote(server.base_url)
        lm("q")
        lm("q", cache=False)
    assert len(server.requests) == 2 and [r.cached for r in lm.accounting.records] == [
        False,
        False,
    ]


def test_library_schemas_reach_the_model_unchanged():
    """DSPy would send a pydantic response_format in OpenAI's strict form (every field required);
    a library-layout site must send the library's own schema, as before the engine."""
    from signatures._layout import LibraryLayoutAdapter, output_model
    from signatures.mem0 import Mem0Extract

    with ScriptedOpenAIServer([("ok", '{"memory": []}')]) as server:
        lm = remote(server.base_url)
        with dspy.context(lm=lm, adapter=LibraryLayoutAdapter()):
            dspy.Predict(Mem0Extract)(user_content="I live in Oslo.")
    sent = server.requests[0]["body"]["response_format"]["json_schema"]["schema"]
    assert sent == output_model(Mem0Extract).model_json_schema()
    assert "linked_memory_ids" not in sent["$defs"]["ExtractedMemory"]["required"]


def test_an_unreachable_endpoint_surfaces_as_optloops_error_through_dspy():
    lm = remote(closed_port_url(), max_retries=0)
    with (
        dspy.context(lm=lm, adapter=dspy.JSONAdapter()),
        pytest.raises(LMUnreachableError, match="cannot reach"),
    ):
        dspy.Predict("question -> answer")(question="q")
    assert lm.endpoint_down and lm.accounting.totals().errors == 1


def test_what_optloop_cannot_send_is_refused_not_dropped():
    from dspy.lm15 import Config, FunctionTool, Message, Request, UnsupportedFeatureError

    engine = remote("http://127.0.0.1:9/v1").optloop_engine
    with pytest.raises(UnsupportedFeatureError, match="tools"):
        engine.from_lm15(
            Request(
                model="m",
                messages=(Message.user("x"),),
                tools=(FunctionTool(name="f", parameters={"type": "object"}),),
            )
        )
    with pytest.raises(UnsupportedFeatureError, match="top_p"):
        engine.from_lm15(
            Request(model="m", messages=(Message.user("x"),), config=Config(top_p=0.5))
        )
    ours = engine.from_lm15(
        Request(
            model="m",
            messages=(Message.user("x"),),
            config=Config(
                temperature=0.3,
                max_tokens=9,
                stop=("END",),
                response_format={"type": "json_object"},
            ),
        )
    )
    assert (ours.temperature, ours.max_tokens, ours.stop, ours.json_mode, ours.schema) == (
        0.3,
        9,
        ["END"],
        True,
        None,
    )


def test_copies_share_the_engine_and_a_deep_copy_does_not_duplicate_it():
    import copy

    lm = remote("http://127.0.0.1:9/v1")
    sibling, deep = lm.copy(temperature=1.0), copy.deepcopy(lm)
    assert sibling.optloop_engine is lm.optloop_engine is deep.optloop_engine
    assert sibling.kwargs["temperature"] == 1.0 and lm.kwargs["temperature"] == 0.0
    assert (
        json.loads(json.dumps(lm.dump_state()))["settings"]["base_url"] == "http://127.0.0.1:9/v1"
    )


def test_proposer_rollouts_keep_their_seeds_and_their_site():
    """The SIMBA step (loop.simba) asks the proposer through ``lm.copy(rollout_id=...)`` under the
    proposer site: each rollout samples with its own seed and is charged to the proposer site, not
    served from cache."""
    from optloop.lm import prompt_site
    from optloop.sites import PROPOSER

    with ScriptedOpenAIServer([("ok", '{"answer": "x"}')]) as server:
        lm = remote(server.base_url)
        for rollout in (1, 2):
            with (
                prompt_site(PROPOSER),
                dspy.context(
                    lm=lm.copy(rollout_id=rollout, temperature=1.0), adapter=dspy.JSONAdapter()
                ),
            ):
                dspy.Predict("question -> answer")(question="q")
    seeds = [r["body"]["seed"] for r in server.requests]
    assert len(seeds) == 2 and len(set(seeds)) == 2
    assert {r.site for r in lm.accounting.records} == {PROPOSER} and not any(
        r.cached for r in lm.accounting.records
    )
