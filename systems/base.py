"""The memory-system protocol and the prompt-site type every system is built from.

A :class:`MemorySystem` is MemFail's store / retrieve / get_all API plus the
answer step: ``ingest`` sessions, ``retrieve`` memories for a question,
``answer`` from them. Its LLM calls all go through :class:`PromptSite` s, one
DSPy module per prompt the system sends, so an optimizer sees a system as a
DSPy program: ``prompt_sites()`` are its predictors, ``knobs()`` its non-LLM
parameters (top_k, thresholds, search recipe).

What the rest of optloop may ask of a system, and nothing else:

- ``ingest``, ``retrieve``, ``answer``, ``all_memories``, ``reset``, ``close``;
- ``search(query, k)``: the library's own retrieval, no LLM (the recorder's wider search);
- ``prompt_sites()`` and ``use_modules(...)``: the prompts, and a candidate's modules put in;
- ``knobs()`` / ``set_knob(...)``, ``knob_choices(name)`` (the values an optimizer may try:
  ``knob_values``) and ``search_knob`` (the knob that decides what a search returns: the one
  attribution blames when the evidence was never found);
- ``truncation()``: what the last retrieval left out to fit a context budget.

Each system keeps all of its state under its own ``run_dir`` and ``reset()``
empties it, so two systems can live in one process without sharing anything.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import dspy
from pydantic import BaseModel, Field

from optloop.lm import OptloopLM, prompt_site
from optloop.sites import ANSWER, QUERY_REWRITE
from signatures._layout import LibraryLayoutAdapter
from signatures.common import AnswerFromMemories, RewriteQuery, render_memories

if TYPE_CHECKING:
    from optloop.datasets import Session
    from optloop.embed import Embedder

Stage = Literal["ingest", "retrieve", "answer"]


@dataclass
class PromptSite:
    """One prompt a system sends, as a DSPy module an optimizer can rewrite.

    ``layout="library"`` sites render with :class:`LibraryLayoutAdapter` (system
    = the library's prompt, user = the library's own user content), so the
    messages are what the vanilla library sends. ``layout="dspy"`` sites are
    optloop's own (answer, query rewrite) and use DSPy's JSONAdapter.

    ``max_tokens``: the most tokens the library lets this prompt's answer take (mem0 asks with
    its LLM config's ``max_tokens``); None: the LM's ``max_tokens``.
    """

    name: str
    stage: Stage
    module: dspy.Predict
    seed_instruction: str
    op_kinds: tuple[str, ...] = ()
    layout: Literal["library", "dspy"] = "library"
    max_tokens: int | None = None
    _adapter: Any = field(default=None, repr=False)

    @classmethod
    def from_signature(
        cls,
        name: str,
        stage: Stage,
        signature: type[dspy.Signature],
        *,
        op_kinds: tuple[str, ...] = (),
        layout: Literal["library", "dspy"] = "library",
        max_tokens: int | None = None,
    ) -> PromptSite:
        return cls(
            name=name,
            stage=stage,
            module=dspy.Predict(signature),
            seed_instruction=signature.instructions,
            max_tokens=max_tokens,
            op_kinds=op_kinds,
            layout=layout,
        )

    @property
    def instructions(self) -> str:
        return self.module.signature.instructions

    def set_instructions(self, text: str) -> None:
        self.module.signature = self.module.signature.with_instructions(text)

    @property
    def changed(self) -> bool:
        return self.instructions != self.seed_instruction or bool(self.module.demos)

    def adapter(self) -> dspy.Adapter:
        if self._adapter is None:
            self._adapter = (
                LibraryLayoutAdapter() if self.layout == "library" else dspy.JSONAdapter()
            )
        return self._adapter

    def call_config(self) -> dict[str, Any]:
        """What a call of this site adds to the LM's settings: DSPy's ``config`` keyword, or
        nothing."""
        return {} if self.max_tokens is None else {"config": {"max_tokens": self.max_tokens}}

    def __call__(self, lm: OptloopLM, **inputs: Any) -> dspy.Prediction:
        """Run the site on ``lm``, charging the call to this site's name."""
        with prompt_site(self.name), dspy.context(lm=lm, adapter=self.adapter()):
            return self.module(**inputs, **self.call_config())


class MemoryItem(BaseModel):
    """One memory unit as a system stores or returns it."""

    id: str
    text: str
    score: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class MemorySystem(ABC):
    """Base class of every memory system; subclasses wrap the real library.

    Subclasses set ``name``, add their own sites in ``_build_sites`` and
    implement ``reset``, ``ingest``, ``search`` and ``all_memories``. The
    shared ``answer`` site and the optional ``retrieve.query`` site live here.
    """

    name: ClassVar[str]
    default_knobs: ClassVar[dict[str, Any]] = {"top_k": 5}
    # The values an optimizer may try per knob (the current value is always tried too).
    knob_values: ClassVar[Mapping[str, Sequence[Any]]] = {"top_k": (1, 3, 5, 10, 20)}
    # The knob that decides what a search returns (None: no knob does).
    search_knob: ClassVar[str | None] = "top_k"
    # LMSettings this system's runs use unless the user sets them (``--lm-max-items``,
    # ``--lm-max-chars``, ``--lm-n-ctx``): decoding bounds and the context window of a local model.
    local_decoding: ClassVar[dict[str, int]] = {}

    def __init__(
        self,
        lm: OptloopLM,
        run_dir: Path,
        *,
        embedder: Embedder | None = None,
        knobs: dict[str, Any] | None = None,
        query_site: bool = False,
    ):
        self.lm = lm
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if embedder is None:
            from optloop.embed import get_embedder

            embedder = get_embedder()
        self.embedder = embedder
        unknown = set(knobs or {}) - set(self.default_knobs)
        if unknown:
            from optloop.errors import ConfigError

            raise ConfigError(
                f"{self.name} has no knob(s) {sorted(unknown)}; its knobs are "
                f"{sorted(self.default_knobs)}"
            )
        self._knobs = {**self.default_knobs, **(knobs or {})}
        self._sites: dict[str, PromptSite] = {}
        self._build_sites()
        self._sites[ANSWER] = PromptSite.from_signature(
            ANSWER, "answer", AnswerFromMemories, op_kinds=("answer",), layout="dspy"
        )
        if query_site:
            self._sites[QUERY_REWRITE] = PromptSite.from_signature(
                QUERY_REWRITE, "retrieve", RewriteQuery, op_kinds=("rewrite",), layout="dspy"
            )

    # --- what subclasses provide ---------------------------------------------------------

    def _build_sites(self) -> None:
        """Add the system's own prompt sites to ``self._sites``."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything stored (the run directory is emptied)."""

    @abstractmethod
    def ingest(self, sessions: Sequence[Session]) -> None:
        """Store the sessions, in order, as the library would."""

    @abstractmethod
    def search(self, query: str, k: int) -> list[MemoryItem]:
        """The library's own retrieval for ``query``, at most ``k`` units, no LLM call."""

    @abstractmethod
    def all_memories(self) -> list[MemoryItem]:
        """Everything currently stored."""

    def close(self) -> None:
        """Release what the system holds open (an event loop, a database); it is not used
        afterwards."""

    def truncation(self) -> dict[str, int] | None:
        """The last ``retrieve``'s report on fitting a context budget (``kept``, ``dropped``,
        ``tokens``, ...); ``None`` for a system that never cuts what it retrieves."""
        return None

    def retrievable_kinds(self) -> set[str] | None:
        """The ``metadata["kind"]`` values retrieval can return (None: every unit is
        searchable)."""
        return None

    def delete_memory(self, memory_id: str) -> None:
        """Remove one stored unit (MemFail's ``delete``); not every system can."""
        raise NotImplementedError(f"{self.name} cannot delete a single memory")

    def update_memory(self, memory_id: str, text: str) -> None:
        """Replace one stored unit's text (MemFail's ``update``); not every system can."""
        raise NotImplementedError(f"{self.name} cannot update a single memory")

    # --- shared behaviour ----------------------------------------------------------------

    def retrieve(self, question: str, k: int | None = None) -> list[MemoryItem]:
        query = question
        if QUERY_REWRITE in self._sites:
            query = self._sites[QUERY_REWRITE](self.lm, question=question).query or question
        return self.search(query, int(k or self._knobs["top_k"]))

    def answer(self, question: str, memories: Sequence[MemoryItem]) -> str:
        return self._sites[ANSWER](
            self.lm, memories=render_memories(memories), question=question
        ).answer

    def prompt_sites(self) -> dict[str, PromptSite]:
        return dict(self._sites)

    def use_modules(self, modules: dict[str, dspy.Predict]) -> None:
        """Run these DSPy modules at the named sites from now on (an optimizer's candidate
        program)."""
        for name, module in modules.items():
            if name in self._sites:
                self._sites[name].module = module

    def knobs(self) -> dict[str, Any]:
        return dict(self._knobs)

    @classmethod
    def knob_choices(cls, name: str, current: Any = None) -> list[Any]:
        """The values an optimizer may try for knob ``name``: ``current`` (the default value when
        ``None``) first, then ``knob_values``. A knob with no value space has only its current
        value."""
        if name not in cls.default_knobs:
            raise KeyError(f"{cls.name} has no knob {name!r}")
        current = cls.default_knobs[name] if current is None else current
        return list(dict.fromkeys([current, *cls.knob_values.get(name, ())]))

    def set_knob(self, name: str, value: Any) -> None:
        if name not in self._knobs:
            raise KeyError(f"{self.name} has no knob {name!r}")
        self._knobs[name] = value

    def _clear_run_dir(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
