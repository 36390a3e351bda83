"""Mirror one question's slice of an :class:`ExecutionGraph` to an MLflow trace.

A trace per question, so that ``mlflow ui`` shows why it passed or failed: a root span
``question <id>`` with the question, the prediction, the gold answers and the attribution's
verdict, and one child span per operation relevant to the question (what produced what it read,
what processed its evidence, its own operations), in ``seq`` order, laid end to end by their
recorded ``seconds``; ``decisive: true`` marks the op the attribution blames. Traces go to the SQL
tracking store ``sqlite:///<mlruns>/mlflow.db`` (:func:`tracking_uri`), offline;
:func:`log_question_trace` returns once the trace can be read back. The attribution is a dict
read leniently (a MemTraceBench annotation or the attributor's verdict). The spans, their types
and the keys read: ``docs/graph-schema.md`` ("MLflow traces").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import mlflow
from mlflow.entities import SpanType
from mlflow.entities.span import LiveSpan, NoOpSpan

from optloop.tracing.graph import ExecutionGraph, Operation, Variable

logger = logging.getLogger(__name__)

#: Characters of a variable's text kept in span inputs / outputs.
TEXT_LIMIT = 2000
TAG_PREFIX = "optloop."
_NO_ERROR = {"", "none", "correct", "pass", "passed", "no_error"}


def tracking_uri() -> str:
    """The tracking URI optloop logs traces to: ``sqlite:///<OPTLOOP_MLRUNS>/mlflow.db``."""
    from optloop.paths import mlruns_dir

    return f"sqlite:///{mlruns_dir() / 'mlflow.db'}"


def _cut(text: str, limit: int = TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, ""):
            return value
    return None


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, set)):
        return list(value)
    return [value]


# --- which operations ---------------------------------------------------------------------


def question_variable(graph: ExecutionGraph, question_id: str) -> Variable | None:
    """The ``question`` variable of ``question_id`` (matched by question id or name)."""
    for var in graph.variables.values():
        if var.cls == "question" and (var.question_id == question_id or var.name == question_id):
            return var
    return None


def evidence_variables(
    graph: ExecutionGraph, question_id: str, extra: Iterable[Any] = ()
) -> list[str]:
    """Ids of the message variables holding the question's evidence.

    Evidence ids come from the question variable's ``data["evidence_ids"]`` and
    from ``extra`` (an attribution's ``source_evidence_ids``); each may be a
    variable id or a turn id (``message:<turn>@0``). Unknown ids are skipped.
    """
    qvar = question_variable(graph, question_id)
    ids: list[Any] = []
    if qvar is not None and isinstance(qvar.data, Mapping):
        ids += _as_list(qvar.data.get("evidence_ids"))
    ids += list(extra)
    found: list[str] = []
    for raw in ids:
        raw = str(raw)
        for candidate in (raw, f"message:{raw}@0"):
            if candidate in graph.variables:
                if candidate not in found:
                    found.append(candidate)
                break
    return found


def question_operations(
    graph: ExecutionGraph, question_id: str, evidence: Iterable[str] = ()
) -> list[Operation]:
    """The operations relevant to ``question_id``, in ``seq`` order.

    Those with ``op.question_id == question_id``; the ingest operations that
    are ancestors (by data flow) of what those read; and the ingest operations
    downstream of the ``evidence`` variables (how the evidence was processed).
    """
    own = graph.question_ops(question_id)
    producers: dict[str, Operation] = {}
    for op in graph.operations:
        for out in op.outputs:
            producers.setdefault(out, op)
    chosen: dict[str, Operation] = {op.id: op for op in own}

    def ingest(op: Operation) -> bool:
        return op.category == "ingest" and op.question_id in (None, question_id)

    # upstream: producers of everything the question's ops read, transitively
    seen: set[str] = set()
    todo = [vid for op in own for vid in op.inputs]
    while todo:
        vid = todo.pop()
        if vid in seen:
            continue
        seen.add(vid)
        producer = producers.get(vid)
        if producer is None or not (ingest(producer) or producer.id in chosen):
            continue
        chosen[producer.id] = producer
        todo.extend(producer.inputs)

    # downstream of the evidence, through ingest operations only
    by_input: dict[str, list[Operation]] = {}
    for op in graph.operations:
        if ingest(op):
            for vid in op.inputs:
                by_input.setdefault(vid, []).append(op)
    seen = set()
    todo = list(evidence)
    while todo:
        vid = todo.pop()
        if vid in seen:
            continue
        seen.add(vid)
        for op in by_input.get(vid, ()):
            chosen[op.id] = op
            todo.extend(op.outputs)
    return sorted(chosen.values(), key=lambda op: op.seq)


# --- spans --------------------------------------------------------------------------------


def span_name(op: Operation) -> str:
    """``"{op.name} [{op.site or 'no LLM'}] {op.id}"``."""
    return f"{op.name} [{op.site or 'no LLM'}] {op.id}"


def span_type(op: Operation) -> str:
    """The MLflow span type of an operation."""
    if op.site is not None:
        return SpanType.LLM
    if op.category == "retrieve":
        return SpanType.RETRIEVER
    if op.category == "ingest":
        return getattr(SpanType, "MEMORY", SpanType.CHAIN)
    if op.category == "judge":
        return getattr(SpanType, "EVALUATOR", SpanType.CHAIN)
    return SpanType.CHAIN


def _texts(graph: ExecutionGraph, ids: Sequence[str]) -> dict[str, str]:
    return {vid: _cut(graph.variables[vid].text) if vid in graph.variables else "" for vid in ids}


def _op_attributes(op: Operation, decisive: bool) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "op_id": op.id,
        "op_name": op.name,
        "category": op.category,
        "seq": op.seq,
        "site": op.site,
        "knobs": op.knobs or None,
        "session_id": op.session_id,
        "question_id": op.question_id,
        "comment": op.comment or None,
        "error": op.error,
        "llm_calls": op.llm_calls,
        "retries": op.retries,
        "seconds": op.seconds,
        "lm_attempts": op.lm_attempts or None,
        "lm_faults": op.lm_faults or None,
        "lm_error": op.lm_error,
    }
    if decisive:
        attributes["decisive"] = True
    return {k: v for k, v in attributes.items() if v is not None}


def _prediction(graph: ExecutionGraph, ops: Sequence[Operation], question_id: str) -> str:
    answers = [
        vid
        for op in ops
        if op.question_id == question_id and op.category == "answer"
        for vid in op.outputs
    ]
    answers = [
        vid for vid in answers if vid in graph.variables and graph.variables[vid].cls == "answer"
    ] or answers
    return graph.variables[answers[-1]].text if answers and answers[-1] in graph.variables else ""


def _verdict(
    graph: ExecutionGraph, question_id: str, attribution: Mapping[str, Any]
) -> dict[str, Any]:
    """passed / error_type / blamed_op_id / site / explanation from a lenient attribution dict."""
    error_type = _first(attribution, "final_error_type", "error_type")
    passed = attribution.get("passed")
    if passed is None and attribution:
        passed = error_type is None or str(error_type).strip().lower() in _NO_ERROR
    blamed = _first(attribution, "final_op_id", "blamed_op_id", "op_id")
    site = _first(attribution, "site")
    if site is None and blamed is not None:
        op = next((op for op in graph.operations if op.id == blamed), None)
        site = op.site if op is not None else None
    if blamed is not None and not any(op.id == blamed for op in graph.operations):
        logger.warning(
            "question %s: blamed op %r is not an operation of the graph", question_id, blamed
        )
    return {
        "passed": None if passed is None else bool(passed),
        "error_type": error_type,
        "blamed_op_id": blamed,
        "site": site,
        "explanation": _first(attribution, "explanation"),
    }


def log_question_trace(
    graph: ExecutionGraph,
    question_id: str,
    *,
    attribution: Mapping[str, Any] | None = None,
    experiment_id: str | None = None,
    flush: bool = True,
) -> str | None:
    """Log one MLflow trace for ``question_id``; its trace id, or None when nothing was logged.

    Logs to the current tracking URI (see :func:`tracking_uri` for optloop's)
    and ``experiment_id`` (default: the active experiment). Nothing is logged,
    and None returned, when the graph knows nothing of the question or MLflow
    tracing is disabled. ``flush`` waits for MLflow's asynchronous trace writer
    so the trace can be read back at once.
    """
    attribution = dict(attribution or {})
    qvar = question_variable(graph, question_id)
    own = graph.question_ops(question_id)
    if qvar is None and not own:
        logger.warning(
            "question %s: no question variable and no operation in the graph; no trace logged",
            question_id,
        )
        return None
    evidence = evidence_variables(
        graph, question_id, _as_list(_first(attribution, "source_evidence_ids", "evidence_ids"))
    )
    ops = question_operations(graph, question_id, evidence)
    verdict = _verdict(graph, question_id, attribution)
    gold = _first(attribution, "golden_answers", "gold")
    if gold is None and qvar is not None and isinstance(qvar.data, Mapping):
        gold = qvar.data.get("gold")
    prediction = _first(attribution, "prediction")
    if prediction is None:
        prediction = _prediction(graph, ops, question_id)
    question = qvar.text if qvar is not None else str(attribution.get("query") or "")

    tags = {
        f"{TAG_PREFIX}question_id": question_id,
        f"{TAG_PREFIX}system": graph.system,
        f"{TAG_PREFIX}error_type": str(verdict["error_type"] or "none"),
        f"{TAG_PREFIX}episode_id": graph.episode_id,
        f"{TAG_PREFIX}dataset": graph.dataset,
    }
    if verdict["passed"] is not None:
        tags[f"{TAG_PREFIX}passed"] = str(verdict["passed"]).lower()
    if verdict["blamed_op_id"] is not None:
        tags[f"{TAG_PREFIX}blamed_op_id"] = str(verdict["blamed_op_id"])
    root_attributes = {
        k: v
        for k, v in {
            "question_id": question_id,
            "system": graph.system or None,
            "episode_id": graph.episode_id or None,
            **verdict,
            "evidence": evidence or None,
        }.items()
        if v is not None
    }

    cursor = time.time_ns()
    root = mlflow.start_span_no_context(
        f"question {question_id}",
        span_type=SpanType.CHAIN,
        inputs={"question_id": question_id, "question": _cut(question)},
        attributes=root_attributes,
        tags=tags,
        experiment_id=experiment_id,
        start_time_ns=cursor,
    )
    if isinstance(root, NoOpSpan) or not isinstance(root, LiveSpan):
        logger.warning(
            "question %s: MLflow tracing is disabled or failed to start; no trace logged",
            question_id,
        )
        return None
    status = "OK"
    try:
        for op in ops:
            end = cursor + max(int(op.seconds * 1e9), 1000)
            child = mlflow.start_span_no_context(
                span_name(op),
                span_type=span_type(op),
                parent_span=root,
                inputs=_texts(graph, op.inputs),
                attributes=_op_attributes(op, op.id == verdict["blamed_op_id"]),
                start_time_ns=cursor,
            )
            failed = op.error is not None and not op.outputs
            child.end(
                outputs=_texts(graph, op.outputs),
                status="ERROR" if failed else "OK",
                end_time_ns=end,
            )
            cursor = end
    except Exception:
        status = "ERROR"
        raise
    finally:
        root.end(
            outputs={"prediction": _cut(str(prediction)), "gold": gold},
            status=status,
            end_time_ns=cursor,
        )
        if flush:
            mlflow.flush_trace_async_logging()
    logger.info(
        "question %s: trace %s with %d operation span(s)", question_id, root.trace_id, len(ops)
    )
    return root.trace_id


def log_graph_traces(
    graph: ExecutionGraph,
    question_ids: Iterable[str],
    attributions: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    experiment_id: str | None = None,
) -> list[str]:
    """One trace per question (see :func:`log_question_trace`); the ids of the traces logged."""
    attributions = attributions or {}
    trace_ids: list[str] = []
    for qid in question_ids:
        trace_id = log_question_trace(
            graph, qid, attribution=attributions.get(qid), experiment_id=experiment_id, flush=False
        )
        if trace_id is not None:
            trace_ids.append(trace_id)
    mlflow.flush_trace_async_logging()
    return trace_ids


__all__ = [
    "TEXT_LIMIT",
    "evidence_variables",
    "log_graph_traces",
    "log_question_trace",
    "question_operations",
    "question_variable",
    "span_name",
    "span_type",
    "tracking_uri",
]
