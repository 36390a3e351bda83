"""The proposer's instruction rewrite from attributed failures: what Optuna searches over and what
a round that yields nothing new falls back on."""

from __future__ import annotations

import logging

import dspy

from optloop.lm import collect_calls, prompt_site
from optloop.loop.optimizers.base import PROPOSER_SITE
from optloop.loop.proposals.gate import ProposalGate, current_gate, register_template
from optloop.loop.proposals.writer import Writer, long_instruction

logger = logging.getLogger(__name__)


@register_template
class ProposeInstruction(dspy.Signature):
    """You improve one prompt of an AI assistant's memory pipeline. Below is the prompt's current
    instruction and the failures attributed to it. Write a complete replacement instruction that keeps
    the task and the output format, and fixes these failures."""  # noqa: E501

    site: str = dspy.InputField(desc="which step of the pipeline this prompt drives")
    instruction: str = dspy.InputField(desc="the current instruction")
    failures: str = dspy.InputField(desc="attributed failures: error type and explanation")
    new_instruction: str = dspy.OutputField()


def propose_instruction(
    proposer: dspy.BaseLM,
    site: str,
    instruction: str,
    failures: str,
    *,
    rollout: int,
    gate: ProposalGate | None = None,
) -> str | None:
    """One rewrite of ``instruction`` by the proposer LM (``None`` when it fails, or when the
    proposal gate refuses what it wrote: :mod:`optloop.loop.proposals.gate`). A long instruction (a
    library prompt of thousands of tokens) is never handed over to be re-typed: the writer asks for
    a short instruction for the site's job instead
    (:meth:`optloop.loop.proposals.writer.Writer.instruction`)."""
    gate = gate or current_gate()
    if long_instruction(instruction):
        return Writer(proposer, gate).instruction(site, failures, rollout=rollout)
    try:
        with (
            prompt_site(PROPOSER_SITE),
            collect_calls() as calls,
            dspy.context(
                lm=proposer.copy(rollout_id=rollout, temperature=1.0), adapter=dspy.JSONAdapter()
            ),
        ):
            text = dspy.Predict(ProposeInstruction)(
                site=site, instruction=instruction, failures=failures
            ).new_instruction.strip()
    except Exception as exc:  # noqa: BLE001 - a failed proposal is one candidate fewer
        logger.warning("proposer failed for %s: %s", site, exc)
        return None
    cut_off = any(c.truncated for c in calls)
    if text and gate.refuses(
        site,
        text,
        who="the proposer's rewrite",
        cut_off=cut_off,
        shown=failures,
        replaces=instruction,
    ):
        return None
    return text or None
