"""Read and write execution graphs in the MemTraceBench / smartcomment JSON layout.

The layout is one JSON object, ``{"data": {"nodes", "edges", "operations", "sessions",
"annotations", "meta"}}``: a node is a :class:`Variable` (``full_node_id`` is its id), an
operation an :class:`Operation`, an edge one of :meth:`ExecutionGraph.edges`, an annotation a
question's verdict. optloop's fields that MemTraceBench has no column for travel under ``meta``,
so a round trip graph -> MemTraceBench -> graph is lossless (``==`` on the models); files written
by others need no ``meta`` and survive a round trip too (what the models have no field for is kept
in ``graph.meta["memtrace"]``). Malformed input raises :class:`~optloop.errors.DatasetError` with
a one-line message naming the record and the field. Every field: ``docs/graph-schema.md``
("MemTraceBench layout").
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from optloop.errors import DatasetError
from optloop.paths import write_atomic
from optloop.tracing.graph import SCHEMA, Category, ExecutionGraph, Operation, Variable

logger = logging.getLogger(__name__)

FORMAT = "optloop.memtrace/1"
#: Key of ``ExecutionGraph.meta`` holding what a foreign file carried beyond our models.
MEMTRACE_KEY = "memtrace"

CATEGORIES: tuple[str, ...] = get_args(Category)
NODE_KEYS = ("full_node_id", "class", "name", "version", "content", "meta")
OP_KEYS = ("op_id", "op_name", "category", "comment", "meta")
NODE_META_FIELDS = ("data", "session_id", "question_id", "timestamp", "provenance", "status")
OP_META_FIELDS = (
    "seq",
    "site",
    "knobs",
    "session_id",
    "question_id",
    "error",
    "llm_calls",
    "retries",
    "seconds",
)
ANNOTATION_DEFAULTS: dict[str, Any] = {
    "query_id": None,
    "query": "",
    "golden_answers": [],
    "prediction": "",
    "source_evidence_ids": [],
    "final_error_type": None,
    "final_op_id": None,
}

_NODE_ID = re.compile(r"^(?P<cls>[^:@]+):(?P<name>.+)@(?P<version>\d+)$")


# --- errors -------------------------------------------------------------------------------


def _error(source: str, where: str | None, field: str | None, problem: str) -> DatasetError:
    """``<source>: <where>: field '<field>': <problem>`` as a DatasetError (one line)."""
    parts = [source]
    if where:
        parts.append(where)
    if field:
        parts.append(f"field '{field}'")
    return DatasetError(": ".join(parts) + f": {problem}")


def _validation_error(
    source: str, where: str, exc: ValidationError, prefix: str = ""
) -> DatasetError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return _error(
        source,
        where,
        f"{prefix}{field}" if field else prefix.rstrip(".") or None,
        first["msg"] + more,
    )


def parse_node_id(node_id: str) -> tuple[str, str, int]:
    """Split ``class:name@version`` into its parts; ``ValueError`` when it is not of that form."""
    match = _NODE_ID.match(node_id)
    if match is None:
        raise ValueError(f"{node_id!r} is not class:name@version")
    return match["cls"], match["name"], int(match["version"])


def map_category(category: str) -> Category:
    """Our category for a foreign category string (``ingest`` when nothing fits)."""
    if category in CATEGORIES:
        return category  # type: ignore[return-value]
    low = category.lower()
    if "retriev" in low or "search" in low or "recall" in low:
        return "retrieve"
    if "answer" in low or "respon" in low or "generat" in low:
        return "answer"
    if "judg" in low or "eval" in low:
        return "judge"
    return "ingest"


# --- export -------------------------------------------------------------------------------


def _sessions(graph: ExecutionGraph) -> list[dict[str, Any]]:
    """One record per session of the ``message`` variables, in order of first appearance."""
    sessions: dict[str, dict[str, Any]] = {}
    for var in graph.variables.values():
        if var.cls != "message" or var.session_id is None:
            continue
        record = sessions.setdefault(
            var.session_id, {"session_id": var.session_id, "timestamp": None, "message_ids": []}
        )
        if record["timestamp"] is None:
            record["timestamp"] = var.timestamp
        record["message_ids"].append(var.id)
    return list(sessions.values())


def normalize_annotation(
    annotation: Mapping[str, Any], *, source: str = "memtrace", where: str = "annotation"
) -> dict[str, Any]:
    """An annotation with every MemTraceBench key present (defaults filled), extra keys kept.

    ``golden_answers`` / ``source_evidence_ids`` given as one string become a
    one-item list. Raises :class:`DatasetError` when a field has the wrong type.
    """
    if not isinstance(annotation, Mapping):
        raise _error(source, where, None, f"expected an object, got {type(annotation).__name__}")
    out = {
        **{k: (list(v) if isinstance(v, list) else v) for k, v in ANNOTATION_DEFAULTS.items()},
        **annotation,
    }
    query_id = out["query_id"]
    if isinstance(query_id, int) and not isinstance(query_id, bool):
        out["query_id"] = query_id = str(query_id)
    if not isinstance(query_id, str) or not query_id:
        raise _error(source, where, "query_id", "missing or not a non-empty string")
    for key in ("golden_answers", "source_evidence_ids"):
        value = out[key]
        if value is None:
            value = []
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise _error(
                source,
                f"{where} ({query_id})",
                key,
                f"expected a list, got {type(value).__name__}",
            )
        out[key] = list(value)
    for key in ("query", "prediction"):
        if out[key] is None:
            out[key] = ""
        if not isinstance(out[key], str):
            raise _error(
                source,
                f"{where} ({query_id})",
                key,
                f"expected a string, got {type(out[key]).__name__}",
            )
    for key in ("final_error_type", "final_op_id"):
        if out[key] == "":
            out[key] = None
        if out[key] is not None and not isinstance(out[key], str):
            raise _error(
                source,
                f"{where} ({query_id})",
                key,
                f"expected a string or null, got {type(out[key]).__name__}",
            )
    return out


def to_memtrace(
    graph: ExecutionGraph, annotations: Iterable[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The MemTraceBench JSON form of ``graph`` (plus ``annotations``), JSON-ready."""
    # JSON-safe values (data, knobs) without re-implementing pydantic's dump
    dumped = graph.to_json()
    kept: dict[str, Any] = graph.meta.get(MEMTRACE_KEY) or {}
    node_extra: dict[str, dict[str, Any]] = kept.get("node_extra") or {}
    op_extra: dict[str, dict[str, Any]] = kept.get("op_extra") or {}
    foreign_categories: dict[str, str] = kept.get("categories") or {}

    nodes = []
    for vid, var in dumped["variables"].items():
        node = {
            "full_node_id": vid,
            "class": var["cls"],
            "name": var["name"],
            "version": var["version"],
            "content": var["text"],
            "meta": {k: var[k] for k in NODE_META_FIELDS},
        }
        for key, value in node_extra.get(vid, {}).items():
            node.setdefault(key, value)
        nodes.append(node)

    operations = []
    for op in dumped["operations"]:
        category = foreign_categories.get(op["id"], op["category"])
        meta = {k: op[k] for k in OP_META_FIELDS}
        if category != op["category"]:
            meta["category"] = op["category"]
        record = {
            "op_id": op["id"],
            "op_name": op["name"],
            "category": category,
            "comment": op["comment"],
            "meta": meta,
        }
        for key, value in op_extra.get(op["id"], {}).items():
            record.setdefault(key, value)
        operations.append(record)

    edges = [
        {"op_id": op_id, "source_full_node_id": source, "target_full_node_id": target}
        for op_id, source, target in graph.edges()
    ]
    sessions = kept.get("sessions") if kept.get("sessions") is not None else _sessions(graph)
    notes = [
        normalize_annotation(a, where=f"annotations[{i}]") for i, a in enumerate(annotations or [])
    ]
    graph_meta = {k: v for k, v in dumped["meta"].items() if k != MEMTRACE_KEY}
    logger.debug(
        "memtrace export: %d nodes, %d operations, %d edges, %d annotations",
        len(nodes),
        len(operations),
        len(edges),
        len(notes),
    )
    return {
        "data": {
            "nodes": nodes,
            "edges": edges,
            "operations": operations,
            "sessions": sessions,
            "annotations": notes,
            "meta": {
                "format": FORMAT,
                "schema": dumped["schema"],
                "system": graph.system,
                "episode_id": graph.episode_id,
                "dataset": graph.dataset,
                "graph_meta": graph_meta,
            },
        }
    }


# --- import -------------------------------------------------------------------------------


def _list(data: Mapping[str, Any], key: str, source: str, *, required: bool) -> list[Any]:
    value = data.get(key)
    if value is None:
        if required:
            raise _error(source, "data", key, "missing (expected a list)")
        return []
    if not isinstance(value, list):
        raise _error(source, "data", key, f"expected a list, got {type(value).__name__}")
    return value


def _ident(value: Any, source: str, where: str, field: str) -> str:
    """An id given as a non-empty string (ints are accepted and turned into strings)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise _error(source, where, field, "missing or not a non-empty string")
    return value


def _record(value: Any, source: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _error(source, where, None, f"expected an object, got {type(value).__name__}")
    return value


def _meta(record: dict[str, Any], source: str, where: str) -> dict[str, Any]:
    meta = record.get("meta")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _error(source, where, "meta", f"expected an object, got {type(meta).__name__}")
    return meta


def _node(i: int, record: Any, source: str) -> tuple[Variable, dict[str, Any]]:
    """One node as a Variable, plus its keys we have no field for."""
    record = _record(record, source, f"nodes[{i}]")
    node_id = _ident(record.get("full_node_id"), source, f"nodes[{i}]", "full_node_id")
    where = f"nodes[{i}] ({node_id})"
    try:
        cls, name, version = parse_node_id(node_id)
    except ValueError as exc:
        raise _error(source, where, "full_node_id", str(exc)) from None
    meta = _meta(record, source, where)
    extra = {k: v for k, v in record.items() if k not in NODE_KEYS}
    content = record.get("content", "")
    data = meta.get("data", extra.get("data"))
    if content is None:
        content = ""
    elif not isinstance(content, str):  # structured content: keep the value, show it as JSON text
        if data is None:
            data = content
        content = json.dumps(content, ensure_ascii=False, sort_keys=True)
    fields: dict[str, Any] = {
        f: meta[f] if f in meta else extra[f] for f in NODE_META_FIELDS if f in meta or f in extra
    }
    fields["data"] = data
    try:
        var = Variable(
            id=node_id,
            cls=record.get("class", cls),
            name=record.get("name", name),
            version=record.get("version", version),
            text=content,
            **fields,
        )
    except ValidationError as exc:
        raise _validation_error(source, where, exc) from None
    return var, extra


def _operation(i: int, record: Any, source: str) -> tuple[Operation, str | None, dict[str, Any]]:
    """One operation (no inputs/outputs yet), its foreign category (if mapped) and unknown keys."""
    record = _record(record, source, f"operations[{i}]")
    op_id = _ident(record.get("op_id"), source, f"operations[{i}]", "op_id")
    where = f"operations[{i}] ({op_id})"
    name = record.get("op_name")
    if not isinstance(name, str) or not name:
        raise _error(source, where, "op_name", "missing or not a non-empty string")
    raw_category = record.get("category") or "ingest"
    if not isinstance(raw_category, str):
        raise _error(
            source, where, "category", f"expected a string, got {type(raw_category).__name__}"
        )
    meta = _meta(record, source, where)
    category = meta.get("category", map_category(raw_category))
    foreign = raw_category if raw_category != category else None
    extra = {k: v for k, v in record.items() if k not in OP_KEYS}
    fields = {f: meta[f] for f in OP_META_FIELDS if f in meta}
    fields.setdefault("seq", i)
    comment = record.get("comment")
    try:
        op = Operation(
            id=op_id,
            name=name,
            category=category,
            comment="" if comment is None else comment,
            **fields,
        )
    except ValidationError as exc:
        raise _validation_error(source, where, exc) from None
    return op, foreign, extra


def _link(
    i: int,
    record: Any,
    source: str,
    variables: Mapping[str, Variable],
    ops: Mapping[str, Operation],
) -> None:
    """Append one edge to its operation's inputs or outputs."""
    record = _record(record, source, f"edges[{i}]")
    src = _ident(record.get("source_full_node_id"), source, f"edges[{i}]", "source_full_node_id")
    dst = _ident(record.get("target_full_node_id"), source, f"edges[{i}]", "target_full_node_id")
    if record.get("op_id") is None:  # lenient: infer the op from whichever end is one
        op_id = src if src in ops else dst
    else:
        op_id = _ident(record.get("op_id"), source, f"edges[{i}]", "op_id")
    where = f"edges[{i}] (op {op_id})"
    op = ops.get(op_id)
    if op is None:
        raise _error(source, where, "op_id", f"{op_id!r} is not an operation")
    if dst == op_id and src != op_id:
        if src not in variables:
            raise _error(source, where, "source_full_node_id", f"{src!r} is not a node")
        op.inputs.append(src)
    elif src == op_id and dst != op_id:
        if dst not in variables:
            raise _error(source, where, "target_full_node_id", f"{dst!r} is not a node")
        op.outputs.append(dst)
    else:
        raise _error(
            source,
            where,
            "source_full_node_id",
            f"neither end is the operation alone ({src!r} -> {dst!r})",
        )


def _apply_sessions(
    sessions: list[Any], source: str, variables: dict[str, Variable]
) -> list[dict[str, Any]]:
    """Validate session records; give their messages a session id / timestamp they lack."""
    out = []
    for i, record in enumerate(sessions):
        record = _record(record, source, f"sessions[{i}]")
        session_id = _ident(record.get("session_id"), source, f"sessions[{i}]", "session_id")
        where = f"sessions[{i}] ({session_id})"
        message_ids = record.get("message_ids") or []
        if not isinstance(message_ids, list):
            raise _error(
                source, where, "message_ids", f"expected a list, got {type(message_ids).__name__}"
            )
        timestamp = record.get("timestamp")
        if timestamp is not None and not isinstance(timestamp, str):
            timestamp = str(timestamp)
        for mid in message_ids:
            var = variables.get(mid) if isinstance(mid, str) else None
            if var is None:
                raise _error(source, where, "message_ids", f"{mid!r} is not a node")
            if var.session_id is None:
                var.session_id = session_id
            if var.timestamp is None and timestamp is not None:
                var.timestamp = timestamp
        out.append({**record, "session_id": session_id})
    return out


def from_memtrace(
    data: Mapping[str, Any], *, source: str = "memtrace"
) -> tuple[ExecutionGraph, list[dict[str, Any]]]:
    """The graph and annotations of a MemTraceBench JSON object (ours or anyone's).

    ``source`` names the input in error messages (a path, say). Raises
    :class:`DatasetError` on malformed input.
    """
    if not isinstance(data, Mapping):
        raise _error(source, None, None, f"expected a JSON object, got {type(data).__name__}")
    body = data.get("data")
    if not isinstance(body, Mapping):
        raise _error(
            source,
            None,
            "data",
            'missing or not an object (expected {"data": {"nodes": [...], ...}})',
        )
    nodes = _list(body, "nodes", source, required=True)
    edges = _list(body, "edges", source, required=False)
    operations = _list(body, "operations", source, required=True)
    sessions = _list(body, "sessions", source, required=False)
    annotations = _list(body, "annotations", source, required=False)
    file_meta = body.get("meta") or {}
    if not isinstance(file_meta, Mapping):
        raise _error(source, "data", "meta", f"expected an object, got {type(file_meta).__name__}")

    variables: dict[str, Variable] = {}
    node_extra: dict[str, dict[str, Any]] = {}
    for i, record in enumerate(nodes):
        var, extra = _node(i, record, source)
        if var.id in variables:
            raise _error(source, f"nodes[{i}] ({var.id})", "full_node_id", "duplicate node id")
        variables[var.id] = var
        if extra:
            node_extra[var.id] = extra

    ops: dict[str, Operation] = {}
    categories: dict[str, str] = {}
    op_extra: dict[str, dict[str, Any]] = {}
    for i, record in enumerate(operations):
        op, foreign, extra = _operation(i, record, source)
        if op.id in ops:
            raise _error(source, f"operations[{i}] ({op.id})", "op_id", "duplicate operation id")
        if op.id in variables:
            raise _error(source, f"operations[{i}] ({op.id})", "op_id", "also used as a node id")
        ops[op.id] = op
        if foreign is not None:
            categories[op.id] = foreign
        if extra:
            op_extra[op.id] = extra

    for i, record in enumerate(edges):
        _link(i, record, source, variables, ops)

    session_records = _apply_sessions(sessions, source, variables)
    notes = [
        normalize_annotation(a, source=source, where=f"annotations[{i}]")
        for i, a in enumerate(annotations)
    ]
    for note in notes:
        if note["final_op_id"] is not None and note["final_op_id"] not in ops:
            logger.warning(
                "%s: annotation %s: final_op_id %r is not an operation of the graph",
                source,
                note["query_id"],
                note["final_op_id"],
            )

    graph_meta = file_meta.get("graph_meta") or {}
    if not isinstance(graph_meta, Mapping):
        raise _error(
            source,
            "data.meta",
            "graph_meta",
            f"expected an object, got {type(graph_meta).__name__}",
        )
    try:
        graph = ExecutionGraph(
            schema=file_meta.get("schema") or SCHEMA,
            system=file_meta.get("system") or "",
            episode_id=file_meta.get("episode_id") or "",
            dataset=file_meta.get("dataset") or "",
            variables=variables,
            operations=list(ops.values()),
            meta=dict(graph_meta),
        )
    except ValidationError as exc:
        raise _validation_error(source, "data.meta", exc) from None

    kept: dict[str, Any] = {}
    if categories:
        kept["categories"] = categories
    if node_extra:
        kept["node_extra"] = node_extra
    if op_extra:
        kept["op_extra"] = op_extra
    if sessions and session_records != _sessions(graph):
        kept["sessions"] = session_records
    graph.meta.pop(MEMTRACE_KEY, None)
    if kept:
        graph.meta[MEMTRACE_KEY] = kept
    logger.debug(
        "memtrace import from %s: %d nodes, %d operations, %d edges, %d annotations",
        source,
        len(variables),
        len(ops),
        len(edges),
        len(notes),
    )
    return graph, notes


# --- files --------------------------------------------------------------------------------


def save_memtrace(
    path: str | Path, graph: ExecutionGraph, annotations: Iterable[Mapping[str, Any]] | None = None
) -> Path:
    """Write ``graph`` (and ``annotations``) as MemTraceBench JSON to ``path``, atomically."""
    path = Path(path)
    document = to_memtrace(graph, annotations)
    write_atomic(path, json.dumps(document, ensure_ascii=False, indent=1))
    logger.info(
        "wrote %s (%d nodes, %d operations)", path, len(graph.variables), len(graph.operations)
    )
    return path


def load_memtrace(path: str | Path) -> tuple[ExecutionGraph, list[dict[str, Any]]]:
    """Read a MemTraceBench JSON file: ``(graph, annotations)``; DatasetError when malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    return from_memtrace(data, source=str(path))


__all__ = [
    "FORMAT",
    "MEMTRACE_KEY",
    "from_memtrace",
    "load_memtrace",
    "map_category",
    "normalize_annotation",
    "parse_node_id",
    "save_memtrace",
    "to_memtrace",
]
