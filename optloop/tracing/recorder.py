"""Record a memory system's run as an :class:`ExecutionGraph`, without touching its code.

:class:`Recorder` watches a system ingest an episode session by session and answer its questions:
its prompt-site calls through a DSPy callback (:class:`SiteCallback`), its store by diffing
``all_memories()`` after each session, and retrieval and answering through :meth:`Recorder.ask`.
The active recorder lives in a :class:`contextvars.ContextVar`, so each thread records into its
own. :func:`record_episode` records a whole episode. The graph's layout:
``docs/graph-schema.md``; where recording sits in the pipeline: ``docs/architecture.md``.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dspy
from dspy.utils.callback import BaseCallback

from optloop.lm import CallRecord, Usage, current_site, start_collecting, stop_collecting
from optloop.sites import QUERY_REWRITE
from optloop.text import words
from optloop.tracing.graph import Category, ExecutionGraph, Operation, Variable
from signatures._layout import jsonable

if TYPE_CHECKING:
    from optloop.datasets import Episode, Question, Session
    from systems.base import MemoryItem, MemorySystem

logger = logging.getLogger(__name__)

_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "optloop_recorder", default=None
)
_ATTACH_LOCK = threading.Lock()
TEXT_LIMIT = 4000


def _text(value: Any) -> str:
    value = jsonable(value)
    if isinstance(value, str):
        return value
    import json

    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def question_variable(question: Question) -> Variable:
    """The ``question`` variable of an asked question: its text, gold, evidence and task type."""
    return Variable.make(
        "question",
        question.id,
        text=question.question,
        question_id=question.id,
        data={
            "gold": question.gold,
            "evidence_ids": list(question.evidence_ids),
            "task_type": question.task_type,
        },
    )


def similar(a: str, b: str) -> float:
    """Token Jaccard similarity: the cheap test of "the same fact, reworded"."""
    ta, tb = set(words(a)), set(words(b))
    return len(ta & tb) / len(ta | tb) if ta and tb else 0.0


def lm_fault_fields(records: Sequence[CallRecord]) -> dict[str, Any]:
    """``lm_attempts``, ``lm_faults``, ``lm_error`` of an operation from the LM calls made inside
    it."""
    faults = [fault for rec in records for fault in rec.faults]
    error = next((rec.error for rec in reversed(records) if rec.error), None)
    return {
        "lm_attempts": sum(rec.attempts for rec in records if not rec.cached),
        "lm_faults": faults,
        "lm_error": error[:500] if error else None,
    }


def active_recorder() -> Recorder | None:
    """The recorder active in this context (thread), if any."""
    return _ACTIVE.get()


class SiteCallback(BaseCallback):
    """Forwards every prompt-site call to the :class:`Recorder` active in the calling context (if
    any).

    The recorder is found in a :class:`contextvars.ContextVar`: each thread (an optimizer's
    worker, say) records into its own recorder, and calls made on graphiti's own event-loop
    thread, which runs in a copy of the caller's context, are seen by the caller's recorder. It
    holds no state (a call's start is kept by the recorder), so a deep-copied module (an
    optimizer's candidate) may carry a copy of it.
    """

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        recorder = _ACTIVE.get()
        if recorder is not None and isinstance(instance, dspy.Predict):
            recorder._call_started(call_id, dict(inputs.get("kwargs") or inputs))

    def on_module_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        recorder = _ACTIVE.get()
        if recorder is not None:
            recorder._call_ended(call_id, outputs, exception)


SITE_CALLBACK = SiteCallback()


class Recorder:
    """Runs a system over an episode and records the execution graph.

    Two sources feed the graph:

    * **prompt-site calls**, through :class:`SiteCallback` on every site's ``dspy.Predict``: each
      call becomes an LLM operation with its prompt, inputs and outputs (list outputs of an
      ingest site become one ``fact`` variable per item), its LLM calls and retries, and, from
      the LM layer's records of the calls made inside it, ``lm_attempts``, ``lm_faults`` and
      ``lm_error`` (:func:`lm_fault_fields`). Those calls are collected in the site call's own
      context (an accounting listener), so calls of other threads never count;
    * **the store**, observed from outside: after each session (:meth:`ingest_session`) the
      recorder diffs ``all_memories()`` against the state before it (:meth:`_diff_store`).

    :meth:`ask` records retrieval and answering. Ingestion goes session by session
    (``system.ingest([session])``); every system in ``systems/`` supports incremental ingestion.

    Use as a context manager (one recorder is active per context: a thread records into its own)::

        with Recorder(system, episode) as rec:
            rec.ingest(episode.sessions)
            prediction = rec.ask(question)
        rec.graph.save(path)
    """

    def __init__(
        self,
        system: MemorySystem,
        episode: Episode | None = None,
        *,
        dataset: str = "",
        wide_k: int = 20,
    ):
        self.system = system
        self.graph = ExecutionGraph(
            system=system.name, episode_id=episode.id if episode else "", dataset=dataset
        )
        self.wide_k = wide_k
        self._scope: dict[str, Any] = {"category": "ingest", "inputs": []}
        self._scope_ops: list[str] = []
        self._memory: dict[str, Variable] = {}  # memory id -> latest version
        self._prompts: dict[tuple[str, str], str] = {}
        self._starts: dict[
            str, tuple[str | None, dict[str, Any], float, list[CallRecord], contextvars.Token[Any]]
        ] = {}
        self._lock = threading.Lock()
        # per thread, the ContextVar tokens of this recorder's activations
        self._tokens = threading.local()
        self.graph.meta["sites"] = {}
        self.graph.meta["knobs"] = {}

    @classmethod
    def resume(cls, system: MemorySystem, graph: ExecutionGraph) -> Recorder:
        """Go on recording on a copy of ``graph`` (a cached ingestion), e.g. to ask questions."""
        recorder = cls(system)
        recorder.graph = graph.model_copy(deep=True)
        recorder._memory = {
            v.name: v for v in sorted(recorder.graph.by_cls("memory"), key=lambda v: v.version)
        }
        recorder._prompts = {
            (v.name, (v.data or {}).get("sha1", "")): v.id for v in recorder.graph.by_cls("prompt")
        }
        return recorder

    # --- activation -----------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        active = _ACTIVE.get()
        if active is not None and active is not self:
            raise RuntimeError("another Recorder is active in this context")
        tokens = self._tokens.__dict__.setdefault("stack", [])
        tokens.append(_ACTIVE.set(self))
        self._attach()
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self._tokens.stack.pop())

    def _attach(self) -> None:
        """Hook the callback into every site (sites can appear later: rerank, query)."""
        for name, site in self.system.prompt_sites().items():
            with _ATTACH_LOCK:  # one module may serve systems recording in several threads
                if not any(isinstance(cb, SiteCallback) for cb in site.module.callbacks):
                    site.module.callbacks.append(SITE_CALLBACK)
            self.graph.meta["sites"][name] = {
                "stage": site.stage,
                "op_kinds": list(site.op_kinds),
                "changed": site.changed,
            }
        self.graph.meta["knobs"] = jsonable(self.system.knobs())
        self.graph.meta["search_knob"] = self.system.search_knob
        kinds = self.system.retrievable_kinds()
        self.graph.meta["retrievable_kinds"] = sorted(kinds) if kinds is not None else None

    @contextmanager
    def _scoped(self, category: Category, inputs: list[str], **ids: Any) -> Iterator[list[str]]:
        """Site calls inside this block consume ``inputs`` (and earlier calls' outputs in the
        block)."""
        self._attach()
        self._scope = {"category": category, "inputs": list(inputs), **ids}
        self._scope_ops = []
        try:
            yield self._scope_ops
        finally:
            self._scope = {"category": "ingest", "inputs": []}

    # --- site calls (from the callback) ---------------------------------------------------

    def _call_started(self, call_id: str, inputs: dict[str, Any]) -> None:
        # The LM calls made inside this site call, in this context only (a nested site call's are
        # ours too).
        records, token = start_collecting()
        with self._lock:
            self._starts[call_id] = (current_site(), inputs, time.perf_counter(), records, token)

    def _call_ended(self, call_id: str, outputs: Any | None, exception: Exception | None) -> None:
        with self._lock:
            start = self._starts.pop(call_id, None)
        if start is None:
            return
        site, inputs, started, records, token = start
        stop_collecting(token)
        self._site_call(site, inputs, outputs, exception, time.perf_counter() - started, records)

    def _prompt_var(self, site: str) -> str:
        sites = self.system.prompt_sites()
        instructions = sites[site].instructions if site in sites else ""
        digest = hashlib.sha1(instructions.encode()).hexdigest()[:10]
        key = (site, digest)
        if key not in self._prompts:
            version = self.graph.next_version("prompt", site)
            var = self.graph.add_variable(
                Variable.make(
                    "prompt", site, version, text=instructions[:TEXT_LIMIT], data={"sha1": digest}
                )
            )
            self._prompts[key] = var.id
        return self._prompts[key]

    def _site_call(
        self,
        site: str | None,
        inputs: dict[str, Any],
        outputs: Any,
        exception: Exception | None,
        seconds: float,
        records: list[CallRecord],
    ) -> None:
        with self._lock:
            scope = self._scope
            category: Category = scope["category"]
            usage = Usage()
            for record in records:
                usage.add(record)
            op_inputs = list(scope["inputs"])
            for op_id in self._scope_ops:  # data flows from earlier calls of the same session
                op_inputs += self.graph.op(op_id).outputs
            name = site or "unknown"
            if site is not None:
                op_inputs.append(self._prompt_var(site))
            seq = len(self.graph.operations)
            outputs_ids: list[str] = []
            if outputs is not None:
                outputs_ids = self._output_vars(f"op{seq:05d}", name, category, outputs, scope)
            kinds = self.graph.meta["sites"].get(name, {}).get("op_kinds") or [category]
            op = self.graph.add_operation(
                kinds[0],
                category,
                inputs=dict.fromkeys(op_inputs),
                outputs=outputs_ids,
                site=name,
                session_id=scope.get("session_id"),
                question_id=scope.get("question_id"),
                comment=f"LLM call of prompt site {name}",
                error=None
                if exception is None
                else f"{type(exception).__name__}: {exception}"[:500],
                llm_calls=usage.calls,
                retries=usage.retries,
                seconds=round(seconds, 4),
                **lm_fault_fields(records),
            )
            if op.lm_faults and op.error is None:
                op.error = (
                    f"{len(op.lm_faults)} LM attempt(s) failed ({', '.join(op.lm_faults)}); "
                    + ("cured by retry" if op.lm_error is None else op.lm_error)
                )[:500]
            self._scope_ops.append(op.id)

    def _output_vars(
        self, op_id: str, site: str, category: Category, outputs: Any, scope: dict[str, Any]
    ) -> list[str]:
        fields = dict(outputs.items()) if hasattr(outputs, "items") else {"output": outputs}
        cls = {"ingest": "fact", "retrieve": "query", "answer": "answer"}.get(category, "value")
        ids: list[str] = []
        for field_name, value in fields.items():
            items = value if isinstance(value, list) and category == "ingest" else [value]
            for i, item in enumerate(items):
                name = f"{op_id}.{field_name}" + (
                    f".{i}" if len(items) > 1 or isinstance(value, list) else ""
                )
                if category != "ingest" and scope.get("question_id"):
                    name = f"{scope['question_id']}.{field_name}"
                var = self.graph.add_variable(
                    Variable.make(
                        cls,
                        name,
                        self.graph.next_version(cls, name),
                        text=_text(item)[:TEXT_LIMIT],
                        data=jsonable(item),
                        session_id=scope.get("session_id"),
                        question_id=scope.get("question_id"),
                    )
                )
                ids.append(var.id)
        return ids

    # --- ingestion ------------------------------------------------------------------------

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            self.ingest_session(session)

    def ingest_session(self, session: Session) -> None:
        """Ingest one session (``system.ingest([session])``): its turns as ``message`` variables,
        the site calls it makes, then the changes to the store."""
        messages = []
        for turn in session.turns:
            var = self.graph.add_variable(
                Variable.make(
                    "message",
                    turn.id,
                    text=f"{turn.speaker or turn.role}: {turn.content}",
                    session_id=session.id,
                    timestamp=session.timestamp,
                    data={"role": turn.role, "speaker": turn.speaker},
                )
            )
            messages.append(var.id)
        with self._scoped("ingest", messages, session_id=session.id) as ops:
            self.system.ingest([session])
        facts = [out for op_id in ops for out in self.graph.op(op_id).outputs]
        self._diff_store(session, messages, facts or messages)

    def _diff_store(self, session: Session, messages: list[str], sources: list[str]) -> None:
        """The store's changes in ``session``: new units become ``store`` operations, changed or
        invalidated ones ``update``, vanished ones ``delete``. A unit that vanishes in the same
        session a near-identical one appears (a system that keys facts by their text, like
        MD-flat) is recorded as an update of the old unit into the new one, which is what it is."""
        after = {item.id: item for item in self.system.all_memories()}
        added, updated = [], []
        for mid, item in after.items():
            status = (
                "invalidated"
                if item.metadata.get("invalid_at") or item.metadata.get("expired_at")
                else "live"
            )
            old = self._memory.get(mid)
            if old is None:
                added.append((mid, item, status))
            elif old.text != item.text or old.status != status:
                updated.append((mid, item, status))
        removed = [
            mid
            for mid, var in self._memory.items()
            if mid not in after and var.status != "deleted"
        ]
        store_inputs = list(dict.fromkeys(sources))
        knobs = {"session": session.id}

        new_vars = {
            mid: self._memory_var(mid, item, status, session, messages)
            for mid, item, status in added
        }
        # A unit replaced by a near-identical new one (text-keyed stores) is an update, not
        # delete + add.
        rewritten: dict[str, str] = {}
        for old_id in removed:
            old_text = self._memory[old_id].text
            best = max(new_vars, key=lambda m: similar(old_text, new_vars[m].text), default=None)
            if (
                best is not None
                and best not in rewritten.values()
                and similar(old_text, new_vars[best].text) >= 0.5
            ):
                rewritten[old_id] = best
        plain_new = [v.id for m, v in new_vars.items() if m not in rewritten.values()]
        if plain_new:
            self.graph.add_operation(
                "store",
                "ingest",
                inputs=store_inputs,
                outputs=plain_new,
                knobs=knobs,
                session_id=session.id,
                comment=f"{len(plain_new)} new memory unit(s)",
            )
        for old_id, new_id in rewritten.items():
            self.graph.add_operation(
                "update",
                "ingest",
                inputs=[*store_inputs, self._memory[old_id].id],
                outputs=[new_vars[new_id].id],
                knobs=knobs,
                session_id=session.id,
                comment=f"memory {old_id} rewritten as {new_id}",
            )
            self._tombstone(old_id, session)
        for mid, item, status in updated:
            old = self._memory[mid]
            var = self._memory_var(mid, item, status, session, messages, previous=old)
            self.graph.add_operation(
                "update",
                "ingest",
                inputs=[*store_inputs, old.id],
                outputs=[var.id],
                knobs=knobs,
                session_id=session.id,
                comment="invalidated" if status == "invalidated" else "text changed",
            )
        gone = [mid for mid in removed if mid not in rewritten]
        olds = [self._memory[mid] for mid in gone]
        self.graph.add_removal(
            store_inputs,
            olds,
            [self._tombstone(mid, session) for mid in gone],
            session_id=session.id,
        )

    def _memory_var(
        self,
        mid: str,
        item: MemoryItem,
        status: str,
        session: Session,
        messages: list[str],
        previous: Variable | None = None,
    ) -> Variable:
        turn_ids = item.metadata.get("turn_ids") or []
        provenance = [
            f"message:{t}@0" for t in turn_ids if f"message:{t}@0" in self.graph.variables
        ]
        if not provenance:
            provenance = list(previous.provenance) if previous else list(messages)
        var = self.graph.add_variable(
            Variable.make(
                "memory",
                mid,
                self.graph.next_version("memory", mid),
                text=item.text[:TEXT_LIMIT],
                data={"metadata": jsonable(item.metadata)},
                session_id=session.id,
                timestamp=session.timestamp,
                provenance=provenance,
                status=status,
            )
        )
        self._memory[mid] = var
        return var

    def _tombstone(self, mid: str, session: Session) -> Variable:
        """A deleted version of memory ``mid``: what the store holds after it is gone."""
        old = self._memory[mid]
        var = self.graph.add_variable(
            Variable.make(
                "memory",
                mid,
                old.version + 1,
                text="",
                session_id=session.id,
                timestamp=session.timestamp,
                provenance=old.provenance,
                status="deleted",
            )
        )
        self._memory[mid] = var
        return var

    # --- questions ------------------------------------------------------------------------

    def ask(self, question: Question) -> str:
        """Retrieve and answer ``question``, recording both; returns the prediction.

        Recorded: the ``question`` variable, the ``retrieve`` operation (memory versions in, the
        ranked list out, knobs attached, plus the ranks of a wider search so attribution can tell
        "ranked 7th with top_k=5" from "never found"), and the answer call."""
        qvar = self.graph.add_variable(question_variable(question))
        with self._scoped("retrieve", [qvar.id], question_id=question.id) as ops:
            started = time.perf_counter()
            items = self.system.retrieve(question.question)
            seconds = time.perf_counter() - started
        query_vars = [out for op_id in ops for out in self.graph.op(op_id).outputs]
        query_text = self.graph.variables[query_vars[-1]].text if query_vars else question.question
        retrieved = self._record_retrieval(
            question, qvar.id, query_vars, query_text, items, seconds
        )
        with self._scoped("answer", [qvar.id, retrieved.id], question_id=question.id) as ops:
            prediction = self.system.answer(question.question, items)
        if not ops:  # an answer that made no LLM call (cached in the system, say) is still an op
            ans = self.graph.add_variable(
                Variable.make(
                    "answer", f"{question.id}.answer", text=prediction, question_id=question.id
                )
            )
            self.graph.add_operation(
                "answer",
                "answer",
                inputs=[qvar.id, retrieved.id],
                outputs=[ans.id],
                question_id=question.id,
            )
        return prediction

    def _record_retrieval(
        self,
        question: Question,
        qvar: str,
        query_vars: list[str],
        query_text: str,
        items: Sequence[MemoryItem],
        seconds: float,
    ) -> Variable:
        knobs = jsonable(self.system.knobs())
        wide: list[str] = []
        asked: list[str] = []
        sites = self.system.prompt_sites()
        if not any(s.stage == "retrieve" and n != QUERY_REWRITE for n, s in sites.items()):
            try:  # a wider search (no LLM) tells "ranked below top_k" from "not found at all"
                k = max(self.wide_k, len(items))
                wide = [m.id for m in self.system.search(query_text, k)]
                if QUERY_REWRITE in sites and query_text != question.question:
                    # the same search for the question as asked: did the rewrite lose it?
                    top = int(knobs.get("top_k") or len(items) or 1)
                    asked = [m.id for m in self.system.search(question.question, top)]
            except Exception as exc:  # noqa: BLE001 - diagnostic only
                logger.debug("wide search failed: %s", exc)
        inputs = [*query_vars] if query_vars else [qvar]
        listed = []
        for rank, item in enumerate(items, 1):
            var = self._memory.get(item.id)
            if var is not None:
                inputs.append(var.id)
            listed.append(
                {
                    "rank": rank,
                    "id": item.id,
                    "var": var.id if var else None,
                    "text": item.text,
                    "score": item.score,
                }
            )
        truncated = self.system.truncation()
        retrieved = self.graph.add_variable(
            Variable.make(
                "retrieved",
                question.id,
                text="\n".join(f"{x['rank']}. {x['text']}" for x in listed)[: TEXT_LIMIT * 4],
                data={
                    "items": listed,
                    "query": query_text,
                    "wide": wide,
                    "asked": asked,
                    "truncation": jsonable(truncated) if truncated else None,
                },
                question_id=question.id,
            )
        )
        self.graph.add_operation(
            "retrieve",
            "retrieve",
            inputs=dict.fromkeys(inputs),
            outputs=[retrieved.id],
            knobs=knobs,
            question_id=question.id,
            seconds=round(seconds, 4),
            comment=f"{len(listed)} memories for {query_text[:80]!r}",
        )
        return retrieved


def record_episode(
    system: MemorySystem,
    episode: Episode,
    questions: Sequence[Question] | None = None,
    *,
    dataset: str = "",
) -> tuple[ExecutionGraph, dict[str, str]]:
    """Ingest ``episode`` into ``system`` and answer its questions, recording everything.

    A convenience for tests and notebooks; the product runs episodes
    through :func:`optloop.pipeline.run_episode`, whose private-store mode records the same graph.
    """
    with Recorder(system, episode, dataset=dataset) as recorder:
        recorder.ingest(episode.sessions)
        predictions = {
            q.id: recorder.ask(q)
            for q in (questions if questions is not None else episode.questions)
        }
    return recorder.graph, predictions


__all__ = [
    "Operation",
    "Recorder",
    "SITE_CALLBACK",
    "SiteCallback",
    "active_recorder",
    "record_episode",
    "similar",
]
