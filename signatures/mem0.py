"""mem0's prompt sites, one signature per prompt the installed ``mem0ai`` sends.

Each signature's instructions are read from the installed package when this
module is imported, never copied into this repository, so an optimizer starts
from exactly the text vanilla mem0 sends. Every site uses the library layout
(see :mod:`signatures._layout`): system = instructions, user = mem0's own user
message verbatim, response schema = the output fields.

- :class:`Mem0Extract` (site ``mem0.extract``): ``Memory.add``'s single LLM
  call, ``ADDITIVE_EXTRACTION_PROMPT`` with the user prompt built by
  ``generate_additive_extraction_prompt``; mem0 parses
  ``{"memory": [{"id", "text", "attributed_to", "linked_memory_ids"}]}``.
- :class:`Mem0Rerank` (site ``mem0.rerank``): ``LLMReranker``'s per-document
  relevance score, sent only when search reranking is on.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import dspy
from dspy.signatures.signature import SignatureMeta
from pydantic import BaseModel, Field

# Importing any mem0 module runs mem0.memory.setup, which creates MEM0_DIR (default ~/.mem0) and
# writes a config.json there: a telemetry id, unused with telemetry off (optloop.offline; optloop's
# mem0 keeps its stores and history DB in its run directory). So MEM0_DIR is a folder of this
# process's own, removed at exit: importing mem0 (as a refused command does) leaves nothing in the
# user's home or in optloop's state.
if "MEM0_DIR" not in os.environ:
    os.environ["MEM0_DIR"] = tempfile.mkdtemp(prefix="optloop-mem0-")
    atexit.register(shutil.rmtree, os.environ["MEM0_DIR"], ignore_errors=True)

from mem0.configs.prompts import ADDITIVE_EXTRACTION_PROMPT, AGENT_CONTEXT_SUFFIX  # noqa: E402
from mem0.reranker.llm_reranker import LLMReranker  # noqa: E402

__all__ = [
    "ADDITIVE_EXTRACTION_PROMPT",
    "AGENT_CONTEXT_SUFFIX",
    "RERANK_SYSTEM_PROMPT",
    "ExtractedMemory",
    "LibraryPromptSignature",
    "Mem0Extract",
    "Mem0Rerank",
]

RERANK_SYSTEM_PROMPT: str = LLMReranker._SYSTEM_PROMPT


# --- verbatim instructions ---------------------------------------------------------------


class _VerbatimInstructions(SignatureMeta):
    # DSPy's ``Signature.instructions`` is ``inspect.cleandoc(__doc__)``: it strips the
    # blank lines mem0's prompt starts and ends with (and would dedent an indented one),
    # so the system message would no longer be the library's bytes.
    @property
    def instructions(cls) -> str:
        return cls.__doc__ or ""

    @instructions.setter
    def instructions(cls, text: str) -> None:
        cls.__doc__ = text


class LibraryPromptSignature(dspy.Signature, metaclass=_VerbatimInstructions):
    """A signature whose instructions are a library prompt, kept byte for byte.

    Subclasses set ``__doc__`` to the library's text. ``with_instructions``
    (what ``PromptSite.set_instructions``, SIMBA, GEPA and ``load_state`` call)
    returns a sibling of the same kind, so rewritten instructions stay verbatim too.
    """

    @classmethod
    def with_instructions(cls, instructions: str) -> type[dspy.Signature]:
        # Derive from the site's own signature class, not from the last rewrite, so
        # a long optimization does not grow an ever deeper chain of subclasses.
        root = next(c for c in cls.__mro__ if LibraryPromptSignature in c.__bases__)
        return type(root)(
            root.__name__,
            (root,),
            {
                "__doc__": instructions,
                "__module__": root.__module__,
                "__qualname__": root.__qualname__,
            },
        )

    @classmethod
    def append_instructions(cls, instructions: str) -> type[dspy.Signature]:
        return cls.with_instructions(f"{cls.instructions}\n\n{instructions}")

    @classmethod
    def prepend_instructions(cls, instructions: str) -> type[dspy.Signature]:
        return cls.with_instructions(f"{instructions}\n\n{cls.instructions}")

    @classmethod
    def load_state(cls, state: dict) -> type[dspy.Signature]:
        # Only the instructions: saved field prefixes and descriptions are never rendered by
        # the library layout (the user message is the library's), and the fields are shared
        # with the seed class, so they must not be mutated here.
        return cls.with_instructions(state["instructions"])


# --- mem0.extract ------------------------------------------------------------------------


# The shape of one entry of mem0's answer. mem0 stores ``text`` (skipping empty ones),
# copies a truthy ``attributed_to`` into the memory's payload and ignores ``id`` and
# ``linked_memory_ids`` (2.2.1 only ADDs); the prompt asks for all four, as typed here.
# No docstring or descriptions: they would enter the response schema sent to the model,
# and the prompt already documents every field.
class ExtractedMemory(BaseModel):
    id: str
    text: str
    attributed_to: str
    linked_memory_ids: list[str] = Field(default_factory=list)


class Mem0Extract(LibraryPromptSignature):
    __doc__ = ADDITIVE_EXTRACTION_PROMPT

    user_content: str = dspy.InputField(
        desc="mem0's extraction user prompt (summary, last messages, existing "
        "memories, new messages, dates), verbatim"
    )
    memory: list[ExtractedMemory] = dspy.OutputField(desc="the memories to ADD")


# --- mem0.rerank -------------------------------------------------------------------------


class Mem0Rerank(LibraryPromptSignature):
    # Vanilla mem0 asks for free text and takes the first number in it; this site asks
    # for {"score": x} so a small model decodes under a schema, and the system hands
    # mem0 the number as text. The messages are the library's; only the answer format differs.
    __doc__ = RERANK_SYSTEM_PROMPT

    user_content: str = dspy.InputField(
        desc='LLMReranker\'s user message: "Query: ...\\n\\nDocument: ..."'
    )
    score: float = dspy.OutputField(desc="relevance between 0.0 and 1.0")
