"""The context pool of the embedded backend: which llama.cpp context serves a call."""

from __future__ import annotations

import pytest

from optloop.errors import ConfigError
from optloop.lm.llama import CONTEXTS_ENV, ContextPool, llama_contexts, prefix_of


def messages(system: str, user: str = "q") -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_a_site_keeps_its_context_while_another_site_takes_a_new_one():
    loaded: list[int] = []
    pool = ContextPool(lambda: loaded.append(len(loaded)) or len(loaded), size=3)
    extract = pool.take(prefix_of(messages("extract nodes", "episode 1")))
    dedupe = pool.take(prefix_of(messages("dedupe nodes", "episode 1")))
    again = pool.take(prefix_of(messages("extract nodes", "episode 2")))
    assert again is extract and dedupe is not extract
    assert len(loaded) == 2  # a context is loaded only when a new site needs one


def test_a_full_pool_gives_the_context_used_longest_ago():
    pool = ContextPool(object, size=2)
    a = pool.take(prefix_of(messages("a")))
    b = pool.take(prefix_of(messages("b")))
    pool.take(prefix_of(messages("a")))  # a is now the more recent
    c = pool.take(prefix_of(messages("c")))
    assert c is b and len(pool.contexts) == 2
    assert pool.take(prefix_of(messages("a"))) is a  # a kept its prompt


def test_one_context_serves_every_site():
    pool = ContextPool(object, size=1)
    first = pool.take(prefix_of(messages("a")))
    assert pool.take(prefix_of(messages("b"))) is first


def test_calls_without_a_system_message_share_one_key():
    assert prefix_of([{"role": "user", "content": "x"}]) == prefix_of([])
    assert prefix_of(messages("a")) != prefix_of(messages("b"))
    assert prefix_of(messages("a", "one")) == prefix_of(messages("a", "two"))


def test_the_pool_size_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(CONTEXTS_ENV, "3")
    assert llama_contexts() == 3
    monkeypatch.delenv(CONTEXTS_ENV)
    assert llama_contexts() >= 1
    for bad in ("0", "many"):
        monkeypatch.setenv(CONTEXTS_ENV, bad)
        with pytest.raises(ConfigError, match=CONTEXTS_ENV):
            llama_contexts()
