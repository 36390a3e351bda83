"""Dollar cost per call from litellm's bundled price table, read offline; tokens only for a model
without a price."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optloop.lm import (
    Accounting,
    CallRecord,
    LMSettings,
    OptloopLM,
    Usage,
    model_price,
    prompt_site,
)
from optloop.lm.pricing import price_file, price_source
from optloop.loop.cost import site_costs, site_metrics
from optloop.testing.scripted import ScriptedOpenAIServer

REPO = Path(__file__).resolve().parents[3]


def bundled_entry(name: str) -> dict:
    path = price_file()
    assert path is not None and path.name == "model_prices_and_context_window_backup.json"
    return json.loads(path.read_text())[name]


def test_prices_come_from_litellms_bundled_table():
    entry = bundled_entry("gpt-4o-mini")
    price = model_price("gpt-4o-mini")
    assert price is not None and price.model == "gpt-4o-mini"
    assert (price.input, price.output) == (
        entry["input_cost_per_token"],
        entry["output_cost_per_token"],
    )
    assert price.input > 0 and price.output > price.input
    assert model_price("openai/gpt-4o-mini") == price  # a provider prefix is dropped
    assert (
        model_price("qwen2.5:7b") is None
        and model_price("") is None
        and model_price("sample_spec") is None
    )
    assert price_source().startswith("litellm ")


def test_reading_prices_never_imports_litellm_or_touches_the_network():
    script = textwrap.dedent("""
        import os, socket, sys
        from optloop.offline import offline_defaults
        os.environ.update(offline_defaults())  # as a command does first
        def no_network(*args, **kwargs):
            raise AssertionError("network access")
        socket.socket.connect = no_network
        socket.create_connection = no_network
        socket.getaddrinfo = no_network
        from optloop.lm import model_price
        price = model_price("gpt-4o-mini")
        print(
            price is not None,
            "litellm" in sys.modules,
            os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"),
        )
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.split() == ["True", "False", "True"], proc.stderr[-2000:]


def test_each_call_carries_its_cost_and_the_totals_add_up_by_site():
    price = model_price("gpt-4o-mini")
    with ScriptedOpenAIServer([("ok", "x")]) as server:  # usage: 7 prompt + 3 completion tokens
        lm = OptloopLM(LMSettings.from_spec("openai:gpt-4o-mini", base_url=server.base_url))
        with prompt_site("mem0.extract"):
            lm.text("one")
            lm.text("one")  # a cache hit spends nothing
        with prompt_site("answer"):
            lm.text("two")
        lm.text("three")  # outside any prompt site
    one_call = 7 * price.input + 3 * price.output
    assert [r.cost_usd for r in lm.accounting.records] == [one_call, 0.0, one_call, one_call]
    assert lm.accounting.totals().cost_usd == pytest.approx(3 * one_call)
    by_site = lm.accounting.by_site()
    assert (
        by_site["mem0.extract"].cost_usd == pytest.approx(one_call)
        and by_site["mem0.extract"].tokens == 10
    )
    dollars = {
        k: v
        for k, v in site_metrics(site_costs(lm.accounting.by_site())).items()
        if k.startswith("cost_usd/")
    }
    assert dollars == pytest.approx(
        {
            "cost_usd/answer": one_call,
            "cost_usd/mem0.extract": one_call,
            "cost_usd/no_site": one_call,
        }
    )
    mark = lm.accounting.mark()
    assert (
        site_metrics(site_costs(lm.accounting.by_site(since=mark))) == {}
    )  # nothing since: nothing to log
    assert json.loads(json.dumps(lm.accounting.totals().as_dict()))["cost_usd"] == pytest.approx(
        3 * one_call
    )


def test_a_model_without_a_price_reports_tokens_only():
    with ScriptedOpenAIServer([("ok", "x")]) as server:
        lm = OptloopLM(LMSettings.from_spec("openai:my-finetune", base_url=server.base_url))
        with prompt_site("answer"):
            lm.text("q")
    (record,) = lm.accounting.records
    assert record.cost_usd is None and (record.prompt_tokens, record.completion_tokens) == (7, 3)
    usage = lm.accounting.totals()
    assert usage.cost_usd is None and usage.tokens == 10 and usage.unpriced_calls == 1
    assert usage.as_dict()["cost_usd"] is None
    assert "cost_usd/answer" not in site_metrics(
        site_costs(lm.accounting.by_site())
    )  # unpriced: no dollar metric


def test_prompt_tokens_the_provider_cached_are_priced_at_the_cache_read_price():
    price = model_price("gpt-4o-mini")
    assert price.cached_input is not None and price.cached_input < price.input
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o-mini",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}
        ],
        "usage": {
            "prompt_tokens": 1000,
            "completion_tokens": 10,
            "total_tokens": 1010,
            "prompt_tokens_details": {"cached_tokens": 800},
        },
    }
    with ScriptedOpenAIServer([("raw", json.dumps(body))]) as server:
        lm = OptloopLM(LMSettings.from_spec("openai:gpt-4o-mini", base_url=server.base_url))
        lm.text("q")
    assert lm.accounting.records[0].cost_usd == pytest.approx(
        200 * price.input + 800 * price.cached_input + 10 * price.output
    )
    # and the record says how much of the prompt the provider's cache held
    assert lm.accounting.records[0].reused_prompt_tokens == 800
    assert site_costs(lm.accounting.by_site())["no_site"].reused_prompt_tokens == 800


def test_the_embedded_model_has_no_price(monkeypatch, tmp_path):

    from optloop.lm import LocalLlamaBackend
    from optloop.lm.llama import ContextPool

    class Instant:
        def create_chat_completion(self, **kwargs):
            return {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "h"},
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }

    model = tmp_path / "gpt-4o-mini.gguf"  # a file name is not a price
    model.write_bytes(b"gguf")
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: ContextPool(Instant, 1))
    lm = OptloopLM(LMSettings.from_spec(f"local:{model}", cache=False))
    lm.text("q")
    assert lm.accounting.records[0].cost_usd is None and lm.accounting.totals().tokens == 6


def test_totals_over_priced_and_unpriced_calls_and_a_collectors_records():
    acc = Accounting()
    acc.add(CallRecord("a", "m", 10, 5, 1.0, cached=False, cost_usd=0.1))
    acc.add(CallRecord("a", "m", 10, 5, 1.0, cached=False, cost_usd=0.2))
    acc.add(CallRecord("b", "other", 10, 5, 1.0, cached=False))  # no price
    usage = acc.totals()
    assert usage.cost_usd == pytest.approx(0.3)
    assert usage.unpriced_calls == 1 and acc.by_site()["b"].cost_usd is None
    assert Usage.of(acc.records[:2]).cost_usd == usage.cost_usd
    assert Usage.of(acc.records[2:]).cost_usd is None


def test_a_sum_of_costs_does_not_depend_on_the_order_of_the_records():
    costs = [0.1, 1e-9, 0.2, 3.3e-7, 0.7, 1e-12] * 50
    forward = Usage.of(CallRecord("s", "m", 1, 1, 0.0, cached=False, cost_usd=c) for c in costs)
    backward = Usage.of(
        CallRecord("s", "m", 1, 1, 0.0, cached=False, cost_usd=c) for c in reversed(costs)
    )
    assert forward.cost_usd == backward.cost_usd  # exactly: fractions, not float additions
