"""Greedy decoding under a JSON-schema grammar, the model's first choice checked first.

llama-cpp-python samples a grammar-constrained token by applying the grammar to every token of
the vocabulary (49,152 for SmolLM2) and then taking the best: on a CPU that costs about as much
as evaluating the token. At temperature 0 the answer is the best token the grammar allows, so
:class:`GreedyGrammar` asks the grammar about the model's own best token first and applies it to
the whole vocabulary only when that token is refused (llama.cpp's ``common_sampler`` does the
same). The token chosen is the same either way: if the unconstrained best token is allowed, it is
the constrained best (ties go to the lowest token id in both). Only the work differs.

:class:`GrammarFirstLlama` also decodes a JSON schema under optloop's grammar, whose whitespace
may hold a newline (:mod:`optloop.lm.grammar`).

Imported by :mod:`optloop.lm.llama` when it loads the model: it imports llama.cpp.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama
from llama_cpp import _internals as internals

from optloop.lm.grammar import with_schema_grammar

TOKEN = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class GreedyGrammar:
    """The sampler ``Llama.generate`` uses for one constrained greedy answer: its ``sample``
    returns the best token the grammar allows and advances the grammar past it."""

    def __init__(self, llama: Llama, grammar: Any):
        self.n_vocab = llama.n_vocab()
        self.grammar = llama_cpp.llama_sampler_init_grammar(
            llama._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not self.grammar:
            raise ValueError("llama.cpp could not parse the grammar of the JSON schema")
        self._one = np.zeros(1, dtype=TOKEN)
        self._all = np.zeros(self.n_vocab, dtype=TOKEN)
        self._all["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self.full_passes = 0  # tokens for which the whole vocabulary was checked

    def __del__(self) -> None:
        if getattr(self, "grammar", None):
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None

    def _apply(self, data: np.ndarray) -> None:
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(data),
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))

    def sample(self, ctx: internals.LlamaContext, idx: int = -1) -> int:
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(ctx.ctx, idx), shape=(self.n_vocab,)
        )
        token = int(np.argmax(logits))
        self._one[0] = (token, logits[token], 0.0)
        self._apply(self._one)
        if not np.isneginf(self._one[0]["logit"]):
            llama_cpp.llama_sampler_accept(self.grammar, token)
            return token
        self.full_passes += 1
        self._all["logit"] = logits
        self._apply(self._all)
        token = int(np.argmax(self._all["logit"]))
        llama_cpp.llama_sampler_accept(self.grammar, token)
        return token


class GrammarFirstLlama(Llama):
    """``Llama`` whose constrained greedy answers use :class:`GreedyGrammar`; every other
    sampling setting goes through llama-cpp-python's own chain."""

    def _init_sampler(self, *args: Any, **kwargs: Any) -> Any:
        plain_greedy = (
            not args
            and kwargs.get("grammar") is not None
            and kwargs.get("temp") == 0.0
            and kwargs.get("logits_processor") is None
            and kwargs.get("repeat_penalty", 1.0) == 1.0
            and kwargs.get("frequency_penalty", 0.0) == 0.0
            and kwargs.get("presence_penalty", 0.0) == 0.0
            and kwargs.get("mirostat_mode", 0) == 0
        )
        if plain_greedy:
            return GreedyGrammar(self, kwargs["grammar"])
        return super()._init_sampler(*args, **kwargs)

    prompt_evaluated = 0
    """Prompt tokens the last completion evaluated: its prompt less the prefix the context
    already held (llama.cpp's prefix match in ``Llama.generate``)."""

    _prompt_pending = False

    def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        self.prompt_evaluated = 0
        self._prompt_pending = True
        yield from super().generate(tokens, *args, **kwargs)

    def eval(self, tokens: Any) -> None:
        # generate's first eval is the prompt's suffix; later ones are the tokens it samples
        if self._prompt_pending:
            self._prompt_pending = False
            self.prompt_evaluated = len(tokens)
        super().eval(tokens)

    def create_chat_completion(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """llama-cpp-python's, with a JSON schema decoded under optloop's grammar
        (:func:`optloop.lm.grammar.with_schema_grammar`), and in ``usage`` the prompt tokens
        reused from the context's cache (``prompt_tokens_details.cached_tokens``, as OpenAI
        and llama.cpp's server report it)."""
        response: Any = super().create_chat_completion(**with_schema_grammar(kwargs))
        usage = response.get("usage") if isinstance(response, dict) else None
        if usage is not None:
            reused = max(int(usage.get("prompt_tokens") or 0) - self.prompt_evaluated, 0)
            usage["prompt_tokens_details"] = {"cached_tokens": reused}
        return response
