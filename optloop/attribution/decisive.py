"""The decisive-error search: follow the evidence forward through the graph.

For a failed question the walk asks, in the order the data flowed:

1. **extracted?** Did any memory unit ever carry the evidence? If not, the
   first extraction call of the evidence session whose output lost it is the
   decisive error (``ExtractionError``); if every extraction output still had
   it, the dedupe/update call that followed lost it (``UpdateError``).
2. **kept?** Is some unit that carried it still live, unchanged, at question
   time? If not, the earliest update or delete that took it away is decisive
   (``UpdateError`` / ``DeletionError``), blamed on the session's prompt site
   that decides updates or deletes.
3. **retrieved?** Did the retrieval hand it to the answer? If not,
   ``RetrievalError``: blamed on the ``retrieve.query`` site when its rewrite
   drifted from the question, on ``knob:max_context_tokens`` when a long
   context was truncated, on ``knob:top_k`` when a wider search ranks it just
   below the cut, else on the system's search knob.
4. **used?** It was in front of the answer and the answer is still wrong:
   ``ResponseError`` at the ``answer`` site.

The first "no" is the decisive error. No LLM is called unless an LLM judge is
configured (:func:`optloop.attribution.judges.default_judges`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from optloop.attribution.evidence import Evidence, find_evidence
from optloop.attribution.judges import JudgeChain, content_tokens
from optloop.attribution.taxonomy import Attribution, ErrorType, knob_target, library_target
from optloop.sites import ANSWER, QUERY_REWRITE
from optloop.tracing.graph import ExecutionGraph, Operation, Variable

if TYPE_CHECKING:
    from optloop.datasets import Question
    from optloop.embed import Embedder

QUERY_DRIFT = 0.34  # a rewrite keeping under a third of the question's content words has drifted


def _retrieval(graph: ExecutionGraph, question_id: str) -> tuple[Operation | None, list[dict]]:
    """The question's (last) retrieve operation and the items it returned."""
    retrieve = next((op for op in reversed(graph.question_ops(question_id)) if op.name == "retrieve"), None)
    if retrieve is None:
        return None, []
    return retrieve, (graph.variables[retrieve.outputs[0]].data or {}).get("items", [])


def _kind(variable: Variable) -> str | None:
    return ((variable.data or {}).get("metadata") or {}).get("kind")


class _Walk:
    def __init__(self, graph: ExecutionGraph, question: Question, prediction: str, judges: JudgeChain,
                 evidence: Evidence):
        self.graph = graph
        self.q = question
        self.prediction = prediction
        self.judges = judges
        self.ev = evidence
        self.sites = graph.meta.get("sites", {})
        self.knobs = graph.meta.get("knobs", {})

    def result(self, error_type: ErrorType, op: Operation | None, target: str | None, explanation: str,
               ambiguous: bool = False, **details: object) -> Attribution:
        return Attribution(question_id=self.q.id, question=self.q.question, gold=self.q.gold,
                           prediction=self.prediction, error_type=error_type, op_id=op.id if op else None,
                           target=target, explanation=explanation, evidence_ids=self.ev.message_ids,
                           evidence_source=self.ev.source, ambiguous=ambiguous, judge_calls=dict(self.judges.calls),
                           details=dict(details))

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
        answer = next((op for op in reversed(self.graph.question_ops(self.q.id)) if op.category == "answer"), None)
        if self.q.abstain:
            return self.result(ErrorType.RESPONSE, answer, ANSWER,
                               f"Nothing in the conversation answers {self.q.question!r}; the right answer was to "
                               f"decline, but the answer site replied {self.prediction!r}. Fix the answer prompt so "
                               "it abstains when the memories do not support an answer.")
        if not self.ev.message_ids:
            return self.result(ErrorType.UNKNOWN, None, None, "No evidence for the gold answer was found among the "
                               "messages, so the failure cannot be followed through the graph.", ambiguous=True)
        memories = self.graph.by_cls("memory")
        kinds = self.graph.meta.get("retrievable_kinds")
        if kinds is not None:  # a unit the configured search can never return is not stored *for* retrieval
            memories = [v for v in memories if _kind(v) is None or _kind(v) in kinds]
        carriers = [v for v, ok in zip(memories, self.carries(memories), strict=True) if ok and v.status == "live"]
        if not carriers:
            return self.not_stored()
        survivors = [v for v in carriers if self.graph.latest("memory", v.name) is v]
        if not survivors:
            return self.lost(carriers)
        if retrieve is None:
            return self.result(ErrorType.UNKNOWN, None, None, "The question has no recorded retrieval.",
                               ambiguous=True)
        if not self.judges.any([it["text"] for it in items], self.ev):
            return self.not_retrieved(retrieve, self.graph.variables[retrieve.outputs[0]], survivors)
        return self.result(ErrorType.RESPONSE, answer, ANSWER,
                           f"The retrieval handed {self.evidence_quote()} to the answer site (in "
                           f"{len(items)} memories), but it answered {self.prediction!r}. The memories were right; "
                           "the answer prompt did not use them. Fix the answer site.")

    def not_stored(self) -> Attribution:
        session_ops = [op for op in self.graph.operations
                       if op.category == "ingest" and op.site and op.session_id in self.ev.sessions]
        extract_ops = [op for op in session_ops if "extract" in self.kinds(op)]
        # Sites whose output is what gets stored (kind "store") must carry the evidence; an earlier
        # step (graphiti's entity names) holds only part of it, so it is judged only without them.
        storing = [op for op in extract_ops if "store" in self.kinds(op)]
        for op in storing or extract_ops:
            outputs = [self.graph.variables[o] for o in op.outputs]
            if not any(self.carries(outputs)):
                return self.result(ErrorType.EXTRACTION, op, op.site,
                                   f"{self.evidence_quote()} was in session {op.session_id}, but the {op.site} call "
                                   f"({op.id}) returned {len(outputs)} item(s), none carrying it, and no memory unit "
                                   "ever held it. Fix the extraction prompt so this kind of fact is kept.",
                                   outputs=len(outputs))
        if extract_ops:
            last = extract_ops[-1]
            later = [op for op in session_ops if op.seq > last.seq and {"update", "delete"} & set(self.kinds(op))]
            if later:
                op = later[0]
                return self.result(ErrorType.UPDATE, op, op.site,
                                   f"The extraction ({last.id}) kept {self.evidence_quote()}, but after "
                                   f"{op.site} ({op.id}) no stored memory carried it: the dedupe/update step merged "
                                   "it away. Fix that prompt.")
            return self.result(ErrorType.EXTRACTION, last, last.site,
                               f"The extraction ({last.id}) output carried {self.evidence_quote()}, yet no memory "
                               "unit did: the library dropped it when storing.", ambiguous=True)
        store = next((op for op in self.graph.operations if op.name == "store"
                      and op.session_id in self.ev.sessions), None)
        return self.result(ErrorType.EXTRACTION, store, None,
                           f"No memory unit carries {self.evidence_quote()} and no prompt site extracted from its "
                           "session; the judges may have missed it.", ambiguous=True)

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
            error = ErrorType.UPDATE if live or any(v.status == "invalidated" for v in outputs) else ErrorType.DELETION
            site = deciding_site(self.graph, op, "update" if error is ErrorType.UPDATE else "delete")
            verb = "rewrote" if error is ErrorType.UPDATE else "removed"
            before = next((self.graph.variables[i].text for i in op.inputs if i in carrier_ids), "")
            after = live[0].text if live else "(nothing)"
            return self.result(error, op, site,
                               f"Session {op.session_id} {verb} the memory that carried {self.evidence_quote()}: "
                               f"{before[:160]!r} became {after[:160]!r} ({op.id}, decided by {site}). Fix that "
                               "prompt so it keeps facts that are not contradicted.")
        return self.result(ErrorType.UPDATE, None, None,
                           f"A memory carried {self.evidence_quote()}, but none does at question time and no "
                           "recorded update or delete explains it.", ambiguous=True)

    def not_retrieved(self, retrieve: Operation, retrieved: Variable, survivors: Sequence[Variable]) -> Attribution:
        data = retrieved.data or {}
        query = data.get("query") or ""
        rewrite = next((op for op in self.graph.question_ops(self.q.id) if op.site == QUERY_REWRITE), None)
        question_words = content_tokens(self.q.question)
        where = f"{len(survivors)} stored memory unit(s) carried {self.evidence_quote()}"
        if rewrite is not None and question_words:
            kept = len(question_words & content_tokens(query)) / len(question_words)
            if kept < QUERY_DRIFT:
                return self.result(ErrorType.RETRIEVAL, rewrite, QUERY_REWRITE,
                                   f"{where}, but retrieval searched for {query!r}, a rewrite of "
                                   f"{self.q.question!r} that kept {kept:.0%} of its words, and missed it. Fix the "
                                   "query-rewrite prompt.", query_overlap=kept)
        if data.get("truncation"):
            return self.result(ErrorType.RETRIEVAL, retrieve, knob_target("max_context_tokens"),
                               f"{where}, but the context was truncated ({data['truncation']}) before it. "
                               "Raise max_context_tokens.")
        wide = data.get("wide") or []
        k = retrieve.knobs.get("top_k") or len(data.get("items", []))
        ranks = sorted(wide.index(v.name) + 1 for v in survivors if v.name in wide)
        if ranks and "top_k" in retrieve.knobs:
            return self.result(ErrorType.RETRIEVAL, retrieve, knob_target("top_k"),
                               f"{where}; the best ranked {ranks[0]} for {query!r}, below top_k={k}. Raise top_k "
                               f"to at least {ranks[0]} or improve the ranking.", rank=ranks[0])
        knob = search_knob(self.graph, retrieve)
        wider = f" (not in the top {len(wide)} either)" if wide else ""
        return self.result(ErrorType.RETRIEVAL, retrieve, knob_target(knob) if knob else None,
                           f"{where}, but the search for {query!r} did not return it{wider}. Tune the search "
                           f"({knob or 'its parameters'}) or add a query-rewrite site.")


def deciding_site(graph: ExecutionGraph, op: Operation, kind: str | None = None) -> str:
    """The last prompt site of ``op``'s session, before it, that produces ``kind`` operations (any, if None).

    That site decided what a non-LLM store step of the session wrote; without one, the
    library's own step is to blame.
    """
    sites = graph.meta.get("sites", {})
    deciding = [o for o in graph.operations
                if o.site and o.category == "ingest" and o.session_id == op.session_id and o.seq < op.seq
                and (kind is None or kind in (sites.get(o.site, {}).get("op_kinds") or []))]
    return deciding[-1].site if deciding else library_target(f"{graph.system}.store")  # type: ignore[return-value]


def search_knob(graph: ExecutionGraph, retrieve: Operation) -> str | None:
    """The knob that decides what a retrieve operation's search returns: the system's ``search_knob``,
    recorded in ``graph.meta`` (``None`` when the graph does not name one, or the operation lacks it)."""
    knob = graph.meta.get("search_knob")
    return knob if knob in retrieve.knobs else None


def attribute(graph: ExecutionGraph, question: Question, prediction: str, judges: JudgeChain, *,
              embedder: Embedder | None = None) -> Attribution:
    """The decisive error of one failed question."""
    evidence = find_evidence(graph, question, embedder)
    return _Walk(graph, question, prediction, judges, evidence).run()


def evidence_reaches_answer(graph: ExecutionGraph, question: Question, judges: JudgeChain, *,
                            embedder: Embedder | None = None) -> bool:
    """Whether the memories retrieved for ``question`` carry its evidence."""
    evidence = find_evidence(graph, question, embedder)
    _, items = _retrieval(graph, question.id)
    return bool(evidence.message_ids) and judges.any([it["text"] for it in items], evidence)
