"""The writer: small, concrete writing tasks for a proposer model, built from the attribution
evidence.

A 1.5B model asked to "improve" an 8,000-token library prompt echoes its own template back or runs
out of tokens mid-list. Asked for one sentence, or for a short instruction for a job stated in one
line, with the cases that failed in front of it, it writes something a person could ship. So the
writer never hands the proposer a long prompt to re-type; it asks for one of

- :meth:`Writer.instruction`: a short instruction (two to four sentences) for the site's job
  (:mod:`optloop.loop.proposals.jobs`), from the failures: what replaces a long prompt that does
  not work;
- :meth:`Writer.sentence`: one sentence to add to the instruction;
- :meth:`Writer.rewrite`: one sentence of the instruction written anew (the unit the failures point
  at, or one a sabotage replaced).

Each answer passes the proposal gate (:class:`~optloop.loop.proposals.gate.ProposalGate`: cut off
by the token limit, malformed, an echo of the prompt, off the site's job) before it becomes a
candidate. The failures shown are the attributions blamed on the site: the question asked later,
its right answer, and what the decisive operation did with the evidence (:func:`failure_cases`).
"""

from __future__ import annotations

import ast
import logging
import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dspy

from optloop.attribution.taxonomy import ErrorType
from optloop.lm import collect_calls, prompt_site
from optloop.loop.proposals.gate import register_template
from optloop.loop.proposals.jobs import site_job
from optloop.sites import PROPOSER

if TYPE_CHECKING:
    from optloop.attribution.taxonomy import Attribution
    from optloop.loop.proposals.gate import ProposalGate

logger = logging.getLogger(__name__)

MAX_CASES = 4  # failures shown per writing task: enough to generalize from, short to read
CASE_CHARS = 320
WRITE_TEMPERATURE = 0.5
SHORT_WORDS = 120  # an instruction longer than this is rewritten whole, never re-typed


@register_template
class WriteInstruction(dspy.Signature):
    """Write a short instruction, two to four sentences, for a language model that does one step
    of an AI assistant's memory. Tell it what to do in this step and what it must not miss; the
    failures are examples of what it missed. Make the instruction general: it must cover every
    kind of fact like these, not only the examples' topics, and name no value from them. Write
    plain commands to the model, not code: do not mention functions, sessions or fields, and do
    not describe the output format."""

    step: str = dspy.InputField(desc="what this step does")
    output_format: str = dspy.InputField(desc="what the model's output looks like")
    failures: str = dspy.InputField(desc="cases where this step lost what was needed later")
    instruction: str = dspy.OutputField(desc="the new instruction, two to four sentences")


@register_template
class WriteSentence(dspy.Signature):
    """Write one sentence to add to the instruction of a language model that does one step of an
    AI assistant's memory, so that the step no longer fails as in the cases below. Write a general,
    plain command to the model that covers every case like these, not only their topics; not code:
    do not mention functions, sessions or fields, and name no value from the cases."""

    step: str = dspy.InputField(desc="what this step does")
    failures: str = dspy.InputField(desc="cases where this step lost what was needed later")
    sentence: str = dspy.OutputField(desc="one sentence, a command to the model")


@register_template
class RewriteSentence(dspy.Signature):
    """Rewrite one sentence of the instruction of a language model that does one step of an AI
    assistant's memory, so that the step no longer fails as in the cases below. Write one
    sentence, a general, plain command to the model, not code; do not copy names or values from
    the cases."""

    step: str = dspy.InputField(desc="what this step does")
    sentence: str = dspy.InputField(desc="the sentence of the instruction to rewrite")
    failures: str = dspy.InputField(desc="cases where this step lost what was needed later")
    new_sentence: str = dspy.OutputField(desc="the rewritten sentence")


# The evidence quote the decisive walk writes into an explanation: "the evidence ('...', gold
# answer '...')" (optloop.attribution.decisive).
_EVIDENCE = re.compile(r"the evidence \((?P<quote>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"),")
_GOLD = re.compile(r"\(answer: '((?:[^'\\]|\\.)+)'\)")  # the right answers a case line shows
_OP_ID = re.compile(r"\s*\((?:op|call)[^)]*\)")
_FIX = re.compile(r"\s*Fix (?:the|that) [^.]*\.\s*$")
_WHAT = {
    ErrorType.EXTRACTION: "This step stored nothing that says it.",
    ErrorType.UPDATE: "This step stored it, but a later update lost it.",
    ErrorType.DELETION: "This step stored it, but it was deleted later.",
    ErrorType.RETRIEVAL: "It was stored, but the search did not find it.",
}


def failure_cases(
    attributions: Sequence[Attribution], site: str, *, seed: int = 0, limit: int = MAX_CASES
) -> str:
    """Up to ``limit`` failures blamed on ``site``, one line each, in plain words: what the user
    said (the evidence), the question asked later and its right answer, and what went wrong at this
    step. Drawn with ``seed`` when there are more."""
    blamed = [a for a in attributions if a.target == site]
    if len(blamed) > limit:
        blamed = random.Random(seed).sample(blamed, limit)
    lines = []
    for a in blamed:
        said = ""
        if m := _EVIDENCE.search(a.explanation):
            try:
                said = f"The conversation said: {ast.literal_eval(m.group('quote'))!r}. "
            except (ValueError, SyntaxError):
                said = ""
        if a.error_type in _WHAT:
            what = _WHAT[a.error_type]
        elif a.error_type is ErrorType.RESPONSE and said:
            what = f"The memories held it, but the reply was {a.prediction!r}."
        else:
            what = _FIX.sub("", _OP_ID.sub("", a.explanation)).strip()
        line = f"- {said}Later asked {a.question!r} (answer: {a.gold!r}). {what}"
        lines.append(line[:CASE_CHARS])
    return "\n".join(lines) or "(no failure attributed to this step yet)"


def failure_summary(attributions: Sequence[Attribution], site: str) -> str:
    """The failures blamed on ``site``, one line each, as the attribution words them: what the
    proposer's rewrite of a whole instruction is shown (:mod:`optloop.loop.optimizers.propose`),
    and what ``--estimate`` counts of a proposer prompt."""
    lines = [
        f"- {a.error_type.value}: {a.explanation[:300]}" for a in attributions if a.target == site
    ]
    return "\n".join(lines)[:3000] or "(no failure attributed here yet)"


def describe(site: str, signature: type[dspy.Signature] | None = None) -> tuple[str, str]:
    """What a writer is told of ``site``: its job and its output format (a site whose job optloop
    does not know is described by its signature's fields)."""
    job = site_job(site)
    if job is not None:
        return job.task, job.output
    fields = dict(getattr(signature, "fields", {}) or {})
    inputs = [
        n for n, f in fields.items() if f.json_schema_extra.get("__dspy_field_type") == "input"
    ]
    outputs = [n for n in fields if n not in inputs]
    return (
        f"the step {site!r}: from {', '.join(inputs) or 'its input'}, produce "
        f"{', '.join(outputs) or 'its output'}",
        "The output format is enforced separately, so the instruction need not describe it.",
    )


class Writer:
    """Writing tasks for ``proposer`` (see the module doc), each answer judged by ``gate``."""

    def __init__(self, proposer: dspy.BaseLM, gate: ProposalGate):
        self.proposer = proposer
        self.gate = gate

    def instruction(
        self,
        site: str,
        failures: str,
        *,
        rollout: int,
        signature: type[dspy.Signature] | None = None,
    ) -> str | None:
        """A short instruction for ``site``'s job, written from ``failures`` (``None``: the
        proposer failed, or the gate refused what it wrote)."""
        step, output = describe(site, signature)
        return self._write(
            site,
            WriteInstruction,
            "instruction",
            dict(step=step, output_format=output, failures=failures),
            rollout=rollout,
            who="the writer's instruction",
        )

    def sentence(
        self,
        site: str,
        failures: str,
        *,
        rollout: int,
        signature: type[dspy.Signature] | None = None,
    ) -> str | None:
        """One sentence to add to ``site``'s instruction (``None``: failed or refused)."""
        step, _ = describe(site, signature)
        return self._write(
            site,
            WriteSentence,
            "sentence",
            dict(step=step, failures=failures),
            rollout=rollout,
            who="the writer's added sentence",
            whole=False,
        )

    def as_instruction(self, site: str, sentence: str, failures: str) -> bool:
        """Whether the gate passes ``sentence``, written to be added to ``site``'s instruction, as
        a whole instruction for the site's job (the verdict is logged and counted like any)."""
        return not self.gate.refuses(
            site,
            sentence,
            who="the writer's added sentence as the instruction",
            shown=failures,
            values=_GOLD.findall(failures),
        )

    def rewrite(
        self,
        site: str,
        sentence: str,
        failures: str,
        *,
        rollout: int,
        signature: type[dspy.Signature] | None = None,
    ) -> str | None:
        """``sentence`` of ``site``'s instruction written anew (``None``: failed, or refused, as
        the same sentence re-typed is)."""
        step, _ = describe(site, signature)
        text = self._write(
            site,
            RewriteSentence,
            "new_sentence",
            dict(step=step, sentence=sentence, failures=failures),
            rollout=rollout,
            who="the writer's rewritten sentence",
            whole=False,
        )
        return text

    def _write(
        self,
        site: str,
        signature: type[dspy.Signature],
        output: str,
        inputs: dict[str, Any],
        *,
        rollout: int,
        who: str,
        whole: bool = True,
    ) -> str | None:
        """One writing call on the proposer site; the answer judged by the gate as an instruction
        for ``site`` (``whole=False``: a sentence of one, which need not name the site's job)."""
        try:
            with (
                prompt_site(PROPOSER),
                collect_calls() as calls,
                dspy.context(
                    lm=self.proposer.copy(rollout_id=rollout, temperature=WRITE_TEMPERATURE),
                    adapter=dspy.ChatAdapter(),
                ),
            ):
                text = str(getattr(dspy.Predict(signature)(**inputs), output) or "").strip()
        except Exception as exc:  # noqa: BLE001 - a failed writing task is one candidate fewer
            logger.warning("%s for %s failed: %s", who, site, exc)
            return None
        text = _unquoted(text)
        if not text:
            return None
        cut_off = any(getattr(c, "truncated", False) for c in calls)
        # An echo is a re-typing of the template or of the failures shown; restating the site's
        # job, or keeping words of the sentence being rewritten, is what a person would do too.
        failures = str(inputs.get("failures") or "")
        if self.gate.refuses(
            site,
            text,
            who=who,
            cut_off=cut_off,
            shown=failures,
            values=_GOLD.findall(failures),
            whole=whole,
            replaces=str(inputs.get("sentence") or ""),
        ):
            return None
        return text


def _unquoted(text: str) -> str:
    """A written text without the quotes or the label a model may wrap it in, or the chat
    format's end marker it may leave on the same line."""
    text = re.sub(r"\s*\[\[ ## completed ## \]\]\s*$", "", text).strip()
    for _ in range(2):  # '"Sentence: ..."' and 'Sentence: "..."'
        if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'`":
            text = text[1:-1].strip()
        text = re.sub(
            r"^(?:new )?(?:instruction|sentence)\s*:\s*", "", text, flags=re.IGNORECASE
        ).strip()
    return text


def long_instruction(text: str) -> bool:
    """Whether ``text`` is too long to hand a small proposer to re-type (it writes a short one
    instead)."""
    return len(text.split()) > SHORT_WORDS


__all__ = [
    "RewriteSentence",
    "WriteInstruction",
    "WriteSentence",
    "Writer",
    "describe",
    "failure_cases",
    "long_instruction",
]
