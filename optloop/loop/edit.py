"""An edit-based optimizer in the manner of GrIPS (Prasad et al., EACL 2023): ``--optimizer edit``.

GrIPS improves an instruction without asking a model to write one: it splits the
instruction into phrases and edits them (**delete**, **swap**, **paraphrase**,
**add** back a phrase deleted earlier), keeping an edit only when it scores
better. That suits a small model, which follows instructions far better than it
writes them: only the paraphrase edit asks the proposer LM for text, and one
phrase at a time.

One round here, from the current best candidate, for each target site (the
blamed ones, most blamed first):

1. the site's instruction is split into phrases (sentences, then clauses);
2. the edits proposed are single-phrase deletions (an ablation of the
   instruction; ``deletions`` phrases, drawn at random from a longer one), the
   deletion of every phrase (the signature's own default instruction, built by
   DSPy from its fields), and ``extra`` random edits (swap, paraphrase, add;
   one or two composed, as GrIPS's ``num_compose``);
3. every site's edits are scored together on a seeded mini-batch of train
   questions (GrIPS's score set; these runs are the optimizer's cost, not
   evaluations of ``--budget``: ``--estimate`` counts them, with the best's
   screening and the paraphrase calls, by :func:`optloop.loop.overhead.edit_work`);
4. the edits are queued best train score first, and the loop evaluates them on
   dev, one per budget unit. When the queue is spent, the next round edits the
   best candidate so far (GrIPS's greedy search); the loop retargets the sites
   when re-attribution moves the blame.

The optimizer sees only the instruction it starts from and the attributions of
its failures: nothing else of the system's original prompt.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dspy

from optloop.lm import prompt_site
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop._base import PROPOSER_SITE, Optimizer
from optloop.text import sentences

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluation

logger = logging.getLogger(__name__)

_CLAUSE = re.compile(r"(?<=[,;:])\s+")


def phrases(instruction: str) -> list[str]:
    """``instruction`` as phrases: sentences, and the clauses of a sentence with commas or semicolons.

    ``" ".join(phrases(text))`` is ``text`` with its white space folded.
    """
    out: list[str] = []
    for sentence in sentences(" ".join(instruction.split())):
        out += [c for c in _CLAUSE.split(sentence) if c]
    return out


def join(parts: list[str]) -> str:
    return " ".join(p.strip() for p in parts if p.strip())


class ParaphrasePhrase(dspy.Signature):
    """Paraphrase the phrase: say the same thing in other words, about as long. Reply with the paraphrase only."""

    phrase: str = dspy.InputField()
    paraphrase: str = dspy.OutputField()


@dataclass
class Edit:
    """One edited instruction and the operations that made it (``"del 2"``, ``"swap 0,3"``, ...)."""

    text: str
    ops: list[str]


class EditOptimizer(Optimizer):
    """GrIPS-style phrase edits of the blamed instructions, screened on train, queued for the loop (see module doc)."""

    name = "edit"
    DELETIONS, EXTRA, BSIZE = 3, 1, 6  # the defaults (also what --estimate's model of a round assumes: overhead.py)

    def __init__(self, *args: Any, deletions: int = DELETIONS, extra: int = EXTRA, bsize: int = BSIZE, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.deletions = deletions
        self.extra = extra
        self.bsize = bsize
        self.queue: list[Candidate] = []
        self.pool: dict[str, list[str]] = {}  # per site, every phrase its edited instructions held ("add" draws here)
        self.rng = random.Random(self.seed)
        self.minibatch = self._minibatch(self.trainset)
        self.screened: dict[str, float] = {}  # candidate digest -> train mini-batch accuracy

    # --- the loop's interface ------------------------------------------------------------

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        if not self.queue and self.sites:
            self.rounds += 1
            self.queue = self.round(best)
        return self.queue.pop(0) if self.queue else None

    def release(self, candidate: Candidate) -> None:
        self.queue.insert(0, candidate)

    # --- one round -----------------------------------------------------------------------

    def round(self, best: Candidate) -> list[Candidate]:
        """Edits of every target site's instruction in ``best``, screened together on the train mini-batch,
        best first (ties: the more blamed site, then the proposal order)."""
        fresh: list[Candidate] = []
        for site in self.sites:
            for edit in self.edits(best.sites[site].instructions, site):
                state = SiteState(instructions=edit.text, demos=best.sites[site].demos)
                candidate = best.model_copy(update={"sites": {**best.sites, site: state},
                                                    "origin": f"edit round {self.rounds}: {site} {'; '.join(edit.ops)}"})
                if candidate.digest() not in self.seen and candidate.digest() != best.digest():
                    self.seen.add(candidate.digest())
                    fresh.append(candidate)
        if not fresh:
            return []
        base_score = self._screen(best)
        scored = [(self._screen(c), i, c) for i, c in enumerate(fresh)]
        scored.sort(key=lambda t: (-t[0], t[1]))
        logger.info("edit round %d on %s: %d edits, train mini-batch %.2f (best) -> %s", self.rounds,
                    ", ".join(self.sites), len(scored), base_score, ", ".join(f"{s:.2f}" for s, _, _ in scored))
        return [c for _, _, c in scored]

    def edits(self, instruction: str, site: str) -> list[Edit]:
        """Single-phrase deletions (``deletions`` of them, drawn at random when the instruction has more
        phrases), the deletion of all phrases, then ``extra`` random composed edits."""
        parts = phrases(instruction)
        pool = self.pool.setdefault(site, [])
        pool += [p for p in parts if p not in pool]
        drop = sorted(self.rng.sample(range(len(parts)), min(self.deletions, len(parts)))) if len(parts) > 1 else []
        out = [Edit(join(parts[:i] + parts[i + 1:]), [f"del {i}"]) for i in drop]
        out.append(Edit(self.default_instruction(site), ["del all (the signature's default instruction)"]))
        for k in range(self.extra):
            text, ops = list(parts), list[str]()
            for _ in range(self.rng.choice((1, 2))):  # GrIPS's num_compose
                gone = [p for p in pool if p not in text]  # phrases an earlier edit deleted: "add" puts one back
                op = self.rng.choice([o for o in ("swap", "par", "add", "del") if self._can(o, text, gone)])
                text = self._apply(op, text, ops, gone, rollout=self.rounds * 100 + k)
            out.append(Edit(join(text), ops))
        return [e for e in out if e.text.strip()]

    @staticmethod
    def _can(op: str, parts: list[str], gone: list[str]) -> bool:
        return {"swap": len(parts) > 1, "add": bool(gone), "del": len(parts) > 1}.get(op, bool(parts))

    def _apply(self, op: str, parts: list[str], ops: list[str], gone: list[str], *, rollout: int) -> list[str]:
        parts = list(parts)
        if op == "del":
            i = self.rng.randrange(len(parts))
            parts.pop(i)
            ops.append(f"del {i}")
        elif op == "swap":
            i, j = self.rng.sample(range(len(parts)), 2)
            parts[i], parts[j] = parts[j], parts[i]
            ops.append(f"swap {i},{j}")
        elif op == "add":
            phrase = self.rng.choice(gone)
            i = self.rng.randrange(len(parts) + 1)
            parts.insert(i, phrase)
            ops.append(f"add at {i}")
        else:
            i = self.rng.randrange(len(parts))
            new = self.paraphrase(parts[i], rollout=rollout)
            if new:
                parts[i] = new
                ops.append(f"par {i}")
        return parts

    def paraphrase(self, phrase: str, *, rollout: int) -> str | None:
        """The proposer LM's paraphrase of one phrase (``None`` when it fails or echoes it)."""
        try:
            with prompt_site(PROPOSER_SITE), dspy.context(lm=self.proposer.copy(rollout_id=rollout, temperature=1.0),
                                                          adapter=dspy.JSONAdapter()):
                text = dspy.Predict(ParaphrasePhrase)(phrase=phrase).paraphrase.strip()
        except Exception as exc:  # noqa: BLE001 - a failed paraphrase is one edit fewer
            logger.warning("paraphrase failed: %s", exc)
            return None
        return text if text and text != phrase else None

    def default_instruction(self, site: str) -> str:
        """What DSPy instructs for this site's signature with no instruction: built from its fields."""
        fields = self.evaluator.sites[site].module.signature.fields
        return dspy.make_signature(dict(fields)).instructions

    # --- screening on train --------------------------------------------------------------

    def _minibatch(self, trainset: Dataset) -> Dataset:
        """A seeded sample of ``bsize`` train questions, as a dataset of their episodes."""
        pairs = [(e.id, q.id) for e in trainset.episodes for q in e.questions]
        keep = set(random.Random(self.seed).sample(pairs, min(self.bsize, len(pairs))))
        episodes = [e.model_copy(update={"questions": [q for q in e.questions if (e.id, q.id) in keep]})
                    for e in trainset.episodes]
        return trainset.model_copy(update={"episodes": [e for e in episodes if e.questions]})

    def _screen(self, candidate: Candidate) -> float:
        digest = candidate.digest()
        if digest not in self.screened:
            self.screened[digest] = self.evaluator.evaluate(candidate, self.minibatch, split="train").accuracy
        return self.screened[digest]


__all__ = ["EditOptimizer", "phrases"]
