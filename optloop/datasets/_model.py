"""The one data model every benchmark is loaded into.

An :class:`Episode` is what a memory system sees and is asked about: ordered
:class:`Session` s of :class:`Turn` s (ingested), then :class:`Question` s (answered
after all sessions). Every loader, the generators and the ``jsonl:`` format produce
exactly these models; ``Episode.model_dump_json()`` *is* the ``jsonl:`` line format.

Contracts (checked when an ``Episode`` is built, so a bad file fails at load time):

- turn ids are unique within an episode (loaders use ``"s<k>:t<j>"``; ``jsonl:``
  data may use any strings), session ids are unique, question ids are unique;
- every ``Question.evidence_ids`` entry names a turn of the episode;
- ``scorer == "multiple_choice"`` needs ``options`` (2..26 of them) and a gold that
  is one of their letters (``"A"``, ``"B"``, ...);
- ``abstain`` questions (the right answer is "I don't know") use ``scorer="abstain"``;
- every other question has a gold answer that is not blank.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ScorerName = Literal[
    "exact",
    "contains",
    "contains_all",
    "f1",
    "f1_multi",
    "yes_no",
    "multiple_choice",
    "abstain",
    "llm_judge",
]
"""How a prediction is compared with the gold answer; see :mod:`optloop.datasets.scorers`."""

LETTERS = string.ascii_uppercase


class Turn(BaseModel):
    """One message of a session.

    ``role`` is ``"user"`` or ``"assistant"`` (a two-speaker dialogue such as LoCoMo
    uses ``"user"`` for both and names the speaker in ``speaker``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    role: str = Field(min_length=1)
    content: str
    speaker: str | None = None


class Session(BaseModel):
    """A conversation ingested in one go; ``timestamp`` is the source's own string."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    timestamp: str | None = None
    turns: list[Turn]
    kind: str = "conversation"


class Question(BaseModel):
    """A question asked after the episode's sessions, with everything needed to grade it.

    ``gold`` is the reference answer (for multiple choice: the letter of the right
    option). ``evidence_ids`` are the turn ids that support the gold answer (empty for
    abstention questions: nothing supports an answer). ``task_type`` names the
    benchmark task (``"cascade"``, ``"multi-hop"`` ...). ``scorer`` fixes how the
    answer is graded; it is set by the loader from the task, never guessed at scoring
    time. ``forbidden`` lists stale or deleted values that must not appear in a
    correct prediction (a prediction containing one scores 0).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    gold: str
    evidence_ids: list[str] = Field(default_factory=list)
    task_type: str = Field(min_length=1)
    scorer: ScorerName
    options: list[str] | None = None
    abstain: bool = False
    forbidden: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_task(self) -> Question:
        # Messages start with the field they are about; loaders turn that into the location.
        if not self.gold.strip() and self.scorer != "abstain":
            raise ValueError(
                "gold: empty, so every answer would be graded wrong; give the "
                "expected answer, or mark a question whose right answer is \"I don't "
                'know" with "abstain": true'
            )
        if self.scorer == "multiple_choice":
            if not self.options or not 2 <= len(self.options) <= len(LETTERS):
                raise ValueError("options: a multiple_choice question needs 2 to 26 options")
            letters = LETTERS[: len(self.options)]
            if self.gold not in letters:
                raise ValueError(
                    f"gold: {self.gold!r} must be one of the option letters {letters}"
                )
        if self.abstain and self.scorer != "abstain":
            raise ValueError("scorer: an abstain question must use scorer='abstain'")
        return self


class Episode(BaseModel):
    """Sessions to ingest, then questions to answer; the unit of splitting and caching."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    sessions: list[Session]
    questions: list[Question]
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_ids(self) -> Episode:
        seen_sessions: set[str] = set()
        seen_turns: set[str] = set()
        for i, session in enumerate(self.sessions):
            if session.id in seen_sessions:
                raise ValueError(f"sessions[{i}].id: duplicate session id {session.id!r}")
            seen_sessions.add(session.id)
            for j, turn in enumerate(session.turns):
                if turn.id in seen_turns:
                    raise ValueError(f"sessions[{i}].turns[{j}].id: duplicate turn id {turn.id!r}")
                seen_turns.add(turn.id)
        seen_questions: set[str] = set()
        for k, question in enumerate(self.questions):
            if question.id in seen_questions:
                raise ValueError(f"questions[{k}].id: duplicate question id {question.id!r}")
            seen_questions.add(question.id)
            missing = [e for e in question.evidence_ids if e not in seen_turns]
            if missing:
                raise ValueError(f"questions[{k}].evidence_ids: unknown turn ids {missing}")
        return self

    def all_turns(self) -> list[Turn]:
        """Every turn, in ingestion order."""
        return [turn for session in self.sessions for turn in session.turns]

    def turn(self, turn_id: str) -> Turn:
        """The turn with this id; ``KeyError`` if there is none."""
        for session in self.sessions:
            for turn in session.turns:
                if turn.id == turn_id:
                    return turn
        raise KeyError(f"episode {self.id!r} has no turn {turn_id!r}")

    def session_of(self, turn_id: str) -> Session:
        """The session holding this turn; ``KeyError`` if there is none."""
        for session in self.sessions:
            if any(turn.id == turn_id for turn in session.turns):
                return session
        raise KeyError(f"episode {self.id!r} has no turn {turn_id!r}")


class Dataset(BaseModel):
    """A loaded dataset: ``name`` for display and tracking, ``uri`` to load it again."""

    model_config = ConfigDict(extra="forbid")

    name: str
    uri: str
    episodes: list[Episode]

    def __len__(self) -> int:
        return len(self.episodes)

    def questions(self) -> list[tuple[Episode, Question]]:
        """Every (episode, question) pair, in order."""
        return [(episode, q) for episode in self.episodes for q in episode.questions]

    def episode(self, episode_id: str) -> Episode:
        """The episode with this id; ``KeyError`` if there is none."""
        for episode in self.episodes:
            if episode.id == episode_id:
                return episode
        raise KeyError(f"dataset {self.name!r} has no episode {episode_id!r}")


@dataclass(frozen=True)
class EvidencePart:
    """One piece of what an answer needs: a fact, a change of a root fact, or a retraction.

    Loaders that know their evidence part by part (MEME's published layout) store these, as
    :meth:`to_json`, in ``Question.meta["evidence_parts"]``; attribution checks each part in turn.
    """

    turn_id: str
    entity: str
    value: str
    kind: str = "fact"  # fact | change | retraction

    @property
    def label(self) -> str:
        return f"{self.kind} {self.entity}={self.value[:40]!r}"

    def to_json(self) -> dict[str, str]:
        return {
            "turn_id": self.turn_id,
            "entity": self.entity,
            "value": self.value,
            "kind": self.kind,
        }
