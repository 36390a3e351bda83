"""Seeded generators: ``synthetic:meme?seed=K&episodes=N&fillers=F&domain=D``,
``synthetic:suite?seed=K`` and ``synthetic:recall?seed=K&episodes=N``.

``synthetic:meme`` builds MEME-style episodes (the records :mod:`optloop.datasets.meme` reads),
each asking all six MEME tasks once, with gold answers and evidence turns resolved by replaying the
statements on a tiny world model (:class:`_World`), not written by hand. ``synthetic:suite`` is an
end-to-end memory check-list, one small episode per check. ``synthetic:recall`` is the plainest
memory task at any size: three made-up facts stated, two asked after an unrelated session
(scorer ``contains``), so even a 135M model's score depends on what memory kept and retrieved.
The same seed gives identical output; every value is a made-up name so a model cannot know it.
Each generator's tasks: ``docs/systems.md`` ("Generated datasets").
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from optloop.datasets._io import dataset_error, int_param
from optloop.datasets._model import Episode, Question, Session, Turn
from optloop.datasets.meme import episode_from_record
from optloop.datasets.scorers import normalize_answer
from optloop.errors import DatasetError

TurnRef = tuple[int, int]  # (session idx, 0-based turn index)
DOMAINS = ("workplace", "household")
SUITE_CHECKS = (
    "store",
    "same_session_recall",
    "cross_session_recall",
    "multi_fact",
    "selective_recall",
    "update",
    "forget",
    "implicit_info",
    "numbers",
)

# --------------------------------------------------------------------------- names

_ONSETS = [
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gl",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "r",
    "s",
    "st",
    "t",
    "th",
    "v",
    "w",
    "z",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ei", "ou"]
_CODAS = ["", "", "", "", "n", "r", "l", "s", "x", "m"]
_CITY_SUFFIXES = ["ton", "mere", "vale", "stead", "port", "ford", "holm", "wick"]


class _Names:
    """Fresh made-up names; none is a substring of another (so scoring is unambiguous)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: list[str] = []

    def _fresh(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            candidate = make()
            key = normalize_answer(candidate)
            if len(key) >= 3 and all(key not in u and u not in key for u in self.used):
                self.used.append(key)
                return candidate
        raise RuntimeError("name generator exhausted")  # not reachable with these pools

    def _word(self, syllables: int) -> str:
        parts = [
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
            for _ in range(syllables)
        ]
        return "".join(parts).capitalize()

    def word(self) -> str:
        return self._fresh(lambda: self._word(2))

    def person(self) -> str:
        return self._fresh(lambda: f"{self._word(2)} {self._word(2)}")

    def city(self) -> str:
        return self._fresh(lambda: self._word(1) + self.rng.choice(_CITY_SUFFIXES))

    def code(self) -> str:
        letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
        return self._fresh(
            lambda: (
                "".join(self.rng.choice(letters) for _ in range(2))
                + f"-{self.rng.randint(1000, 9999)}"
            )
        )


# --------------------------------------------------------------------------- world model


@dataclass
class _World:
    """Base facts, set-valued facts, deletions and derived rules, with provenance.

    ``resolve(key)`` returns the current value (``None`` when never stated or deleted)
    and the turns it rests on: for a rule, the rule's own turn plus every turn of the
    facts the rule read, so cascade evidence follows the DAG.
    """

    facts: dict[str, tuple[Any, list[TurnRef]]] = field(default_factory=dict)
    rules: dict[str, tuple[Callable[[Callable[[str], Any]], Any], TurnRef]] = field(
        default_factory=dict
    )

    def set(self, key: str, value: str, at: TurnRef) -> None:
        self.facts[key] = (value, [at])

    def delete(self, key: str, at: TurnRef) -> None:
        self.facts[key] = (None, [at])

    def add(self, key: str, item: str, at: TurnRef) -> None:
        items, turns = self.facts.get(key, ((), []))
        self.facts[key] = ((*items, item), [*turns, at])

    def rule(self, key: str, fn: Callable[[Callable[[str], Any]], Any], at: TurnRef) -> None:
        self.rules[key] = (fn, at)

    def resolve(self, key: str) -> tuple[Any, list[TurnRef]]:
        if key in self.rules:
            fn, at = self.rules[key]
            evidence: list[TurnRef] = [at]

            def get(dep: str) -> Any:
                value, turns = self.resolve(dep)
                evidence.extend(t for t in turns if t not in evidence)
                return value

            value = fn(get)
            return value, evidence if value is not None else []
        value, turns = self.facts.get(key, (None, []))
        return value, list(turns)


@dataclass
class _Event:
    """One user statement: its text, the facts it conveys, and its effect on the world."""

    text: str
    apply: Callable[[_World, TurnRef], None]
    facts: list[tuple[str, str]] = field(default_factory=list)  # (entity, value)


@dataclass
class _Task:
    """One question and the ordered statements it depends on."""

    task_type: str
    events: list[_Event]
    question: str
    key: str
    render: Callable[[Any], str]


def _list_gold(value: Any) -> str:
    return ", ".join(value)


def _states(text: str, key: str, value: str, entity: str) -> _Event:
    """A statement that sets ``key`` to ``value``."""
    return _Event(text, lambda w, at: w.set(key, value, at), [(entity, value)])


def _adds(text: str, key: str, item: str, entity: str) -> _Event:
    """A statement that adds ``item`` to the set ``key``."""
    return _Event(text, lambda w, at: w.add(key, item, at), [(entity, item)])


def _retracts(text: str, key: str, entity: str) -> _Event:
    """A statement that deletes ``key``."""
    return _Event(text, lambda w, at: w.delete(key, at), [(entity, "deleted")])


def _derives(text: str, key: str, link: str, entity: str) -> _Event:
    """A rule: ``key`` is the home city of whoever ``link`` currently names."""

    def rule(get: Callable[[str], Any]) -> Any:
        person = get(link)
        return None if person is None else get(f"home:{person}")

    return _Event(
        text,
        lambda w, at: w.rule(key, rule, at),
        [(entity, "the city its " + link.split(":")[0] + " lives in")],
    )


def _relinks(text: str, link: str, person: str, city: str, entity: str) -> _Event:
    """A statement that points ``link`` at a new person and says where they live."""

    def apply(w: _World, at: TurnRef) -> None:
        w.set(link, person, at)
        w.set(f"home:{person}", city, at)

    return _Event(text, apply, [(entity, person), (person, city)])


def _cascade(
    rng: random.Random,
    rule: _Event,
    link_event: _Event,
    person: str,
    city1: str,
    moved: _Event,
    relinked: _Event,
) -> list[_Event]:
    """Rule, link, root; then either the root moves or the link is reassigned (seeded coin)."""
    change = moved if rng.random() < 0.5 else relinked
    root = _states(f"{person} lives in {city1}.", f"home:{person}", city1, person)
    return [rule, link_event, root, change]


def _workplace(names: _Names, rng: random.Random) -> tuple[str, list[_Task]]:
    project = names.word()
    badge = names.code()
    tools = [names.word() for _ in range(3)]
    managers = [names.person() for _ in range(rng.choice((2, 3)))]
    colleague = names.person()
    weekday = rng.choice(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"])
    lead, new_lead = names.person(), names.person()
    city1, city2 = names.city(), names.city()
    office, link = f"office:{project}", f"lead:{project}"
    meeting = f"standing meeting with {colleague}"
    cascade = _cascade(
        rng,
        _derives(
            f"Project {project}'s office is always in whatever city its lead lives in.",
            office,
            link,
            f"project {project} office",
        ),
        _states(
            f"{lead} is the lead of project {project}.", link, lead, f"project {project} lead"
        ),
        lead,
        city1,
        _states(f"Big news: {lead} just moved to {city2}.", f"home:{lead}", city2, lead),
        _relinks(
            f"{new_lead}, who lives in {city2}, has taken over as lead of project {project}.",
            link,
            new_lead,
            city2,
            f"project {project} lead",
        ),
    )
    tasks = [
        _Task(
            "exact_recall",
            [_states(f"My employee badge number is {badge}.", "badge", badge, "badge")],
            "What is my employee badge number?",
            "badge",
            str,
        ),
        _Task(
            "aggregation",
            [
                _adds(f"I've started using a tool called {t} at work.", "tools", t, "work tools")
                for t in tools
            ],
            "Which tools have I said I use at work?",
            "tools",
            _list_gold,
        ),
        _Task(
            "tracking",
            [_states(f"My manager is {managers[0]}.", "manager", managers[0], "manager")]
            + [
                _states(f"There was a reorg; my manager is now {m}.", "manager", m, "manager")
                for m in managers[1:]
            ],
            "Who is my manager now?",
            "manager",
            str,
        ),
        _Task(
            "deletion",
            [
                _states(
                    f"I have a standing meeting with {colleague} every {weekday}.",
                    meeting,
                    weekday,
                    meeting,
                ),
                _retracts(
                    f"The standing meeting with {colleague} has been cancelled for good, "
                    "please forget it.",
                    meeting,
                    meeting,
                ),
            ],
            f"When is my standing meeting with {colleague}?",
            meeting,
            str,
        ),
        _Task(
            "cascade", cascade, f"In which city is project {project}'s office now?", office, str
        ),
        _Task(
            "absence",
            [],
            f"What is the budget code of project {project}?",
            f"budget:{project}",
            str,
        ),
    ]
    return f"project {project}", tasks


def _household(names: _Names, rng: random.Random) -> tuple[str, list[_Task]]:
    family = names.word()
    dentist = names.person()
    species = rng.sample(
        ["ferret", "parrot", "tortoise", "rabbit", "gecko", "cat", "dog", "hamster"], 3
    )
    pets = [names.word() for _ in range(3)]
    plates = [names.code() for _ in range(rng.choice((2, 3)))]
    gym = names.word()
    host, new_host = names.person(), names.person()
    city1, city2 = names.city(), names.city()
    reunion, link = f"reunion:{family}", "host:reunion"
    cascade = _cascade(
        rng,
        _derives(
            f"The {family} family reunion is always held in the city where its host lives.",
            reunion,
            link,
            f"{family} family reunion",
        ),
        _states(
            f"My aunt {host} is hosting the {family} family reunion.", link, host, "reunion host"
        ),
        host,
        city1,
        _states(f"Guess what, {host} moved to {city2} last week.", f"home:{host}", city2, host),
        _relinks(
            f"From now on my cousin {new_host}, who lives in {city2}, hosts the reunion.",
            link,
            new_host,
            city2,
            "reunion host",
        ),
    )
    tasks = [
        _Task(
            "exact_recall",
            [_states(f"My dentist is Dr. {dentist}.", "dentist", dentist, "dentist")],
            "What is the name of my dentist?",
            "dentist",
            str,
        ),
        _Task(
            "aggregation",
            [
                _adds(f"We adopted a {s} named {p}.", "pets", p, f"pet {s}")
                for s, p in zip(species, pets)
            ],
            "What are the names of all my pets?",
            "pets",
            _list_gold,
        ),
        _Task(
            "tracking",
            [
                _states(
                    f"My car's license plate is {plates[0]}.", "plate", plates[0], "license plate"
                )
            ]
            + [
                _states(
                    f"I had to get new plates; my car's license plate is now {p}.",
                    "plate",
                    p,
                    "license plate",
                )
                for p in plates[1:]
            ],
            "What is my car's license plate now?",
            "plate",
            str,
        ),
        _Task(
            "deletion",
            [
                _states(f"I'm a member of the {gym} gym.", "gym", gym, "gym"),
                _retracts(f"I cancelled my {gym} gym membership, so drop that.", "gym", "gym"),
            ],
            "Which gym am I a member of?",
            "gym",
            str,
        ),
        _Task(
            "cascade",
            cascade,
            f"In which city will the {family} family reunion be held?",
            reunion,
            str,
        ),
        _Task("absence", [], "What is my dentist's phone number?", "dentist phone", str),
    ]
    return f"the {family} family", tasks


# Chit-chat for filler sessions: (user line, assistant reply); "{name}" gets a fresh made-up name.
_FILLERS: list[tuple[str, str]] = [
    (
        "I'm reading a novel called {name}; the pacing is slow but I like it.",
        "Slow novels often pay off at the end.",
    ),
    (
        "Any tips for sleeping better on hot nights?",
        "Keep the room dark, drink water, and try a fan near a window.",
    ),
    (
        "I tried baking sourdough again and it came out flat.",
        "Flat loaves usually mean the starter needs more time.",
    ),
    ("A new cafe called {name} opened near me.", "Nice, a new cafe is always worth a visit."),
    (
        "What's a good stretch after a long walk?",
        "A standing calf stretch and a gentle hamstring stretch work well.",
    ),
    (
        "The weather has been so grey lately.",
        "Grey weeks are tough; a short walk at midday can help.",
    ),
    (
        "I watched a documentary about the {name} islands.",
        "Documentaries about islands are great for armchair travel.",
    ),
    ("How long should I steep green tea?", "About two to three minutes at around 80 degrees."),
]
_ACKS = [
    "Got it, I'll remember that.",
    "Noted.",
    "Thanks for letting me know.",
    "Okay, noted!",
    "Understood.",
]
_ABSTAIN_GOLD = {
    "deletion": "Nothing: that was cancelled.",
    "absence": "Unknown: it was never mentioned.",
}


def _meme_record(seed: int, index: int, domain: str, fillers: int) -> dict[str, Any]:
    """One MEME record (see :mod:`optloop.datasets.meme`), gold computed by replay."""
    rng = random.Random(seed * 1_000_003 + index)
    names = _Names(rng)
    root, tasks = (_workplace if domain == "workplace" else _household)(names, rng)

    # Place each task's statements in strictly increasing evidence sessions.
    n_evidence = max(len(t.events) for t in tasks) + rng.randint(0, 1)
    placed: list[list[_Event]] = [[] for _ in range(n_evidence)]
    for task in tasks:
        for slot, event in zip(
            sorted(rng.sample(range(n_evidence), len(task.events))), task.events
        ):
            placed[slot].append(event)
    for events in placed:
        rng.shuffle(events)  # one event per task per session, so order within a session is free
    total = n_evidence + fillers
    filler_slots = set(rng.sample(range(total), fillers))

    world = _World()
    history: dict[str, list[Any]] = {t.key: [] for t in tasks}
    sessions: list[dict[str, Any]] = []
    date = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 200))
    evidence_iter = iter(placed)
    for idx in range(total):
        date += dt.timedelta(days=rng.randint(1, 9))
        if idx in filler_slots:
            line, reply = rng.choice(_FILLERS)
            if "{name}" in line:
                line = line.format(name=names.word())
            conversation = [
                {"role": "user", "content": line},
                {"role": "assistant", "content": reply},
            ]
            sessions.append(
                {
                    "idx": idx,
                    "kind": "filler",
                    "timestamp": date.isoformat(),
                    "conversation": conversation,
                    "gold_facts": [],
                }
            )
            continue
        conversation = []
        gold_facts: list[dict[str, Any]] = []
        for event in next(evidence_iter):
            at = (idx, len(conversation))
            conversation.append({"role": "user", "content": event.text})
            conversation.append({"role": "assistant", "content": rng.choice(_ACKS)})
            event.apply(world, at)
            gold_facts += [
                {"entity": e, "value": v, "fact_text": event.text, "conveyed_in_turn": at[1]}
                for e, v in event.facts
            ]
            for task in tasks:  # record every value a question's answer has had, for stale values
                value = world.resolve(task.key)[0]
                if value is not None and (not history[task.key] or history[task.key][-1] != value):
                    history[task.key].append(value)
        sessions.append(
            {
                "idx": idx,
                "kind": "evidence",
                "timestamp": date.isoformat(),
                "conversation": conversation,
                "gold_facts": gold_facts,
            }
        )

    questions = []
    for task in tasks:
        value, evidence = world.resolve(task.key)
        abstain = task.task_type in _ABSTAIN_GOLD
        # the construction guarantees this; fail loudly if a template breaks it
        if abstain != (value is None):
            raise RuntimeError(
                f"synthetic:meme {task.task_type}: propagated value {value!r} contradicts the task"
            )
        # Values the answer used to have (and must not be given now); a growing set has none.
        stale = (
            [] if task.task_type == "aggregation" else [v for v in history[task.key] if v != value]
        )
        questions.append(
            {
                "id": f"meme-s{seed}-e{index}:{task.task_type}",
                "task_type": task.task_type,
                "question": task.question,
                "gold_answer": _ABSTAIN_GOLD[task.task_type] if abstain else task.render(value),
                "evidence_turns": [list(t) for t in sorted(evidence)],
                "meta": {"stale_values": stale},
            }
        )
    evidence_indices = [s["idx"] for s in sessions if s["kind"] == "evidence"]
    return {
        "episode": {
            "id": f"meme-s{seed}-e{index}",
            "domain": domain,
            "root": root,
            "evidence_session_indices": evidence_indices,
            "meta": {"generator": "synthetic:meme", "seed": seed},
        },
        "sessions": sessions,
        "questions": questions,
    }


def meme_records(
    seed: int = 0, episodes: int = 4, fillers: int = 2, domain: str | None = None
) -> list[dict[str, Any]]:
    """MEME records for ``synthetic:meme`` (write them as JSON to get a ``meme:`` file)."""
    domains = [domain] if domain else list(DOMAINS)
    return [_meme_record(seed, i, domains[i % len(domains)], fillers) for i in range(episodes)]


# --------------------------------------------------------------------------- suite


def _session(sid: str, timestamp: str, *lines: str) -> Session:
    """A session of alternating user / assistant lines, starting with the user."""
    turns = [
        Turn(id=f"{sid}:t{j}", role="user" if j % 2 else "assistant", content=c)
        for j, c in enumerate(lines, 1)
    ]
    return Session(id=sid, timestamp=timestamp, turns=turns)


def _suite(seed: int) -> list[Episode]:
    rng = random.Random(seed * 7_919 + 17)
    names = _Names(rng)
    day = dt.date(2024, 6, 1) + dt.timedelta(days=rng.randint(0, 100))
    d1, d2 = day.isoformat(), (day + dt.timedelta(days=3)).isoformat()
    episodes: list[Episode] = []

    def add(check: str, sessions: list[Session], *questions: dict[str, Any]) -> None:
        eid = f"suite-s{seed}-{check}"
        # Evidence is the first user turn unless a question says otherwise.
        qs = [
            Question(id=f"{eid}:q{i}", task_type=check, **{"evidence_ids": ["s1:t1"], **q})
            for i, q in enumerate(questions, 1)
        ]
        meta = {"generator": "synthetic:suite", "seed": seed, "check": check}
        episodes.append(Episode(id=eid, sessions=sessions, questions=qs, meta=meta))

    tea = names.word()
    add(
        "store",
        [_session("s1", d1, f"Please remember that my favourite tea is {tea} tea.", "Noted!")],
        dict(question="What is my favourite tea?", gold=tea, scorer="contains"),
    )
    garage = names.word()
    add(
        "same_session_recall",
        [
            _session(
                "s1",
                d1,
                f"I parked in the {garage} garage today.",
                "Okay.",
                "Can you suggest a podcast for the drive home?",
                "Try a history podcast; episodes are short.",
            )
        ],
        dict(
            question="Which garage did I park in today?",
            gold=garage,
            scorer="contains",
            meta={"asked_in_session": "s1"},
        ),
    )
    niece = names.word()
    add(
        "cross_session_recall",
        [
            _session("s1", d1, f"My niece {niece} turns seven next month.", "How lovely!"),
            _session(
                "s2", d2, "Any ideas for a rainy weekend?", "Board games, baking, or a long film."
            ),
        ],
        dict(question="What is my niece's name?", gold=niece, scorer="contains"),
    )
    born, cat = names.city(), names.word()
    instrument = rng.choice(["oboe", "cello", "banjo", "harp", "theremin", "bassoon"])
    add(
        "multi_fact",
        [
            _session(
                "s1",
                d1,
                f"Quick facts about me: I was born in {born}, my cat is called {cat}, "
                f"and I play the {instrument}.",
                "Great, noted all three.",
            )
        ],
        dict(
            question="Where was I born, what is my cat called, and which instrument do I play?",
            gold=f"{born}, {cat}, {instrument}",
            scorer="contains_all",
        ),
    )
    sister, brother, cousin = names.word(), names.word(), names.word()
    add(
        "selective_recall",
        [
            _session(
                "s1",
                d1,
                f"My sister is {sister}, my brother is {brother}, and my cousin is {cousin}.",
                "Thanks, got it.",
            )
        ],
        dict(
            question="What is my brother's name?",
            gold=brother,
            scorer="contains",
            forbidden=[sister, cousin],
        ),
    )
    old_city, new_city = names.city(), names.city()
    add(
        "update",
        [
            _session("s1", d1, f"I live in {old_city}.", "Noted."),
            _session("s2", d2, f"I just moved to {new_city}!", "Congratulations on the move!"),
        ],
        dict(
            question="Which city do I live in?",
            gold=new_city,
            scorer="contains",
            evidence_ids=["s2:t1"],
            forbidden=[old_city],
            meta={"stale_values": [old_city]},
        ),
    )
    code = names.code()
    add(
        "forget",
        [
            _session("s1", d1, f"My locker code is {code}.", "Saved."),
            _session(
                "s2",
                d2,
                "Please forget my locker code, I don't want it stored anymore.",
                "Done, I've forgotten it.",
            ),
        ],
        dict(
            question="What is my locker code?",
            gold="Nothing: it was forgotten on request.",
            scorer="abstain",
            abstain=True,
            evidence_ids=["s2:t1"],
            forbidden=[code],
        ),
    )
    dog = names.word()
    add(
        "implicit_info",
        [
            _session(
                "s1",
                d1,
                f"Ugh, I have to take {dog} to the vet again, he chewed up another one of "
                "my socks.",
                "Oh no, I hope he's okay!",
            )
        ],
        dict(question="What is my dog's name?", gold=dog, scorer="contains"),
    )
    flight = f"{rng.choice(['QZ', 'XV', 'JP'])}{rng.randint(100, 9999)}"
    seat = f"{rng.randint(2, 39)}{rng.choice('ABCDEF')}"
    gate = f"{rng.choice('BCDE')}{rng.randint(2, 48)}"
    add(
        "numbers",
        [
            _session(
                "s1",
                d1,
                f"My flight {flight} leaves from gate {gate} and my seat is {seat}.",
                "Have a good flight!",
            )
        ],
        dict(question="What is my seat number?", gold=seat, scorer="contains"),
        dict(question="What is my flight number?", gold=flight, scorer="contains"),
    )
    return episodes


# --------------------------------------------------------------------------- recall

# (statement, question) with the value's slot; ``kind`` picks the made-up value's shape.
_RECALL_FACTS: list[tuple[str, str, str]] = [
    ("My dog is named {v}.", "What is my dog's name?", "word"),
    ("My cat is called {v}.", "What is my cat's name?", "word"),
    ("My favourite tea is {v} tea.", "What is my favourite tea?", "word"),
    ("I work for a company called {v}.", "Which company do I work for?", "word"),
    ("I live in {v}.", "Which city do I live in?", "city"),
    ("I was born in {v}.", "Where was I born?", "city"),
    ("My sister is called {v}.", "What is my sister's name?", "word"),
    ("My best friend is {v}.", "Who is my best friend?", "person"),
    ("My manager at work is {v}.", "Who is my manager?", "person"),
    ("My locker number is {v}.", "What is my locker number?", "code"),
    ("My favourite band is {v}.", "What is my favourite band?", "word"),
    ("My boat is named {v}.", "What is my boat's name?", "word"),
]
_RECALL_ACKS = ["Noted.", "Got it.", "Thanks for telling me.", "I'll remember that.", "Okay!"]
_RECALL_CHATS = [
    ("Any tips for sleeping better?", "Keep a regular bedtime and avoid screens late at night."),
    ("What should I cook tonight?", "A vegetable stir-fry is quick and easy."),
    ("Can you suggest a book?", "A short mystery novel could be fun."),
    ("How do I keep my plants alive?", "Water them regularly and give them some sun."),
]


def _recall(seed: int, episodes: int) -> list[Episode]:
    rng = random.Random(seed * 104_729 + 31)
    names = _Names(rng)
    value = {"word": names.word, "city": names.city, "person": names.person, "code": names.code}
    day = dt.date(2024, 3, 1) + dt.timedelta(days=rng.randint(0, 100))
    out: list[Episode] = []
    for i in range(episodes):
        eid = f"recall-s{seed}-e{i}"
        facts = rng.sample(_RECALL_FACTS, 3)
        values = [value[kind]() for _, _, kind in facts]
        lines: list[str] = []
        for (statement, _, _), v in zip(facts, values):
            lines += [statement.format(v=v), rng.choice(_RECALL_ACKS)]
        d1 = (day + dt.timedelta(days=2 * i)).isoformat()
        d2 = (day + dt.timedelta(days=2 * i + 1)).isoformat()
        sessions = [_session("s1", d1, *lines), _session("s2", d2, *rng.choice(_RECALL_CHATS))]
        asked = sorted(rng.sample(range(3), 2))
        questions = [
            Question(
                id=f"{eid}:q{k}",
                task_type="exact_recall",
                question=facts[j][1],
                gold=values[j],
                scorer="contains",
                evidence_ids=[f"s1:t{2 * j + 1}"],
            )
            for k, j in enumerate(asked, 1)
        ]
        out.append(
            Episode(
                id=eid,
                sessions=sessions,
                questions=questions,
                meta={"generator": "synthetic:recall", "seed": seed},
            )
        )
    return out


# --------------------------------------------------------------------------- loader


GENERATORS = ("meme", "suite", "recall")
PARAMS = {
    "meme": {"seed", "episodes", "fillers", "domain"},
    "suite": {"seed"},
    "recall": {"seed", "episodes"},
}


def load_synthetic(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Generate ``meme``, ``suite`` or ``recall``; returns the dataset name and its episodes."""
    kind = rest.strip()
    uri = f"synthetic:{kind}"
    if kind not in GENERATORS:
        raise DatasetError(
            f"synthetic:{rest}: unknown generator {kind!r} (one of: {', '.join(GENERATORS)})"
        )
    unknown = sorted(set(params) - PARAMS[kind])
    if unknown:
        raise dataset_error(
            uri,
            None,
            unknown[0],
            f"unknown query parameter (accepted: {', '.join(sorted(PARAMS[kind]))})",
        )
    seed = int_param(uri, params, "seed", 0, 0)
    if kind == "suite":
        return f"synthetic:suite?seed={seed}", _suite(seed)
    if kind == "recall":
        episodes = int_param(uri, params, "episodes", 1, 20)
        return f"synthetic:recall?seed={seed}&episodes={episodes}", _recall(seed, episodes)
    domain = params.get("domain")
    if domain is not None and domain not in DOMAINS:
        raise dataset_error(
            uri, None, "domain", f"unknown domain {domain!r} (one of: {', '.join(DOMAINS)})"
        )
    records = meme_records(
        seed,
        int_param(uri, params, "episodes", 1, 4),
        int_param(uri, params, "fillers", 0, 2),
        domain,
    )
    memes = [
        episode_from_record(r, uri, f"episode {i}", f"meme-{i}") for i, r in enumerate(records)
    ]
    return f"synthetic:meme?seed={seed}", memes
