"""The decisive-error search: follow the evidence forward through the graph.

For a failed question the walk asks, in the order the data flowed, whether the evidence was
**extracted** (``ExtractionError``, or ``UpdateError`` for the dedupe that lost it), **kept**
(``UpdateError`` / ``DeletionError``), **retrieved** (``RetrievalError``, blamed on the query
rewrite or a retrieval knob), **admitted** by an admission gate where the system has one
(``RetrievalError`` on the gate's site or ``knob:floors``) and **used** (``ResponseError`` at
``answer``); the first "no" is the decisive error. Before them, **contaminated?**: an answer that
states a stale, dead-branch or other-workspace value a memory in its positive context carries is a
``ContaminationError``, blamed on whoever let that memory in. No LLM is called unless an LLM judge
is configured (:func:`optloop.attribution.judges.default_judges`). Each step's blame rules:
``docs/attribution.md`` ("Attributing a system's failures").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optloop.attribution.evidence import Evidence, find_evidence
from optloop.attribution.judges import JudgeChain, content_tokens
from optloop.attribution.taxonomy import Attribution, ErrorType, knob_target, library_target
from optloop.datasets.agentic import DEAD_BRANCHES, mentions
from optloop.sites import ANSWER, QUERY_REWRITE
from optloop.tracing.graph import ExecutionGraph, Operation, Variable

if TYPE_CHECKING:
    from optloop.datasets import Question
    from optloop.embed import Embedder

QUERY_DRIFT = 0.34  # a rewrite keeping under a third of the question's content words has drifted
ADMIT_KIND = "admit"  # the op kind of an admission gate's site (systems/gated.py)
FLOORS_KNOB = "floors"


def _retrieval(graph: ExecutionGraph, question_id: str) -> tuple[Operation | None, list[dict]]:
    """The question's (last) retrieve operation and the items it returned."""
    retrieve = next(
        (op for op in reversed(graph.question_ops(question_id)) if op.name == "retrieve"), None
    )
    if retrieve is None:
        return None, []
    return retrieve, (graph.variables[retrieve.outputs[0]].data or {}).get("items", [])


def admission(graph: ExecutionGraph, question_id: str) -> tuple[Operation | None, dict[str, dict]]:
    """The question's (last) admission-gate operation and its decisions by memory id (``None``,
    ``{}``: no gate).

    A gate is a site whose op kinds include ``admit``; its output is the list of decisions
    (``memory_id``, ``verdict`` admit | negative | reject, ``by`` floor | llm | default,
    ``reason``).
    """
    sites = graph.meta.get("sites", {})
    gate = next(
        (
            op
            for op in reversed(graph.question_ops(question_id))
            if op.site
            and op.outputs
            and ADMIT_KIND in (sites.get(op.site, {}).get("op_kinds") or [])
        ),
        None,
    )
    if gate is None:
        return None, {}
    data = graph.variables[gate.outputs[0]].data
    decisions = data if isinstance(data, list) else []
    return gate, {str(d.get("memory_id")): d for d in decisions if isinstance(d, dict)}


def answer_context(graph: ExecutionGraph, question_id: str) -> tuple[list[dict], list[dict]]:
    """The retrieved items the answer was told to use (positive context) and those it was shown as
    negative evidence ("this did not work"). Without a gate every retrieved item is positive
    context."""
    _, items = _retrieval(graph, question_id)
    gate, decisions = admission(graph, question_id)
    if gate is None:
        return list(items), []
    positive = [
        it
        for it in items
        if decisions.get(str(it.get("id")), {}).get("verdict", "admit") == "admit"
    ]
    negative = [
        it for it in items if decisions.get(str(it.get("id")), {}).get("verdict") == "negative"
    ]
    return positive, negative


def _kind(variable: Variable) -> str | None:
    return ((variable.data or {}).get("metadata") or {}).get("kind")


class _Walk:
    def __init__(
        self,
        graph: ExecutionGraph,
        question: Question,
        prediction: str,
        judges: JudgeChain,
        evidence: Evidence,
    ):
        self.graph = graph
        self.q = question
        self.prediction = prediction
        self.judges = judges
        self.ev = evidence
        self.sites = graph.meta.get("sites", {})
        self.knobs = graph.meta.get("knobs", {})

    def result(
        self,
        error_type: ErrorType,
        op: Operation | None,
        target: str | None,
        explanation: str,
        ambiguous: bool = False,
        **details: object,
    ) -> Attribution:
        return Attribution(
            question_id=self.q.id,
            question=self.q.question,
            gold=self.q.gold,
            prediction=self.prediction,
            error_type=error_type,
            op_id=op.id if op else None,
            target=target,
            explanation=explanation,
            evidence_ids=self.ev.message_ids,
            evidence_source=self.ev.source,
            ambiguous=ambiguous,
            judge_calls=dict(self.judges.calls),
            details=dict(details),
        )

    def carries(self, variables: Sequence[Variable]) -> list[bool]:
        return self.judges.carries([v.text for v in variables], self.ev)

    def kinds(self, op: Operation) -> list[str]:
        return list(self.sites.get(op.site or "", {}).get("op_kinds") or [])

    def evidence_quote(self) -> str:
        quote = " / ".join(t[:120] for t in self.ev.texts) or self.ev.answer
        return f"the evidence ({quote!r}, gold answer {self.ev.answer!r})"

    # --- the four questions ---------------------------------------------------------------

    def run(self) -> Attribution:
        retrieve, items = _retrieval(self.graph, self.q.id)
        answer = next(
            (op for op in reversed(self.graph.question_ops(self.q.id)) if op.category == "answer"),
            None,
        )
        if self.q.abstain:
            return self.result(
                ErrorType.RESPONSE,
                answer,
                ANSWER,
                f"Nothing in the conversation answers {self.q.question!r}; the right answer was "
                f"to decline, but the answer site replied {self.prediction!r}. Fix the answer "
                "prompt so it abstains when the memories do not support an answer.",
            )
        gate, decisions = admission(self.graph, self.q.id)
        positive, negative = answer_context(self.graph, self.q.id)
        if retrieve is not None:
            contaminated = self.contamination(retrieve, items, positive, gate, decisions)
            if contaminated is not None:
                return contaminated
        if not self.ev.message_ids:
            return self.result(
                ErrorType.UNKNOWN,
                None,
                None,
                "No evidence for the gold answer was found among the "
                "messages, so the failure cannot be followed through the graph.",
                ambiguous=True,
            )
        memories = self.graph.by_cls("memory")
        kinds = self.graph.meta.get("retrievable_kinds")
        # a unit the configured search can never return is not stored *for* retrieval
        if kinds is not None:
            memories = [v for v in memories if _kind(v) is None or _kind(v) in kinds]
        carriers = [
            v
            for v, ok in zip(memories, self.carries(memories), strict=True)
            if ok and v.status == "live"
        ]
        if not carriers:
            return self.not_stored()
        survivors = [v for v in carriers if self.graph.latest("memory", v.name) is v]
        if not survivors:
            return self.lost(carriers)
        if retrieve is None:
            return self.result(
                ErrorType.UNKNOWN,
                None,
                None,
                "The question has no recorded retrieval.",
                ambiguous=True,
            )
        if not self.judges.any([it["text"] for it in items], self.ev):
            return self.not_retrieved(
                retrieve, self.graph.variables[retrieve.outputs[0]], survivors
            )
        if gate is not None and not self.judges.any([it["text"] for it in positive], self.ev):
            return self.not_admitted(gate, retrieve, items, decisions)
        return self.result(
            ErrorType.RESPONSE,
            answer,
            ANSWER,
            f"The retrieval handed {self.evidence_quote()} to the answer site (in {len(items)} "
            f"memories), but it answered {self.prediction!r}. The memories were right; the "
            "answer prompt did not use them. Fix the answer site.",
        )

    def not_stored(self) -> Attribution:
        session_ops = [
            op
            for op in self.graph.operations
            if op.category == "ingest" and op.site and op.session_id in self.ev.sessions
        ]
        extract_ops = [op for op in session_ops if "extract" in self.kinds(op)]
        # Sites whose output is what gets stored (kind "store") must carry the evidence; an earlier
        # step (graphiti's entity names) holds only part of it, so it is judged only without them.
        storing = [op for op in extract_ops if "store" in self.kinds(op)]
        for op in storing or extract_ops:
            outputs = [self.graph.variables[o] for o in op.outputs]
            if not any(self.carries(outputs)):
                return self.result(
                    ErrorType.EXTRACTION,
                    op,
                    op.site,
                    f"{self.evidence_quote()} was in session {op.session_id}, but the {op.site} "
                    f"call ({op.id}) returned {len(outputs)} item(s), none carrying it, and no "
                    "memory unit ever held it. Fix the extraction prompt so this kind of fact "
                    "is kept.",
                    outputs=len(outputs),
                )
        if extract_ops:
            last = extract_ops[-1]
            later = [
                op
                for op in session_ops
                if op.seq > last.seq and {"update", "delete"} & set(self.kinds(op))
            ]
            if later:
                op = later[0]
                return self.result(
                    ErrorType.UPDATE,
                    op,
                    op.site,
                    f"The extraction ({last.id}) kept {self.evidence_quote()}, but after "
                    f"{op.site} ({op.id}) no stored memory carried it: the dedupe/update step "
                    "merged it away. Fix that prompt.",
                )
            return self.result(
                ErrorType.EXTRACTION,
                last,
                last.site,
                f"The extraction ({last.id}) output carried {self.evidence_quote()}, yet no "
                "memory unit did: the library dropped it when storing.",
                ambiguous=True,
            )
        store = next(
            (
                op
                for op in self.graph.operations
                if op.name == "store" and op.session_id in self.ev.sessions
            ),
            None,
        )
        return self.result(
            ErrorType.EXTRACTION,
            store,
            None,
            f"No memory unit carries {self.evidence_quote()} and no prompt site extracted from "
            "its session; the judges may have missed it.",
            ambiguous=True,
        )

    def lost(self, carriers: Sequence[Variable]) -> Attribution:
        carrier_ids = {v.id for v in carriers}
        for op in self.graph.operations:
            if op.name not in ("update", "delete") or not carrier_ids & set(op.inputs):
                continue
            outputs = [self.graph.variables[o] for o in op.outputs]
            live = [v for v in outputs if v.status == "live"]
            if live and any(self.carries(live)):
                carrier_ids |= {v.id for v in live}
                continue
            error = (
                ErrorType.UPDATE
                if live or any(v.status == "invalidated" for v in outputs)
                else ErrorType.DELETION
            )
            site = deciding_site(
                self.graph, op, "update" if error is ErrorType.UPDATE else "delete"
            )
            verb = "rewrote" if error is ErrorType.UPDATE else "removed"
            before = next(
                (self.graph.variables[i].text for i in op.inputs if i in carrier_ids), ""
            )
            after = live[0].text if live else "(nothing)"
            return self.result(
                error,
                op,
                site,
                f"Session {op.session_id} {verb} the memory that carried {self.evidence_quote()}: "
                f"{before[:160]!r} became {after[:160]!r} ({op.id}, decided by {site}). Fix that "
                "prompt so it keeps facts that are not contradicted.",
            )
        return self.result(
            ErrorType.UPDATE,
            None,
            None,
            f"A memory carried {self.evidence_quote()}, but none does at question time and no "
            "recorded update or delete explains it.",
            ambiguous=True,
        )

    def not_retrieved(
        self, retrieve: Operation, retrieved: Variable, survivors: Sequence[Variable]
    ) -> Attribution:
        data = retrieved.data or {}
        query = data.get("query") or ""
        rewrite = next(
            (op for op in self.graph.question_ops(self.q.id) if op.site == QUERY_REWRITE), None
        )
        question_words = content_tokens(self.q.question)
        where = f"{len(survivors)} stored memory unit(s) carried {self.evidence_quote()}"
        if rewrite is not None and question_words:
            kept = len(question_words & content_tokens(query)) / len(question_words)
            if kept < QUERY_DRIFT:
                return self.result(
                    ErrorType.RETRIEVAL,
                    rewrite,
                    QUERY_REWRITE,
                    f"{where}, but retrieval searched for {query!r}, a rewrite of "
                    f"{self.q.question!r} that kept {kept:.0%} of its words, and missed it. Fix "
                    "the query-rewrite prompt.",
                    query_overlap=kept,
                )
            asked = data.get("asked") or []
            found = sorted(asked.index(v.name) + 1 for v in survivors if v.name in asked)
            if found:
                return self.result(
                    ErrorType.RETRIEVAL,
                    rewrite,
                    QUERY_REWRITE,
                    f"{where}, but retrieval searched for {query!r}, a rewrite of "
                    f"{self.q.question!r}, and missed it; the same search for the question as "
                    f"asked ranks it {found[0]} of {len(asked)}. Fix the query-rewrite prompt.",
                    query_overlap=kept,
                    asked_rank=found[0],
                )
        if data.get("truncation"):
            return self.result(
                ErrorType.RETRIEVAL,
                retrieve,
                knob_target("max_context_tokens"),
                f"{where}, but the context was truncated ({data['truncation']}) before it. "
                "Raise max_context_tokens.",
            )
        wide = data.get("wide") or []
        k = retrieve.knobs.get("top_k") or len(data.get("items", []))
        ranks = sorted(wide.index(v.name) + 1 for v in survivors if v.name in wide)
        if ranks and "top_k" in retrieve.knobs:
            return self.result(
                ErrorType.RETRIEVAL,
                retrieve,
                knob_target("top_k"),
                f"{where}; the best ranked {ranks[0]} for {query!r}, below top_k={k}. Raise top_k "
                f"to at least {ranks[0]} or improve the ranking.",
                rank=ranks[0],
            )
        knob = search_knob(self.graph, retrieve)
        wider = f" (not in the top {len(wide)} either)" if wide else ""
        also = "the query-rewrite prompt" if rewrite is not None else "add a query-rewrite site"
        return self.result(
            ErrorType.RETRIEVAL,
            retrieve,
            knob_target(knob) if knob else None,
            f"{where}, but the search for {query!r} did not return it{wider}. Tune the search "
            f"({knob or 'its parameters'}) or {also}.",
        )

    # --- contamination and admission ---------------------------------------------------------

    def contaminant(self, positive: Sequence[dict]) -> tuple[dict, str, str] | None:
        """``(item, kind, value)``: a positive-context item carrying a stale value the answer
        states.

        ``kind`` is ``distractor`` or ``foreign`` (the question's markers), ``superseded`` or
        ``dead_branch`` (the memory's own state).
        """
        gold = self.ev.answer or self.q.gold
        meta = self.q.meta or {}
        markers = [("distractor", str(m)) for m in meta.get("distractors") or []]
        markers += [("foreign", str(m)) for m in meta.get("foreign") or []]
        for kind, marker in markers:
            if mentions(self.prediction, marker) and not mentions(gold, marker):
                item = next(
                    (it for it in positive if mentions(str(it.get("text", "")), marker)), None
                )
                if item is not None:
                    return item, kind, marker
        for item in positive:
            variable = self.graph.variables.get(str(item.get("var") or ""))
            state = ((variable.data or {}).get("metadata") or {}) if variable is not None else {}
            value = str(state.get("value") or "")
            kind = (
                "superseded"
                if state.get("status") == "superseded"
                else "dead_branch"
                if state.get("branch_status") in DEAD_BRANCHES
                else ""
            )
            if kind and value and mentions(self.prediction, value) and not mentions(gold, value):
                return item, kind, value
        return None

    def contamination(
        self,
        retrieve: Operation,
        items: Sequence[dict],
        positive: Sequence[dict],
        gate: Operation | None,
        decisions: dict[str, dict],
    ) -> Attribution | None:
        found = self.contaminant(positive)
        if found is None:
            return None
        item, kind, value = found
        what = {
            "distractor": "a stale or dead-branch value",
            "foreign": "a value from another workspace",
            "superseded": "a superseded value",
            "dead_branch": "a value written by a failed or rolled-back run",
        }[kind]
        seen = (
            f"The answer {self.prediction!r} states {value!r}, {what}, which memory "
            f"{item.get('id')} ({str(item.get('text', ''))[:160]!r}, rank {item.get('rank')}) "
            "put in its positive context"
        )
        details: dict[str, Any] = {
            "contaminant": item.get("id"),
            "value": value,
            "kind": kind,
            "rank": item.get("rank"),
        }
        decision = decisions.get(str(item.get("id"))) if gate is not None else None
        if gate is not None and decision is not None and decision.get("by") in ("llm", "default"):
            how = (
                "admitted it"
                if decision.get("by") == "llm"
                else "gave no verdict on it, so it was admitted by default"
            )
            return self.result(
                ErrorType.CONTAMINATION,
                gate,
                gate.site,
                f"{seen}: the admission gate {gate.site} ({gate.id}) {how} "
                f"({decision.get('reason')!r}). "
                "Fix the gate prompt so it rejects stale, dead-branch and other-workspace "
                "memories.",
                decided_by=decision.get("by"),
                **details,
            )
        if gate is not None and FLOORS_KNOB in retrieve.knobs:
            floors = retrieve.knobs.get(FLOORS_KNOB)
            return self.result(
                ErrorType.CONTAMINATION,
                gate,
                knob_target(FLOORS_KNOB),
                f"{seen}: it passed the gate's floors (floors={floors!r}) without an LLM "
                "verdict. Strict floors reject superseded and other-workspace memories and "
                "keep dead-branch ones to negative evidence.",
                decided_by="floor",
                **details,
            )
        carried = (
            [
                it.get("rank") or 0
                for it, ok in zip(
                    items,
                    self.judges.carries([str(it.get("text", "")) for it in items], self.ev),
                    strict=True,
                )
                if ok
            ]
            if self.ev.message_ids
            else []
        )
        if carried and "top_k" in retrieve.knobs and min(carried) < (item.get("rank") or 0):
            return self.result(
                ErrorType.CONTAMINATION,
                retrieve,
                knob_target("top_k"),
                f"{seen}. The retrieval ranked the evidence higher (rank {min(carried)}) and "
                f"has no notion of status or workspace; top_k={retrieve.knobs['top_k']} let the "
                "stale memory in below it. Lower top_k, or gate what retrieval returns.",
                **details,
            )
        knob = search_knob(self.graph, retrieve)
        return self.result(
            ErrorType.CONTAMINATION,
            retrieve,
            knob_target(knob) if knob else None,
            f"{seen}. The retrieval returned it and has no notion of status or workspace. Tune "
            f"the search ({knob or 'its parameters'}), or gate what retrieval returns.",
            **details,
        )

    def not_admitted(
        self,
        gate: Operation,
        retrieve: Operation,
        items: Sequence[dict],
        decisions: dict[str, dict],
    ) -> Attribution:
        carriers = [
            it
            for it, ok in zip(
                items,
                self.judges.carries([str(it.get("text", "")) for it in items], self.ev),
                strict=True,
            )
            if ok
        ]
        best = carriers[0]
        decision = decisions.get(str(best.get("id")), {})
        shown = (
            "let it in only as negative evidence"
            if decision.get("verdict") == "negative"
            else "rejected it"
        )
        where = (
            f"Retrieval found {self.evidence_quote()} (memory {best.get('id')}, rank "
            f"{best.get('rank')}), but the "
            f"admission gate ({gate.id}) {shown}: {decision.get('reason')!r}"
        )
        if decision.get("by") == "floor" and FLOORS_KNOB in retrieve.knobs:
            return self.result(
                ErrorType.RETRIEVAL,
                gate,
                knob_target(FLOORS_KNOB),
                f"{where}. A floor decided (floors={retrieve.knobs.get(FLOORS_KNOB)!r}); this "
                "is the recall a strict gate costs. Lenient floors would leave the decision to "
                "the gate's LLM.",
                decided_by="floor",
                memory=best.get("id"),
            )
        return self.result(
            ErrorType.RETRIEVAL,
            gate,
            gate.site,
            f"{where}. Fix the gate prompt so it admits current facts of the agent's workspace.",
            decided_by=decision.get("by"),
            memory=best.get("id"),
        )


def deciding_site(graph: ExecutionGraph, op: Operation, kind: str | None = None) -> str:
    """The last prompt site of ``op``'s session, before it, that produces ``kind`` operations (any,
    if None).

    That site decided what a non-LLM store step of the session wrote; without one, the
    library's own step is to blame.
    """
    sites = graph.meta.get("sites", {})
    deciding = [
        o
        for o in graph.operations
        if o.site
        and o.category == "ingest"
        and o.session_id == op.session_id
        and o.seq < op.seq
        and (kind is None or kind in (sites.get(o.site, {}).get("op_kinds") or []))
    ]
    return (
        deciding[-1].site  # type: ignore[return-value]
        if deciding
        else library_target(f"{graph.system}.store")
    )


def search_knob(graph: ExecutionGraph, retrieve: Operation) -> str | None:
    """The knob that decides what a retrieve operation's search returns: the system's
    ``search_knob``, recorded in ``graph.meta`` (``None`` when the graph does not name one, or the
    operation lacks it)."""
    knob = graph.meta.get("search_knob")
    return knob if knob in retrieve.knobs else None


def attribute(
    graph: ExecutionGraph,
    question: Question,
    prediction: str,
    judges: JudgeChain,
    *,
    embedder: Embedder | None = None,
) -> Attribution:
    """The decisive error of one failed question, judged on a session of ``judges``
    (``judge_calls``: this attribution's own, see :meth:`JudgeChain.session`)."""
    evidence = find_evidence(graph, question, embedder)
    return _Walk(graph, question, prediction, judges.session(), evidence).run()


def evidence_reaches_answer(
    graph: ExecutionGraph,
    question: Question,
    judges: JudgeChain,
    *,
    embedder: Embedder | None = None,
) -> bool:
    """Whether the memories retrieved for ``question`` and admitted to its answer's positive
    context (all of them, without an admission gate) carry its evidence."""
    evidence = find_evidence(graph, question, embedder)
    positive, _ = answer_context(graph, question.id)
    return bool(evidence.message_ids) and judges.any([it["text"] for it in positive], evidence)
