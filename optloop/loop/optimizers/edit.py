"""The edit optimizer (``--optimizer edit``): GrIPS-style edits of the blamed instructions.

GrIPS (Prasad et al., EACL 2023) improves an instruction without asking a model to write one: it
edits its phrases (delete, swap, paraphrase, add back one deleted earlier) and keeps an edit only
when it scores better, which suits a small model that follows instructions far better than it
writes them. :class:`EditOptimizer` makes a round of edits per target site, screens them on a
train mini-batch and queues them for the loop; :func:`support` and :func:`conditional` say which
deletions the failures point at; :func:`work` is its cost model for ``--estimate``. How a run
uses it: ``docs/loop.md`` ("What it does", "Proposals a person would ship").
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy

from optloop.lm import prompt_site
from optloop.loop.candidate import Candidate, SiteState, trivial_instruction
from optloop.loop.optimizers.base import PROPOSER_SITE, QueuedOptimizer
from optloop.loop.optimizers.registry import EDIT
from optloop.loop.proposals.gate import active, register_template
from optloop.loop.proposals.units import Instruction, Kind, problems
from optloop.loop.proposals.writer import WriteInstruction, failure_cases, long_instruction
from optloop.loop.spending.estimate import OptimizerWork
from optloop.loop.spending.shape import (
    JSON_TOKENS,
    PARAPHRASES_PER_EXTRA,
    WRITE_CASE_TOKENS,
    WRITE_TOKENS,
    RunShape,
    template_tokens,
)
from optloop.paths import write_atomic
from optloop.text import normalize

if TYPE_CHECKING:
    from optloop.attribution import Attribution
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluation


logger = logging.getLogger(__name__)

MIN_SUPPORT = 2  # failures that must point at a unit before its deletion goes first
# An instruction longer than this (a library's own prompt: mem0's extraction prompt is 5,062 words
# in 190 units) gets no random deletions or random composed edits (:meth:`EditOptimizer.edits`).
LONG_WORDS = 1000
# What a round leaves for the next (the units "add" can put back, the draws' state), per round, in
# the optimizer's work directory: a resumed run makes the round an uninterrupted one would.
STATE_NAME = "rounds.json"
SCREENED_DIR = "screened"  # one <candidate digest>.json a screen, beside STATE_NAME
MIN_PHRASE = 3  # words of an answer's opening a unit must hold to support it
_QUOTED = re.compile(r'"([^"]+)"|\u201c([^\u201d]+)\u201d')
_CONDITION = re.compile(r"\b(if|when|whenever|unless|otherwise|in case)\b", re.IGNORECASE)


def phrases(instruction: str) -> list[str]:
    """The editable units of ``instruction`` (sentences, semicolon clauses, list items), as
    written."""
    return [u.body for u in Instruction.parse(instruction).editable]


def support(
    instruction: Instruction, failures: Sequence[Attribution]
) -> dict[int, tuple[int, str]]:
    """Editable units the failures point at: unit -> (how many failures, the reason in words).

    A failure points at a unit when what the decisive operation said (``details["output"]``, else
    the prediction) is in the unit's text, or its opening words are (at least
    :data:`MIN_PHRASE` of them: "I don't know what the question is" and a unit that says "reply
    exactly I don't know"; :func:`opens_with`), or a quoted phrase of the unit is in what it
    said: the unit tells the model to say what the failing answers said. Units pointed at by fewer
    than :data:`MIN_SUPPORT` failures, or fewer than a quarter of them, are left out.
    """
    said = [str(a.details.get("output") or a.prediction or "").strip() for a in failures]
    floor = max(MIN_SUPPORT, math.ceil(len(said) / 4))
    out: dict[int, tuple[int, str]] = {}
    for k, unit in enumerate(instruction.editable):
        text = f" {normalize(unit.body)} "
        quoted = [normalize(a or b) for a, b in _QUOTED.findall(unit.body)]
        hits = [
            s
            for s in said
            if (n := normalize(s))
            and (opens_with(text, n) or any(q and f" {q} " in f" {n} " for q in quoted))
        ]
        if len(hits) >= floor:
            common = Counter(hits).most_common(1)[0][0]
            out[k] = (len(hits), f"{len(hits)} of {len(said)} failures answered {common[:60]!r}")
    return out


def opens_with(text: str, said: str) -> bool:
    """Whether ``text`` (a normalized unit, spaces around) holds what ``said`` (a normalized answer)
    says, or its opening words, :data:`MIN_PHRASE` of them or more: a model told to say a phrase
    often says it and goes on ("I don't know what the question is" for "reply exactly I don't
    know")."""
    words = said.split()
    return f" {said} " in text or any(
        f" {' '.join(words[:k])} " in text for k in range(MIN_PHRASE, len(words))
    )


def conditional(unit: str) -> bool:
    """Whether ``unit`` gives its command only under a condition (``If the memories do not
    contain it, reply "I don't know".``), read outside its quoted phrases.

    Among units the same failures support, a conditional one explains only the failures where
    its condition held, and an unconditional command (``Always reply exactly I don't know.``)
    explains them all: its deletion is tried first.
    """
    return bool(_CONDITION.search(_QUOTED.sub(" ", unit)))


@register_template
class ParaphrasePhrase(dspy.Signature):
    """Paraphrase the phrase: say the same thing in other words, about as long. Reply with the paraphrase only."""

    phrase: str = dspy.InputField()
    paraphrase: str = dspy.OutputField()


def same_length(phrase: str, paraphrase: str) -> bool:
    """Whether ``paraphrase`` is about as long as ``phrase`` (half to twice its words): what the
    paraphrase edit asks for. A small proposer often answers with a fragment of the phrase ("I
    don't know." for a whole conditional rule), which is another instruction, not the same one
    reworded."""
    n, m = len(phrase.split()), len(paraphrase.split())
    return n <= 2 * m and m <= 2 * n


@dataclass
class Edit:
    """One edited instruction, the operations that made it (``"del 2"``, ``"swap 0,3"``, ...), how
    many failures support it (:func:`support`) and why, in words; ``conditional`` when the unit a
    supported deletion removes gives its command under a condition (:func:`conditional`)."""

    text: str
    ops: list[str]
    support: int = 0
    reason: str = ""
    conditional: bool = False


class EditOptimizer(QueuedOptimizer):
    """GrIPS-style phrase edits of the blamed instructions, screened on train, queued for the loop.

    A round (:meth:`round`), from the current best, for each target site (most blamed first):

    1. the site's instruction is split into units a person could strike out and leave complete
       sentences (sentences, semicolon clauses, list items: :mod:`optloop.loop.proposals.units`);
    2. :meth:`edits` proposes single-unit deletions (an ablation of the instruction): every
       deletion the failures point at (:func:`support`), then random ones up to ``deletions``;
       the deletion of every unit (the signature's default instruction, built by DSPy from its
       fields: :func:`~optloop.loop.candidate.trivial_instruction`, the run's control); the
       written edits (:meth:`written`); and ``extra`` random edits (swap, paraphrase, add; one or
       two composed, as GrIPS's ``num_compose``). An edit that leaves malformed text is dropped
       before anything runs it;
    3. every site's edits are screened together on a seeded mini-batch of ``bsize`` train
       questions (GrIPS's score set): optimizer cost, not evaluations of ``--budget``;
    4. they are queued with the best-supported deletions first (of two units the same failures
       support, the unconditional command before the conditional one: :func:`conditional`), then
       best train score first, and the loop evaluates them on dev, one per trial. When a trial
       beats the best, :meth:`propose` drops the rest of the round and the next round edits the
       new best; when the queue is spent, the next round edits the best so far (GrIPS's greedy
       search). The loop retargets the sites when re-attribution moves the blame.

    The deletions read the best's dev failures; the written edits are shown its failures on the
    train mini-batch instead (its screen, run first), so a written sentence is never fitted to a
    dev question. A supported deletion's reason is part of the candidate's ``origin`` (the trial
    line and the MLflow ``origin`` parameter): ``edit round 1: answer del 2 (deleted sentence 3:
    14 of 16 failures answered "I don't know")``. The optimizer sees only the instruction it
    starts from and the attributions of its failures: nothing else of the system's own prompt.
    """

    name = EDIT
    # the defaults (also what --estimate's model of a round assumes: :func:`work`)
    DELETIONS, EXTRA, BSIZE = 3, 1, 6
    # Written edits a round asks the proposer for, per site: a short instruction, a sentence added,
    # a sentence rewritten (:meth:`written`; also in :func:`work`'s model of a round).
    WRITES = 3
    # Whether the deletions the failures support go first (:func:`support`); False leaves
    # the train screen's order alone, as a baseline (``experiments.bench.repair --edit-order``).
    evidence = True

    def __init__(
        self,
        *args: Any,
        deletions: int = DELETIONS,
        extra: int = EXTRA,
        bsize: int = BSIZE,
        write: bool = True,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.deletions = deletions
        self.extra = extra
        self.bsize = bsize
        self.write = write
        # per site, every unit its instructions held (the "add" edit draws from it)
        self.pool: dict[str, list[tuple[str, Kind]]] = {}
        self.rejected = 0  # edits dropped as malformed text
        self.rng = random.Random(self.seed)
        self.minibatch = self._minibatch(self.trainset)
        # candidate digest -> its evaluation on the train mini-batch (its accuracy orders the
        # round; the best's failures there are what the writer is shown)
        self.screened: dict[str, Evaluation] = {}
        self._restored = False  # whether the rounds' saved state was read (:meth:`_restore`)

    # --- the loop's interface ------------------------------------------------------------

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        if self.queue and self.queue[0].parent not in (None, best.digest()):
            # A trial beat the program this round edited: edit the new best (GrIPS's greedy step).
            logger.info(
                "edit: the best moved; %d queued edit(s) of the old best dropped", len(self.queue)
            )
            self.queue = []
        if not self.queue and self.sites:
            self.rounds += 1
            with active(self.gate):
                self.queue = self.round(best, best_eval)
        return self.queue.pop(0) if self.queue else None

    # --- one round -----------------------------------------------------------------------

    def round(self, best: Candidate, best_eval: Evaluation | None = None) -> list[Candidate]:
        """Edits of every target site's instruction in ``best``, screened together on the train
        mini-batch: the deletions ``best_eval``'s failures support first (most supported first;
        of equal support, an unconditional command before a conditional one), then best train
        score first (ties: the more blamed site, then the proposal order).

        The round starts from what the round before it left (:meth:`_restore`) and saves what it
        leaves (:meth:`_save`), so the round after a resume is the one an uninterrupted run makes."""
        self._restore()
        try:
            return self._round(best, best_eval)
        finally:
            self._save()

    def _round(self, best: Candidate, best_eval: Evaluation | None) -> list[Candidate]:
        failures = best_eval.attributions() if best_eval is not None else []
        # The writer is shown the best's failures on the train mini-batch, never dev's: a sentence
        # fitted to a dev case would be chosen by the dev evaluation of that same case.
        self._screen_all(
            [best],
            what="the best" + (" (its failures there are what the writer sees)" * self.write),
        )
        on_train = self.screened[best.digest()].attributions()
        fresh: list[tuple[Edit, Candidate]] = []
        for site in self.sites:
            blamed = [a for a in failures if a.target == site]
            shown = [a for a in on_train if a.target == site]
            for edit in self.edits(best.sites[site].instructions, site, blamed, shown):
                state = SiteState(instructions=edit.text, demos=best.sites[site].demos)
                why = f" ({edit.reason})" if edit.reason else ""
                candidate = best.model_copy(
                    update={
                        "sites": {**best.sites, site: state},
                        "origin": f"edit round {self.rounds}: {site} {'; '.join(edit.ops)}{why}",
                        "parent": best.digest(),
                    }
                )
                if candidate.digest() not in self.seen and candidate.digest() != best.digest():
                    self.seen.add(candidate.digest())
                    fresh.append((edit, candidate))
        if not fresh:
            return []
        self._screen_all([best, *(c for _, c in fresh)])
        base_score = self._screen(best)
        scored = [
            (e.support, e.conditional, self._screen(c), i, c) for i, (e, c) in enumerate(fresh)
        ]
        scored.sort(key=lambda t: (-t[0], t[1], -t[2], t[3]))
        logger.info(
            "edit round %d on %s: %d edits, train mini-batch %.2f (best) -> %s",
            self.rounds,
            ", ".join(self.sites),
            len(scored),
            base_score,
            ", ".join(f"{s:.2f}" for _, _, s, _, _ in scored),
        )
        return [c for *_, c in scored]

    def edits(
        self,
        instruction: str,
        site: str,
        failures: Sequence[Attribution] = (),
        shown: Sequence[Attribution] | None = None,
    ) -> list[Edit]:
        """The deletions ``failures`` support (:func:`support`), more single-unit deletions up to
        ``deletions`` (drawn at random when the instruction has more units), the deletion of all
        units, the written edits (:meth:`written`, shown ``shown``, default ``failures``), then
        ``extra`` random composed edits; any edit whose text has a problem the instruction did
        not have (:func:`~optloop.loop.proposals.units.problems`) is dropped.

        An instruction over :data:`LONG_WORDS` words gets neither the random deletions nor the
        random composed edits: one unit of mem0's 190 is half a percent of the prompt, so a
        random deletion rarely changes what the model does, and screening it costs a fresh read
        of the whole prompt (about 200 s on Qwen2.5-Coder 0.5B on 2 cores, before a session is
        ingested). The deletions the failures support, the deletion of all units and the
        written edits stay."""
        start = Instruction.parse(instruction)
        units = start.editable
        pool = self.pool.setdefault(site, [])
        pool += [(u.body, u.kind) for u in units if (u.body, u.kind) not in pool]
        backed = support(start, failures) if self.evidence and len(units) > 1 else {}
        ruled = {k: conditional(units[k].body) for k in backed}
        first = sorted(backed, key=lambda k: (-backed[k][0], ruled[k], k))
        rest = [k for k in range(len(units)) if k not in backed]
        long = len(instruction.split()) > LONG_WORDS
        room = 0 if long else max(self.deletions - len(first), 0)
        drop = (
            first + sorted(self.rng.sample(rest, min(room, len(rest)))) if len(units) > 1 else []
        )
        out = []
        for k in drop:
            count, why = backed.get(k, (0, ""))
            reason = f"deleted {start.label(k)}: {why}" if why else ""
            out.append(
                Edit(
                    start.delete(k).text,
                    [f"del {k}"],
                    count,
                    reason,
                    conditional=ruled.get(k, False),
                )
            )
        out.append(
            Edit(
                trivial_instruction(self.evaluator.sites[site].module.signature),
                ["del all (the signature's default instruction)"],
            )
        )
        if self.write:
            out += self.written(start, site, failures if shown is None else shown, first)
        for k in range(0 if long else self.extra):
            text, ops = start, list[str]()
            for _ in range(self.rng.choice((1, 2))):  # GrIPS's num_compose
                present = {(u.body, u.kind) for u in text.editable}
                # units an earlier edit deleted: "add" puts one back
                gone = [p for p in pool if p not in present]
                op = self.rng.choice(
                    [o for o in ("swap", "par", "add", "del") if self._can(o, text, gone)]
                )
                text = self._apply(op, text, ops, gone, rollout=self.rounds * 100 + k, site=site)
            out.append(Edit(text.text, ops))
        before = problems(instruction)
        kept = []
        for edit in out:
            new = (
                [p for p in problems(edit.text) if p not in before]
                if edit.text.strip()
                else ["empty"]
            )
            if new:
                self.rejected += 1
                logger.info(
                    "edit %s of %s dropped, not well-formed: %s", "; ".join(edit.ops), site, new[0]
                )
            else:
                kept.append(edit)
        return kept

    def written(
        self,
        start: Instruction,
        site: str,
        failures: Sequence[Attribution],
        supported: Sequence[int] = (),
    ) -> list[Edit]:
        """The round's written edits of ``site`` (:class:`~optloop.loop.proposals.writer.Writer`,
        each answer through the proposal gate): a short instruction for the site's job in place of
        the whole (``write``), one sentence added at the end (``add written``), and one sentence
        written anew (``write k``: the unit the failures point at most, else one drawn at random).
        Each task shows the proposer the failures blamed on the site, never the instruction whole
        when it is long.

        When the gate refuses the short instruction, the added sentence takes its place if the
        gate passes it as a whole instruction for the site's job (``write (the added sentence
        alone)``): the only written edit that drops every unit of the instruction, and so the
        only one that can mend an instruction replaced outright, is not lost to one refusal."""
        cases = failure_cases(failures, site, seed=self.seed * 1000 + self.rounds)
        rollout = self.rounds * 100 + 50
        signature = self._signature(site)
        out: list[Edit] = []
        shown = f" from {len(failures)} failure(s)" if failures else ""
        text = self.writer.instruction(site, cases, rollout=rollout, signature=signature)
        if text:
            out.append(Edit(text, [f"write (a short instruction{shown})"]))
        sentence = self.writer.sentence(site, cases, rollout=rollout + 1, signature=signature)
        if sentence and self._repeats(start, sentence):
            # The added sentence is one the instruction already holds (a writer restating its own
            # earlier sentence): the edit would only say it twice.
            logger.info("edit add written of %s dropped: the instruction already says it", site)
        elif sentence:
            n = len(start.editable)
            out.append(Edit(start.insert(n, sentence, "sentence").text, ["add written"]))
            if not text and self.writer.as_instruction(site, sentence, cases):
                out.append(Edit(sentence, [f"write (the added sentence alone{shown})"]))
        units = start.editable
        if units and not long_instruction(units[0].body):
            k = supported[0] if supported else self.rng.randrange(len(units))
            new = self.writer.rewrite(
                site, units[k].body, cases, rollout=rollout + 2, signature=signature
            )
            if new:
                out.append(Edit(start.replace_body(k, new).text, [f"write {k}"]))
        return out

    @staticmethod
    def _repeats(start: Instruction, sentence: str) -> bool:
        """Whether ``sentence`` says what one of ``start``'s units says, word for word once
        normalized (case, punctuation, articles)."""
        said = normalize(sentence)
        return any(normalize(u.body) == said for u in start.editable)

    def _signature(self, site: str) -> Any:
        module = getattr(self.evaluator, "sites", {}).get(site)
        return getattr(getattr(module, "module", None), "signature", None)

    @staticmethod
    def _swappable(text: Instruction) -> list[tuple[int, int]]:
        units = text.editable
        return [
            (i, j)
            for i in range(len(units))
            for j in range(i + 1, len(units))
            if units[i].kind == units[j].kind != "clause" and units[i].group == units[j].group
        ]

    def _can(self, op: str, text: Instruction, gone: list[tuple[str, Kind]]) -> bool:
        n = len(text.editable)
        return {"swap": bool(self._swappable(text)), "add": bool(gone), "del": n > 1}.get(
            op, n > 0
        )

    def _apply(
        self,
        op: str,
        text: Instruction,
        ops: list[str],
        gone: list[tuple[str, Kind]],
        *,
        rollout: int,
        site: str = "",
    ) -> Instruction:
        n = len(text.editable)
        if op == "del":
            i = self.rng.randrange(n)
            ops.append(f"del {i}")
            return text.delete(i)
        if op == "swap":
            i, j = self.rng.choice(self._swappable(text))
            ops.append(f"swap {i},{j}")
            return text.swap(i, j)
        if op == "add":
            body, kind = self.rng.choice(gone)
            i = self.rng.randrange(n + 1)
            ops.append(f"add at {i}")
            return text.insert(i, body, kind)
        i = self.rng.randrange(n)
        new = self.paraphrase(text.editable[i].body, rollout=rollout, site=site)
        if new:
            ops.append(f"par {i}")
            return text.replace_body(i, new)
        return text

    def paraphrase(self, phrase: str, *, rollout: int, site: str = "") -> str | None:
        """The proposer LM's paraphrase of one phrase (``None`` when it fails, echoes it, or is not
        about as long: :func:`same_length`)."""
        try:
            with (
                prompt_site(PROPOSER_SITE),
                dspy.context(
                    lm=self.proposer.copy(rollout_id=rollout, temperature=1.0),
                    adapter=dspy.JSONAdapter(),
                ),
            ):
                text = dspy.Predict(ParaphrasePhrase)(phrase=phrase).paraphrase.strip()
        except Exception as exc:  # noqa: BLE001 - a failed paraphrase is one edit fewer
            logger.warning("paraphrase failed: %s", exc)
            return None
        if not text or text == phrase or not same_length(phrase, text):
            return None
        if self.gate.refuses(site, text, who="a paraphrase", whole=False, replaces=phrase):
            return None
        return text

    # --- what a round leaves for the next ----------------------------------------------------

    @property
    def _state_path(self) -> Path | None:
        """Where the rounds' state is kept (``None``: an evaluator without a work directory, a
        test's fake, and none given: kept in memory)."""
        if self._work is None and getattr(self.evaluator, "work", None) is None:
            return None
        return self.work / STATE_NAME

    def _saved(self) -> dict[str, Any]:
        path = self._state_path
        if path is None or not path.exists():
            return {}
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("edit: %s unreadable (%s); the round starts afresh", path, exc)
            return {}
        return saved if isinstance(saved, dict) else {}

    def _restore(self) -> None:
        """Before round ``rounds + 1`` in a fresh process that a resume numbered on: the pool and
        the draws' state round ``rounds`` left. Nothing to do in the process that ran it, or when
        no round was saved (a run begun before the state was kept starts the round afresh)."""
        if self._restored or self.rounds <= 1:
            self._restored = True
            return
        self._restored = True
        left = self._saved().get(str(self.rounds - 1))
        if not left:
            return
        self.pool = {
            site: [(body, kind) for body, kind in units] for site, units in left["pool"].items()
        }
        version, internal, gauss = left["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

    def _save(self) -> None:
        """Round ``rounds``'s pool and draws' state, beside the earlier rounds' (a checkpoint may
        trail the rounds run, and a resume restores the one its checkpoint counted)."""
        path = self._state_path
        if path is None:
            return
        saved = self._saved()
        saved[str(self.rounds)] = {"pool": self.pool, "rng": list(self.rng.getstate())}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(saved))

    # --- screening on train --------------------------------------------------------------

    def _minibatch(self, trainset: Dataset) -> Dataset:
        """A seeded sample of ``bsize`` train questions, as a dataset of their episodes."""
        pairs = [(e.id, q.id) for e in trainset.episodes for q in e.questions]
        keep = set(random.Random(self.seed).sample(pairs, min(self.bsize, len(pairs))))
        episodes = [
            e.model_copy(update={"questions": [q for q in e.questions if (e.id, q.id) in keep]})
            for e in trainset.episodes
        ]
        return trainset.model_copy(update={"episodes": [e for e in episodes if e.questions]})

    def _known(self, digest: str) -> Evaluation | None:
        """The candidate's screen, from this process or, after a resume, from the one that ran it
        (kept in :data:`SCREENED_DIR`), so a resumed run never screens a program twice."""
        if digest not in self.screened and (path := self._screened_path(digest)) is not None:
            from optloop.loop.evaluate import Evaluation

            try:
                self.screened[digest] = Evaluation.model_validate_json(path.read_text())
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as exc:
                logger.warning("edit: %s unreadable (%s); screened again", path, exc)
        return self.screened.get(digest)

    def _keep(self, digest: str, evaluation: Evaluation) -> None:
        self.screened[digest] = evaluation
        if (path := self._screened_path(digest)) is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, evaluation.model_dump_json())

    def _screened_path(self, digest: str) -> Path | None:
        state = self._state_path
        return None if state is None else state.parent / SCREENED_DIR / f"{digest}.json"

    def _screen_all(self, candidates: list[Candidate], what: str | None = None) -> None:
        """Screen the candidates not screened yet, ``num_threads`` at once (on an endpoint; one at
        a time on the embedded model): each evaluation is the one it gets alone
        (:meth:`Evaluator.evaluate_many`). ``what``: the progress line's name for them (default:
        "k of n programs")."""
        todo = list(
            {c.digest(): c for c in candidates if self._known(c.digest()) is None}.values()
        )
        step = max(1, self.num_threads)
        for i in range(0, len(todo), step):
            chunk = todo[i : i + step]
            self.progress(
                f"edit round {self.rounds}: screening "
                + (
                    what
                    or f"{i + 1}{f'-{i + len(chunk)}' if len(chunk) > 1 else ''} of {len(todo)} "
                    "programs"
                )
                + f" on a train mini-batch ({len(self.minibatch.questions())} questions)"
            )
            for candidate, evaluation in zip(
                chunk, self.evaluator.evaluate_many(chunk, self.minibatch, split="train")
            ):
                self._keep(candidate.digest(), evaluation)

    def _screen(self, candidate: Candidate) -> float:
        digest = candidate.digest()
        if (known := self._known(digest)) is None:
            known = self.evaluator.evaluate(candidate, self.minibatch, split="train")
            self._keep(digest, known)
        return known.accuracy


__all__ = ["EditOptimizer", "conditional", "phrases", "same_length", "support"]


# --- its cost model (--estimate) ---------------------------------------------------------


def work(shape: RunShape) -> OptimizerWork:
    """``--optimizer edit``'s cost model. A round makes, per target site, ``min(DELETIONS, units)``
    single-unit deletions (none for a one-unit instruction), the deletion of all, ``WRITES`` written
    edits (one proposer call each) and ``EXTRA`` composed edit (1 or 2 operations, a paraphrase
    one time in 3: :data:`~optloop.loop.spending.shape.PARAPHRASES_PER_EXTRA` proposer calls). It
    screens the best and every edit on the mini-batch (``b = min(BSIZE, train questions)``
    questions each; an edit of an ingest site also ingests the mini-batch's ``m = min(b, train
    episodes)`` episodes), and the loop evaluates the edits, one a trial: the budget over the
    edits a round, rounded up, plus about ``log2(budget + 1)`` rounds that a trial beating the
    best starts early."""
    opt = EditOptimizer
    b = min(opt.BSIZE, shape.train_questions)
    m = min(b, shape.train_episodes)
    edits = {}
    for site in shape.sites:
        n = len(phrases(shape.instructions.get(site, "")))
        edits[site] = (min(opt.DELETIONS, n) if n > 1 else 0) + 1 + opt.EXTRA + opt.WRITES
    per_round = max(sum(edits.values()), 1)
    # A trial that beats the best starts a round of its own (edit.py's greedy step): the model
    # takes about log2(budget + 1) of them, on top of the rounds the budget spends.
    improving = min(shape.budget - 1, math.ceil(math.log2(shape.budget + 1)))
    rounds = math.ceil(shape.budget / per_round) + improving
    paraphrases = rounds * len(shape.sites) * opt.EXTRA * PARAPHRASES_PER_EXTRA
    writes = rounds * len(shape.sites) * opt.WRITES
    phrase = sum(
        shape.instruction_tokens(s) / max(len(phrases(shape.instructions.get(s, ""))), 1)
        for s in shape.sites
    ) / max(len(shape.sites), 1)
    return shape.work(
        opt.name,
        rounds=rounds,
        trials_per_round=per_round,
        question_runs=rounds * (1 + per_round) * b,
        episode_ingests=rounds * m * sum(edits[s] for s in shape.ingest_sites),
        proposer_calls=paraphrases + writes,
        prompt_tokens=(
            paraphrases * (template_tokens(ParaphrasePhrase) + phrase)
            + writes * (template_tokens(WriteInstruction) + WRITE_CASE_TOKENS)
        )
        / max(paraphrases + writes, 1),
        completion_tokens=(paraphrases * phrase + writes * WRITE_TOKENS)
        / max(paraphrases + writes, 1)
        + JSON_TOKENS,
        threads=None,
        basis=(
            f"{rounds} round(s) of {per_round} edits ({improving} of them after a trial that "
            "beats the best) "
            f"({', '.join(f'{s} {n}' for s, n in edits.items())}), each round screening the "
            f"best and its edits on {b} train questions (edits of an ingest site also ingest "
            f"{m} episodes), about {PARAPHRASES_PER_EXTRA:g} paraphrase call and "
            f"{opt.WRITES} writing calls a site"
        ),
    )
