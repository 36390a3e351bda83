"""A planted fault: a system broken on purpose in one known place, with the answer a correct blame
must give (the site, or ``knob:<name>``, and for an operation fault the error type).

Two kinds, one model (:class:`PlantedFault`): an :class:`OperationFault` corrupts an operation as
it runs (a site's output or input, a store's memories after each session, a knob), which bites even
on a model too small to follow a written instruction to misbehave; it measures attribution.
An :class:`InstructionFault` is a written instruction at a site (replacing, appended to or put in
front of the site's own), the kind of fault an optimizer rewrites instructions to mend; it measures
repair (``optloop.run --start``). Both apply to a built system with :meth:`PlantedFault.apply`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import dspy

from optloop.attribution.taxonomy import ErrorType
from optloop.text import start_text

if TYPE_CHECKING:
    from systems.base import MemorySystem

ORIGINAL = "original"
PREREGISTERED = "preregistered"  # written down and committed before any run evaluated them
PERSONA = "memfail:persona?limit=24"  # an instruction fault's default dataset


class PlantedFault(ABC):
    """One planted fault: its name, the systems it applies to, the site (or ``knob:<name>``;
    ``{system}`` filled per system) a correct attribution blames, what it does, and the catalogue
    group it joined with (``added``: :data:`ORIGINAL`, or :data:`PREREGISTERED`, written down
    before any run)."""

    name: str
    systems: tuple[str, ...]
    target: str
    description: str
    added: str

    def applies_to(self, system: str) -> bool:
        return system in self.systems

    @abstractmethod
    def apply(self, system: MemorySystem) -> None:
        """Plant the fault in ``system`` (built, nothing ingested yet)."""


def _map_lists(
    prediction: dspy.Prediction,
    fn: Callable[[list[Any], dict[str, Any]], list[Any]],
    inputs: dict[str, Any],
) -> dspy.Prediction:
    for key, value in list(prediction.items()):
        if isinstance(value, list):
            prediction[key] = fn(value, inputs)
    return prediction


@dataclass
class OperationFault(PlantedFault):
    """A fault in an operation: a site's output or input corrupted as it runs, a store's memories
    after each session, or knobs set; ``error_type`` is what a correct attribution calls it."""

    name: str
    systems: tuple[str, ...]
    target: str
    error_type: ErrorType
    description: str
    site: str | None = None  # the site whose module is corrupted
    lists: Callable[[list[Any], dict[str, Any]], list[Any]] | None = None
    outputs: dict[str, Any] = field(default_factory=dict)  # output fields forced to a value
    inputs: dict[str, Any] = field(default_factory=dict)  # input fields forced to a value
    knobs: dict[str, Any] = field(default_factory=dict)
    query_site: bool = False
    # A store fault: run after each session is ingested, with the ids stored before it.
    after_session: Callable[[MemorySystem, set[str]], None] | None = None
    # The site's inputs rewritten before its call, and its prediction edited (in place) after it,
    # from the inputs.
    edit_inputs: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    edit_outputs: Callable[[dspy.Prediction, dict[str, Any]], None] | None = None
    added: str = ORIGINAL

    def apply(self, system: MemorySystem) -> None:
        for name, value in self.knobs.items():
            system.set_knob(name, value)
        if self.after_session is not None:
            self._wrap_ingest(system, self.after_session)
        if self.site is None:
            return
        module = system.prompt_sites()[self.site].module
        original = module.forward
        lists, forced_out, forced_in = self.lists, dict(self.outputs), dict(self.inputs)
        edit_inputs, edit_outputs = self.edit_inputs, self.edit_outputs

        def faulty_forward(**kwargs: Any) -> dspy.Prediction:
            kwargs = {**kwargs, **forced_in}
            if edit_inputs is not None:
                kwargs = edit_inputs(kwargs)
            prediction = original(**kwargs)
            if lists is not None:
                prediction = _map_lists(prediction, lists, kwargs)
            for key, value in forced_out.items():
                prediction[key] = value
            if edit_outputs is not None:
                edit_outputs(prediction, kwargs)
            return prediction

        module.forward = faulty_forward

    @staticmethod
    def _wrap_ingest(system: MemorySystem, hook: Callable[[MemorySystem, set[str]], None]) -> None:
        original = system.ingest

        def faulty_ingest(sessions: Any) -> None:
            for session in sessions:
                before = {m.id for m in system.all_memories()}
                original([session])
                # after the first session too (``before`` empty): the old hooks then do nothing
                hook(system, before)

        system.ingest = faulty_ingest  # type: ignore[method-assign]


@dataclass
class InstructionFault(PlantedFault):
    """A written instruction at one site of one system: the site's own instruction replaced by
    ``text``, or ``text`` appended to it or put in front of it. Its ``target`` is the site;
    ``dataset`` is where it is run, with the site ``retrieve.query`` added when
    ``query_rewrite``."""

    name: str
    systems: tuple[str, ...]
    target: str
    mode: Literal["replace", "append", "prepend"]
    text: str
    description: str = ""
    dataset: str = PERSONA
    query_rewrite: bool = False  # run with optloop.run --query-rewrite
    added: str = ORIGINAL

    @property
    def system(self) -> str:
        return self.systems[0]

    @property
    def site(self) -> str:
        return self.target

    @property
    def start(self) -> str:
        """The fault as ``optloop.run --start SITE=...`` takes it: TEXT, +TEXT (appended) or TEXT+
        (in front)."""
        return {"replace": self.text, "append": f"+{self.text}", "prepend": f"{self.text}+"}[
            self.mode
        ]

    def instruction(self, clean: str) -> str:
        """The site's instruction under the fault, from its clean one."""
        return start_text(clean, self.start)

    def apply(self, system: MemorySystem) -> None:
        site = system.prompt_sites()[self.site]
        site.set_instructions(self.instruction(site.instructions))
