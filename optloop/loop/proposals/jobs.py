"""What each prompt site is for, as data: the task a writer is asked to serve and the words an
instruction for it names.

A proposed instruction is only worth evaluating if it asks for its site's job (the proposal gate,
:mod:`optloop.loop.proposals.gate`), and a proposer writes better when it is told the job in one
plain sentence than when it is handed a long library prompt to re-type (the writer,
:mod:`optloop.loop.proposals.writer`). Both read it here.

``words`` are lower-case word stems: an instruction for the site must contain a word starting with
one of them ("memor" matches memory, memories, memorize). They are deliberately broad: the check
tells an instruction for the site from a text about something else (a proposer's own template
echoed back, "Please provide the task details"), not a good instruction from a bad one; the
evaluation on dev does that.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from optloop import sites


class SiteJob(BaseModel):
    """One prompt site's job."""

    task: str = Field(
        description="what the site's call does, a short phrase: the writer restates it, and the "
        "substance of what it writes comes from the failures, not from a description to copy"
    )
    words: tuple[str, ...] = Field(
        description="word stems an instruction for the site names at least one of"
    )
    output: str = Field(
        "The output format is enforced separately, so the instruction need not describe it.",
        description="what a writer is told of the output format",
    )


_EXTRACT_WORDS = (
    "extract",
    "memor",
    "fact",
    "store",
    "remember",
    "record",
    "save",
    "keep",
    "note",
    "preference",
    "personal",
)

JOBS: dict[str, SiteJob] = {
    sites.ANSWER: SiteJob(
        task="answer the user's question from the memories retrieved for it",
        words=("answer", "question", "reply", "respond", "memor"),
    ),
    sites.QUERY_REWRITE: SiteJob(
        task="rewrite the user's question into a short search query for the memory store",
        words=("query", "search", "rewrite", "question", "keyword"),
    ),
    sites.MEM0_EXTRACT: SiteJob(
        task="extract the memories to store from the new messages of a conversation",
        words=_EXTRACT_WORDS,
        output=(
            "The output is a JSON list of memories, each with a text field; the format is "
            "enforced separately, so the instruction need not describe it."
        ),
    ),
    sites.MEM0_RERANK: SiteJob(
        task="score how relevant a stored memory is to a search query, from 0 to 1",
        words=("relevan", "score", "rank", "query", "document", "memor"),
    ),
    sites.MD_FLAT_CURATE: SiteJob(
        task="rewrite the markdown memory file so it keeps every lasting fact of the conversation",
        words=(*_EXTRACT_WORDS, "markdown", "file", "curate", "update"),
    ),
    sites.TIERED_EXTRACT: SiteJob(
        task="extract lasting facts about the user from their newest message as key/value facts",
        words=(*_EXTRACT_WORDS, "key", "value"),
    ),
    sites.TIERED_SUMMARIZE: SiteJob(
        task="summarize the conversation for the assistant's mid-term memory",
        words=("summar", "conversation", "memor", "fact", "keep"),
    ),
    sites.GATED_ADMIT: SiteJob(
        task="decide which retrieved memories an agent may rely on to answer its question",
        words=("admit", "memor", "rely", "decide", "relevan", "reject", "accept", "verdict"),
    ),
}
"""Site name -> its job, for the sites optloop names (:mod:`optloop.sites`)."""

_GRAPHITI = re.compile(r"^graphiti\.(?P<prompt>[a-z_]+)\.")
_GRAPHITI_JOBS = {
    "extract_nodes": SiteJob(
        task="extract the entities (people, places, things) mentioned in the conversation",
        words=("extract", "entit", "node", "name", "person", "people", "mention"),
    ),
    "extract_edges": SiteJob(
        task="extract the facts that relate the entities mentioned in the conversation",
        words=(*_EXTRACT_WORDS, "relat", "edge", "entit"),
    ),
    "dedupe_nodes": SiteJob(
        task="decide which extracted entities are duplicates of existing ones",
        words=("duplicate", "dedup", "same", "entit", "node", "match"),
    ),
    "dedupe_edges": SiteJob(
        task="decide which extracted facts duplicate or contradict existing ones",
        words=("duplicate", "dedup", "same", "fact", "edge", "contradict", "match"),
    ),
    "summarize_nodes": SiteJob(
        task="summarize what is known about an entity",
        words=("summar", "entit", "node", "fact"),
    ),
}


def site_job(site: str) -> SiteJob | None:
    """``site``'s job: :data:`JOBS`, graphiti's prompts by family, else ``None`` (a site whose job
    optloop does not know: the gate does not judge it off-task, the writer describes it by its
    signature)."""
    if site in JOBS:
        return JOBS[site]
    if m := _GRAPHITI.match(site):
        return _GRAPHITI_JOBS.get(m.group("prompt"))
    return None


def asks_for(job: SiteJob, text: str) -> bool:
    """Whether ``text`` names the job: a word of it starts with one of ``job.words``."""
    return any(w.startswith(job.words) for w in re.findall(r"[a-z]+", text.lower()))


__all__ = ["JOBS", "SiteJob", "asks_for", "site_job"]
