"""The execution graph: variables and operations linked by data flow.

A run of a memory system over one episode becomes one :class:`ExecutionGraph`:

* a :class:`Variable` is a value at one version: a message of the conversation,
  a prompt, what an extraction returned, a memory unit as stored (each change
  is a new version of the same name), the list a retrieval returned, an answer.
  Its id is ``class:name@version`` (the MemTraceBench convention), e.g.
  ``message:s1:t2@0`` or ``memory:3f2a…@1``. Memory units carry their
  *provenance*: the ids of the message variables they came from.
* an :class:`Operation` consumed some variables and produced others: an LLM call
  of a prompt site (``extract``, ``curate``, ``rewrite``, ``answer`` …) or a
  non-LLM step of the library (``store``, ``update``, ``delete``, ``retrieve``).
  It knows its prompt site (or, for non-LLM steps, the knobs it ran under), the
  session or question it belongs to, the order it ran in (``seq``), and any LM
  fault it hit.

The JSON form is :meth:`ExecutionGraph.to_json` with ``"schema":
"optloop.graph/1"``; ``docs/graph-schema.md`` documents it field by field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

SCHEMA = "optloop.graph/1"

Category = Literal["ingest", "retrieve", "answer", "judge"]
Status = Literal["live", "deleted", "invalidated"]


def var_id(cls: str, name: str, version: int = 0) -> str:
    """``class:name@version``, the id every variable is known by."""
    return f"{cls}:{name}@{version}"


class Variable(BaseModel):
    """One value at one version."""

    id: str
    cls: str = Field(
        description="message | prompt | fact | memory | question | query | retrieved | answer"
    )
    name: str
    version: int = 0
    text: str = Field("", description="the value as text (what judges read)")
    data: Any = Field(None, description="the structured value, when there is one")
    session_id: str | None = None
    question_id: str | None = None
    timestamp: str | None = None
    provenance: list[str] = Field(
        default_factory=list, description="ids of the message variables it came from"
    )
    status: Status = "live"

    @classmethod
    def make(cls, kind: str, name: str, version: int = 0, **fields: Any) -> Variable:
        return cls(id=var_id(kind, name, version), cls=kind, name=name, version=version, **fields)


class Operation(BaseModel):
    """One step that consumed ``inputs`` and produced ``outputs`` (variable ids)."""

    id: str
    name: str = Field(
        description="extract | curate | update | delete | store | rewrite | retrieve | rerank | "
        "answer"
    )
    category: Category
    seq: int
    site: str | None = Field(None, description="the prompt site that made this LLM call")
    knobs: dict[str, Any] = Field(
        default_factory=dict, description="knob values a non-LLM step ran under"
    )
    session_id: str | None = None
    question_id: str | None = None
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    comment: str = ""
    error: str | None = Field(None, description="the LM fault this call hit (retried or not)")
    llm_calls: int = 0
    retries: int = 0
    seconds: float = 0.0
    lm_attempts: int = Field(
        0, description="requests the model was sent (cache hits are none; a retry is one more)"
    )
    lm_faults: list[str] = Field(
        default_factory=list,
        description="each failed attempt, in order: 'HTTP 503', 'timeout', 'body truncated', ...'",
    )
    lm_error: str | None = Field(
        None, description="the LM error that outlasted the retries (None: every fault cured)"
    )


class ExecutionGraph(BaseModel):
    """Variables and operations of one system run over one episode."""

    schema_: str = Field(SCHEMA, alias="schema")
    system: str = ""
    episode_id: str = ""
    dataset: str = ""
    variables: dict[str, Variable] = Field(default_factory=dict)
    operations: list[Operation] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    model_config = {"populate_by_name": True}

    # --- building -------------------------------------------------------------------------

    def add_variable(self, variable: Variable) -> Variable:
        existing = self.variables.get(variable.id)
        if existing is not None:
            return existing  # a value is recorded once; later ops only link to it
        self.variables[variable.id] = variable
        return variable

    def add_operation(
        self,
        name: str,
        category: Category,
        *,
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
        **fields: Any,
    ) -> Operation:
        seq = len(self.operations)
        inputs, outputs = list(inputs), list(outputs)
        for vid in (*inputs, *outputs):
            if vid not in self.variables:
                raise KeyError(f"operation {name}: unknown variable {vid}")
        op = Operation(
            id=f"op{seq:05d}",
            name=name,
            category=category,
            seq=seq,
            inputs=inputs,
            outputs=outputs,
            **fields,
        )
        self.operations.append(op)
        return op

    def add_removal(
        self,
        sources: Iterable[str],
        removed: Iterable[Variable],
        tombstones: Iterable[Variable],
        *,
        session_id: str,
    ) -> Operation | None:
        """One ``delete`` operation for a session's removed memory units (``None`` when there are
        none): it reads the session's ``sources`` and each unit's last version, and writes its
        tombstone (the deleted version). The recorder and the MEME trace importer both end a
        session's store changes with it."""
        olds, tombs = [v.id for v in removed], [v.id for v in tombstones]
        if not olds:
            return None
        return self.add_operation(
            "delete",
            "ingest",
            inputs=[*sources, *olds],
            outputs=tombs,
            knobs={"session": session_id},
            session_id=session_id,
            comment=f"{len(olds)} memory unit(s) removed",
        )

    def next_version(self, cls: str, name: str) -> int:
        versions = self.versions(cls, name)
        return versions[-1].version + 1 if versions else 0

    # --- reading --------------------------------------------------------------------------

    def op(self, op_id: str) -> Operation:
        seq = int(op_id[2:]) if op_id[2:].isdigit() else -1
        if 0 <= seq < len(self.operations) and self.operations[seq].id == op_id:
            return self.operations[seq]
        return self._ops_by_id()[op_id]

    def _ops_by_id(self) -> dict[str, Operation]:
        return {op.id: op for op in self.operations}

    def edges(self) -> Iterator[tuple[str, str, str]]:
        """``(op_id, source, target)`` for every data-flow edge: input var -> op, op -> output
        var."""
        for op in self.operations:
            for vid in op.inputs:
                yield op.id, vid, op.id
            for vid in op.outputs:
                yield op.id, op.id, vid

    def consumers(self, vid: str) -> list[Operation]:
        return [op for op in self.operations if vid in op.inputs]

    def versions(self, cls: str, name: str) -> list[Variable]:
        return sorted(
            (v for v in self.variables.values() if v.cls == cls and v.name == name),
            key=lambda v: v.version,
        )

    def latest(self, cls: str, name: str) -> Variable | None:
        versions = self.versions(cls, name)
        return versions[-1] if versions else None

    def descendants(self, vid: str) -> set[str]:
        """Every variable reachable from ``vid`` along data flow."""
        by_input: dict[str, list[Operation]] = {}
        for op in self.operations:
            for i in op.inputs:
                by_input.setdefault(i, []).append(op)
        seen: set[str] = set()
        todo = [vid]
        while todo:
            for op in by_input.get(todo.pop(), ()):
                for out in op.outputs:
                    if out not in seen:
                        seen.add(out)
                        todo.append(out)
        return seen

    def ancestors(self, vid: str) -> set[str]:
        """Every variable ``vid`` was computed from."""
        producers = {out: op for op in self.operations for out in op.outputs}
        seen: set[str] = set()
        todo = [vid]
        while todo:
            op = producers.get(todo.pop())
            if op is None:
                continue
            for i in op.inputs:
                if i not in seen:
                    seen.add(i)
                    todo.append(i)
        return seen

    def by_cls(self, cls: str) -> list[Variable]:
        return [v for v in self.variables.values() if v.cls == cls]

    def question_ops(self, question_id: str) -> list[Operation]:
        return [op for op in self.operations if op.question_id == question_id]

    def faulted_ops(self) -> list[Operation]:
        """Operations whose LM calls hit a fault, cured by a retry or not."""
        return [op for op in self.operations if op.lm_faults or op.lm_error]

    # --- combining ------------------------------------------------------------------------

    def absorb(self, other: ExecutionGraph, since: int) -> list[Operation]:
        """Append ``other``'s operations from ``since`` on (and the variables they touch) to this
        graph.

        ``other`` is this graph's state at ``since`` operations plus more recording (a
        :meth:`Recorder.resume` copy that asked one question): the new operations get the
        next ids here, so several such copies fold into one graph. Returns them.
        """
        for vid, var in other.variables.items():
            self.variables.setdefault(vid, var)
        self.meta.update(other.meta)
        added = []
        for op in other.operations[since:]:
            fields = op.model_dump(exclude={"id", "seq", "name", "category", "inputs", "outputs"})
            added.append(
                self.add_operation(
                    op.name, op.category, inputs=op.inputs, outputs=op.outputs, **fields
                )
            )
        return added

    # --- JSON -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecutionGraph:
        schema = data.get("schema")
        if schema != SCHEMA:
            from optloop.errors import DatasetError

            raise DatasetError(f"execution graph: schema {schema!r} is not {SCHEMA!r}")
        return cls.model_validate(data)

    def save(self, path: Path) -> Path:
        from optloop.paths import write_atomic

        return write_atomic(path, json.dumps(self.to_json(), ensure_ascii=False, indent=1))

    @classmethod
    def load(cls, path: Path) -> ExecutionGraph:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            from optloop.errors import DatasetError

            raise DatasetError(f"{path}: not a readable graph JSON ({exc})") from None
        return cls.from_json(data)
