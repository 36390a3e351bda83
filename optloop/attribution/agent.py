"""The optional LLM agent: explores the graph from the evidence for cases the walk left ambiguous.

The deterministic walk (:mod:`optloop.attribution.decisive`) marks an
attribution ``ambiguous`` when its judges could not follow the evidence (no
unit matched although extraction kept it, a loss no recorded operation
explains, no evidence found at all). For those, and only when asked
(``python -m optloop attribute --agent``), an LLM inspects operations one at a
time, the way MemTrace's agent does:

- the **to-explore list** starts with the operations that consumed the
  evidence messages (or, without evidence, the question's own operations),
  ordered earliest first;
- each step shows the LLM one operation (its site, inputs, outputs, the
  question, the gold answer and the evidence) and asks: did this operation
  lose or corrupt the evidence? If yes, that operation is the decisive error;
  if not, the operations that consumed its outputs join the list;
- the list is bounded (``max_frontier``) and so is the number of LLM calls
  (``max_steps``); when the budget runs out the walk's attribution stands.

The agent's verdict keeps the walk's own explanation in ``details`` so a
reviewer can compare the two.
"""

from __future__ import annotations

import heapq
import logging
from typing import TYPE_CHECKING, Literal

import dspy

from optloop.attribution.decisive import deciding_site, search_knob
from optloop.attribution.evidence import find_evidence
from optloop.attribution.taxonomy import Attribution, ErrorType, knob_target
from optloop.lm import prompt_site

if TYPE_CHECKING:
    from optloop.datasets import Question
    from optloop.embed import Embedder
    from optloop.tracing.graph import ExecutionGraph, Operation

logger = logging.getLogger(__name__)

AGENT_SITE = "attribution.agent"
SHOW_CHARS = 300  # per variable shown to the agent
_TYPES = {
    "extraction": ErrorType.EXTRACTION,
    "update": ErrorType.UPDATE,
    "deletion": ErrorType.DELETION,
    "retrieval": ErrorType.RETRIEVAL,
    "response": ErrorType.RESPONSE,
}


class InspectOperation(dspy.Signature):
    """You debug an AI assistant's long-term memory. The assistant answered a question wrongly. Below is
    one operation of its memory pipeline, with the evidence the right answer depends on. Decide whether
    THIS operation lost, dropped, overwrote, failed to retrieve or ignored that evidence."""

    question: str = dspy.InputField()
    gold_answer: str = dspy.InputField()
    evidence: str = dspy.InputField(desc="the conversation messages that hold the answer")
    operation: str = dspy.InputField(desc="what the operation is: its kind and prompt site")
    inputs: str = dspy.InputField(desc="the operation's input values")
    outputs: str = dspy.InputField(desc="the operation's output values")
    faulty: bool = dspy.OutputField(desc="true if this operation lost or corrupted the evidence")
    error_type: Literal["extraction", "update", "deletion", "retrieval", "response"] = (
        dspy.OutputField()
    )
    explanation: str = dspy.OutputField(desc="one or two sentences a developer can act on")


def _show(graph: ExecutionGraph, ids: list[str], limit: int = 6) -> str:
    lines = [
        f"- {graph.variables[i].cls}: {graph.variables[i].text[:SHOW_CHARS]}"
        for i in ids[:limit]
        if i in graph.variables and graph.variables[i].cls != "prompt"
    ]
    if len(ids) > limit:
        lines.append(f"- ... and {len(ids) - limit} more")
    return "\n".join(lines) or "(none)"


class AttributionAgent:
    """Bounded, earliest-first exploration of the graph by an LLM (see the module docstring)."""

    def __init__(self, lm: dspy.BaseLM, *, max_steps: int = 6, max_frontier: int = 12):
        self.lm = lm
        self.max_steps = max_steps
        self.max_frontier = max_frontier
        self.inspect = dspy.Predict(InspectOperation)
        self.calls = 0

    def refine(
        self,
        graph: ExecutionGraph,
        question: Question,
        walk: Attribution,
        *,
        embedder: Embedder | None = None,
    ) -> Attribution:
        """The agent's attribution of ``question``, or ``walk`` unchanged if it finds no faulty
        operation."""
        evidence = find_evidence(graph, question, embedder)
        start = {op.id: op for vid in evidence.message_ids for op in graph.consumers(vid)}
        if not start:
            start = {op.id: op for op in graph.question_ops(question.id)}
        frontier: list[tuple[int, str]] = [(op.seq, op.id) for op in start.values()]
        heapq.heapify(frontier)
        seen: set[str] = set()
        visited: list[str] = []
        evidence_text = "\n".join(evidence.texts) or "(no evidence message found)"
        while frontier and len(visited) < self.max_steps:
            _, op_id = heapq.heappop(frontier)
            if op_id in seen:
                continue
            seen.add(op_id)
            op = graph.op(op_id)
            visited.append(op_id)
            verdict = self._inspect(graph, op, question, evidence.answer, evidence_text)
            if verdict is not None and verdict.faulty:
                error = _TYPES.get(str(verdict.error_type), ErrorType.UNKNOWN)
                return walk.model_copy(
                    update={
                        "error_type": error,
                        "op_id": op.id,
                        "target": self._target(graph, op),
                        "explanation": f"{verdict.explanation} (LLM agent, after inspecting "
                        f"{len(visited)} "
                        f"operation(s): {', '.join(visited)})",
                        "ambiguous": False,
                        "details": {
                            **walk.details,
                            "agent_steps": visited,
                            "walk_error_type": walk.error_type.value,
                            "walk_target": walk.target,
                            "walk_explanation": walk.explanation,
                        },
                    }
                )
            for out in op.outputs:
                for nxt in graph.consumers(out):
                    if nxt.id not in seen and len(frontier) < self.max_frontier:
                        heapq.heappush(frontier, (nxt.seq, nxt.id))
        return walk.model_copy(
            update={"details": {**walk.details, "agent_steps": visited, "agent_verdict": "none"}}
        )

    def _inspect(
        self, graph: ExecutionGraph, op: Operation, question: Question, gold: str, evidence: str
    ) -> dspy.Prediction | None:
        what = f"{op.name} ({op.category}), " + (
            f"prompt site {op.site}" if op.site else "no prompt (library step)"
        )
        if op.comment:
            what += f"; {op.comment}"
        self.calls += 1
        try:
            with prompt_site(AGENT_SITE), dspy.context(lm=self.lm, adapter=dspy.JSONAdapter()):
                return self.inspect(
                    question=question.question,
                    gold_answer=gold,
                    evidence=evidence,
                    operation=what,
                    inputs=_show(graph, op.inputs),
                    outputs=_show(graph, op.outputs),
                )
        # an unusable verdict leaves the walk's answer standing
        except Exception as exc:  # noqa: BLE001
            logger.warning("attribution agent: %s on %s: %s", type(exc).__name__, op.id, exc)
            return None

    @staticmethod
    def _target(graph: ExecutionGraph, op: Operation) -> str | None:
        """What to fix for ``op``: its site, else the site that decided its session's writes."""
        if op.site:
            return op.site
        if op.category == "ingest":
            return deciding_site(graph, op)
        if op.name == "retrieve":
            knob = search_knob(graph, op)
            return knob_target(knob) if knob else None
        return None


def refine_ambiguous(
    agent: AttributionAgent,
    graph: ExecutionGraph,
    questions: dict[str, Question],
    attributions: list[Attribution],
    *,
    embedder: Embedder | None = None,
) -> list[Attribution]:
    """``attributions`` with every ambiguous one handed to ``agent``; the others unchanged."""
    return [
        agent.refine(graph, questions[a.question_id], a, embedder=embedder) if a.ambiguous else a
        for a in attributions
    ]
