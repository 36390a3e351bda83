"""Small deterministic datasets shipped in code: ``builtin:<name>`` (``builtin:`` = tiny).

``tiny``   4 hand-written episodes, 2 sessions each, 2-3 short questions each, mixing
           exact recall, update (the latest value wins) and multi-session recall.
           Answers are single words, so even a 135M model sometimes gets them right;
           the demo and the tests default to it.
``suite``  ``synthetic:suite?seed=0`` (the end-to-end memory check-list).
``meme``   ``synthetic:meme?seed=0&episodes=2`` (one episode per domain).
``assistant``  20 hand-written personal-assistant probes over 6 users
           (:mod:`optloop.datasets.assistant`): store, recall in and across
           sessions, several facts, update, forget, implicit facts, numbers, and
           abstention on a person never mentioned.

Kept as Python data rather than package files so an installed wheel needs no
package-data configuration.
"""

from __future__ import annotations

from collections.abc import Callable

from optloop.datasets._model import Episode, Question, Session, Turn
from optloop.errors import DatasetError

# (episode id, [(timestamp, [user, assistant, user, ...])], [(question, gold, evidence ids, task
# type)])
_Sessions = list[tuple[str, list[str]]]
_Questions = list[tuple[str, str, list[str], str]]
_TINY: list[tuple[str, _Sessions, _Questions]] = [
    (
        "tiny-pet",
        [
            (
                "2024-03-01",
                [
                    "My dog is named Biscuit.",
                    "Biscuit is a lovely name!",
                    "I live in Denver.",
                    "Noted.",
                ],
            ),
            ("2024-04-10", ["I moved to Austin last week.", "Congratulations on the move!"]),
        ],
        [
            ("What is my dog's name?", "Biscuit", ["s1:t1"], "exact_recall"),
            ("Which city do I live in now?", "Austin", ["s2:t1"], "update"),
        ],
    ),
    (
        "tiny-food",
        [
            ("2024-05-02", ["My favorite fruit is mango.", "Mangoes are great."]),
            ("2024-05-20", ["I am allergic to peanuts.", "I'll keep that in mind."]),
        ],
        [
            ("What is my favorite fruit?", "mango", ["s1:t1"], "exact_recall"),
            ("What am I allergic to?", "peanuts", ["s2:t1"], "exact_recall"),
            (
                "Name my favorite fruit and my allergy.",
                "mango, peanuts",
                ["s1:t1", "s2:t1"],
                "multi_session",
            ),
        ],
    ),
    (
        "tiny-work",
        [
            (
                "2024-06-03",
                ["I work as a nurse.", "That's important work.", "My car is red.", "Nice."],
            ),
            ("2024-07-15", ["I painted my car blue.", "Blue is a good color."]),
        ],
        [
            ("What is my job?", "nurse", ["s1:t1"], "exact_recall"),
            ("What color is my car now?", "blue", ["s2:t1"], "update"),
        ],
    ),
    (
        "tiny-family",
        [
            ("2024-08-01", ["My sister is called Lena.", "Nice to hear about Lena."]),
            ("2024-08-09", ["Lena has a cat named Tom.", "Cute!"]),
        ],
        [
            ("What is my sister's name?", "Lena", ["s1:t1"], "exact_recall"),
            ("What is the name of my sister's cat?", "Tom", ["s1:t1", "s2:t1"], "multi_session"),
        ],
    ),
]


def tiny() -> list[Episode]:
    """The ``builtin:tiny`` episodes."""
    episodes = []
    for episode_id, raw_sessions, raw_questions in _TINY:
        sessions = [
            Session(
                id=f"s{k}",
                timestamp=stamp,
                turns=[
                    Turn(id=f"s{k}:t{j}", role="user" if j % 2 else "assistant", content=text)
                    for j, text in enumerate(lines, 1)
                ],
            )
            for k, (stamp, lines) in enumerate(raw_sessions, 1)
        ]
        questions = [
            Question(
                id=f"{episode_id}:q{i}",
                question=text,
                gold=gold,
                evidence_ids=evidence,
                task_type=task,
                scorer="contains_all" if "," in gold else "contains",
                meta={},
            )
            for i, (text, gold, evidence, task) in enumerate(raw_questions, 1)
        ]
        episodes.append(
            Episode(
                id=episode_id,
                sessions=sessions,
                questions=questions,
                meta={"source": "builtin:tiny"},
            )
        )
    return episodes


def _suite() -> list[Episode]:
    from optloop.datasets.synthetic import load_synthetic

    return load_synthetic("suite", {"seed": "0"})[1]


def _meme() -> list[Episode]:
    from optloop.datasets.synthetic import load_synthetic

    return load_synthetic("meme", {"seed": "0", "episodes": "2"})[1]


def _assistant() -> list[Episode]:
    from optloop.datasets.assistant import assistant

    return assistant()


BUILTINS: dict[str, Callable[[], list[Episode]]] = {
    "tiny": tiny,
    "suite": _suite,
    "meme": _meme,
    "assistant": _assistant,
}


def load_builtin(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Load a built-in dataset by name (empty name = ``tiny``)."""
    name = rest.strip() or "tiny"
    if name not in BUILTINS:
        raise DatasetError(
            f"builtin:{rest}: unknown built-in dataset {name!r} (one of: {', '.join(BUILTINS)})"
        )
    return f"builtin:{name}", BUILTINS[name]()
