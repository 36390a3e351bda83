"""``builtin:assistant``: an end-to-end personal-assistant suite, 20 hand-written probes over 6
users.

Each episode is one user talking to their assistant over two or three conversations
(sessions, days apart); the questions come after the last one, as if asked in it. Every
probe checks one thing an assistant memory must do; its ``task_type`` names it, two
probes each:

=======================  ===========================================================
store                    a fact the user asked to be remembered
same_session_recall      a detail of the last conversation (the one still open)
cross_session_recall     a detail of an earlier conversation
multi_fact               several facts in one message, all asked back (``contains_all``)
selective_recall         one of several similar facts; the others are ``forbidden``
update                   a value changed later; the old value is ``forbidden``
forget                   a value the user asked to forget: the answer must abstain and
                         must not name it (``abstain`` + ``forbidden``)
implicit_info            a fact only implied ("take Juniper to the vet ... barking")
numbers                  a number, code or time stated once
absent_person            a person never mentioned: the answer must abstain
=======================  ===========================================================

Names and values are made up for this suite. Kept as Python data, like the other
built-ins, so an installed wheel needs no package data.
"""

from __future__ import annotations

from typing import Any

from optloop.datasets._model import Episode, Question, Session, Turn

PROBES = (
    "store",
    "same_session_recall",
    "cross_session_recall",
    "multi_fact",
    "selective_recall",
    "update",
    "forget",
    "implicit_info",
    "numbers",
    "absent_person",
)
FORGOTTEN_GOLD = "Nothing: the user asked for it to be forgotten."
UNKNOWN_GOLD = "Unknown: this person was never mentioned."

# (episode id, [(date, [user, assistant, user, assistant, ...])], [question fields])
_Raw = tuple[str, list[tuple[str, list[str]]], list[dict[str, Any]]]
_EPISODES: list[_Raw] = [
    (
        "assistant-harbor",
        [
            (
                "2024-09-02",
                [
                    "Please remember that my favourite herbal tea is rooibos.",
                    "Noted: rooibos it is.",
                    "Also, my gym locker is number 317.",
                    "Got it, locker 317.",
                ],
            ),
            (
                "2024-09-06",
                ["My niece Odalys starts primary school next week.", "Exciting times for her!"],
            ),
            (
                "2024-09-09",
                [
                    "Can you recommend a board game for four players?",
                    "Carcassonne or Ticket to Ride both work well with four.",
                    "Great, I'll pick one up on the way home.",
                    "Have fun!",
                ],
            ),
        ],
        [
            dict(
                question="What is my favourite herbal tea?",
                gold="rooibos",
                evidence_ids=["s1:t1"],
                task_type="store",
                scorer="contains",
            ),
            dict(
                question="What is my gym locker number?",
                gold="317",
                evidence_ids=["s1:t3"],
                task_type="numbers",
                scorer="contains",
            ),
            dict(
                question="What is my niece's name?",
                gold="Odalys",
                evidence_ids=["s2:t1"],
                task_type="cross_session_recall",
                scorer="contains",
            ),
            dict(
                question="Where does my colleague Fenwick live?",
                gold=UNKNOWN_GOLD,
                task_type="absent_person",
                scorer="abstain",
                abstain=True,
            ),
        ],
    ),
    (
        "assistant-kestrel",
        [
            (
                "2024-10-01",
                [
                    "Quick facts about me: I was born in Tarragona, I work as a "
                    "hydrologist, and my cat is "
                    "called Pimento.",
                    "Lovely, noted all three.",
                ],
            ),
            (
                "2024-10-03",
                [
                    "Ugh, I have to take Juniper to the vet again, she keeps chasing the "
                    "neighbours' ducks and barking all night.",
                    "Oh no, I hope the vet can calm her down!",
                    "I parked on level 4 of the Carvell garage today.",
                    "Okay: level 4, Carvell garage.",
                    "Any tips for a quiet lunch spot nearby?",
                    "A bench in the park with a sandwich is hard to beat.",
                ],
            ),
        ],
        [
            dict(
                question="Where was I born, what is my job, and what is my cat called?",
                gold="Tarragona, hydrologist, Pimento",
                evidence_ids=["s1:t1"],
                task_type="multi_fact",
                scorer="contains_all",
            ),
            dict(
                question="Which garage did I park in today?",
                gold="Carvell",
                evidence_ids=["s2:t3"],
                task_type="same_session_recall",
                scorer="contains",
                meta={"asked_in_session": "s2"},
            ),
            dict(
                question="What is my dog's name?",
                gold="Juniper",
                evidence_ids=["s2:t1"],
                task_type="implicit_info",
                scorer="contains",
            ),
        ],
    ),
    (
        "assistant-lumen",
        [
            (
                "2024-11-04",
                [
                    "I live in Valdemoro.",
                    "Noted.",
                    "The code for my storage unit is 5829.",
                    "Saved.",
                ],
            ),
            (
                "2024-11-12",
                [
                    "Big news, I just moved to Ourense!",
                    "Congratulations on the move!",
                    "Please forget the code for my storage unit, I don't want it stored anymore.",
                    "Done, I've forgotten it.",
                ],
            ),
            (
                "2024-11-15",
                ["My train to Lugo departs at 07:52 from platform 6.", "Safe travels!"],
            ),
        ],
        [
            dict(
                question="Which town do I live in?",
                gold="Ourense",
                evidence_ids=["s2:t1"],
                task_type="update",
                scorer="contains",
                forbidden=["Valdemoro"],
                meta={"stale_values": ["Valdemoro"]},
            ),
            dict(
                question="What is the code for my storage unit?",
                gold=FORGOTTEN_GOLD,
                evidence_ids=["s2:t3"],
                task_type="forget",
                scorer="abstain",
                abstain=True,
                forbidden=["5829"],
            ),
            dict(
                question="Which platform does my train to Lugo leave from?",
                gold="6",
                evidence_ids=["s3:t1"],
                task_type="numbers",
                scorer="contains",
            ),
            dict(
                question="What time does my train to Lugo depart?",
                gold="07:52",
                evidence_ids=["s3:t1"],
                task_type="same_session_recall",
                scorer="contains",
                meta={"asked_in_session": "s3"},
            ),
        ],
    ),
    (
        "assistant-quill",
        [
            (
                "2025-01-10",
                [
                    "My sister is Marisol, my brother is Anselmo, and my cousin is Leocadia.",
                    "Thanks, got all three.",
                    "My manager at work is called Birgitta.",
                    "Noted.",
                ],
            ),
            (
                "2025-01-18",
                [
                    "I switched teams, so my manager is now Osvaldo.",
                    "Good luck with the new team!",
                ],
            ),
            (
                "2025-01-25",
                [
                    "Please forget my cousin's name.",
                    "Done, it's forgotten.",
                    "Can you suggest a quick dinner?",
                    "A vegetable stir-fry takes fifteen minutes.",
                ],
            ),
        ],
        [
            dict(
                question="What is my brother's name?",
                gold="Anselmo",
                evidence_ids=["s1:t1"],
                task_type="selective_recall",
                scorer="contains",
                forbidden=["Marisol", "Leocadia"],
            ),
            dict(
                question="Who is my manager now?",
                gold="Osvaldo",
                evidence_ids=["s2:t1"],
                task_type="update",
                scorer="contains",
                forbidden=["Birgitta"],
                meta={"stale_values": ["Birgitta"]},
            ),
            dict(
                question="What is my cousin's name?",
                gold=FORGOTTEN_GOLD,
                evidence_ids=["s3:t1"],
                task_type="forget",
                scorer="abstain",
                abstain=True,
                forbidden=["Leocadia"],
            ),
            dict(
                question="When is Ferdinand's birthday?",
                gold=UNKNOWN_GOLD,
                task_type="absent_person",
                scorer="abstain",
                abstain=True,
            ),
        ],
    ),
    (
        "assistant-sorrel",
        [
            (
                "2025-02-03",
                [
                    "Birthdays to remember: Nayeli on 4 March, Cosmin on 19 July and "
                    "Ottilie on 2 December.",
                    "All three are saved.",
                ],
            ),
            (
                "2025-02-10",
                [
                    "I can't eat anything with gluten, so the bakery trip was a bust for me.",
                    "Sorry to hear that! Many bakeries have gluten-free options now.",
                    "What should I bring to a picnic?",
                    "A blanket, water and some snacks.",
                ],
            ),
        ],
        [
            dict(
                question="When are the birthdays of Nayeli, Cosmin and Ottilie?",
                gold="4 March, 19 July, 2 December",
                evidence_ids=["s1:t1"],
                task_type="multi_fact",
                scorer="contains_all",
            ),
            dict(
                question="When is Cosmin's birthday?",
                gold="19 July",
                evidence_ids=["s1:t1"],
                task_type="selective_recall",
                scorer="contains",
                forbidden=["4 March", "2 December"],
            ),
            dict(
                question="What ingredient can I not eat?",
                gold="gluten",
                evidence_ids=["s2:t1"],
                task_type="implicit_info",
                scorer="contains",
            ),
        ],
    ),
    (
        "assistant-tamarind",
        [
            (
                "2025-03-01",
                ["Remember that my car is a green Skoda Fabia.", "Noted: a green Skoda Fabia."],
            ),
            (
                "2025-03-08",
                [
                    "My best friend Radomir is visiting from Brno in April.",
                    "How nice, enjoy the visit!",
                ],
            ),
            (
                "2025-03-09",
                [
                    "What's a good museum for a rainy day?",
                    "A science museum keeps everyone busy for hours.",
                ],
            ),
        ],
        [
            dict(
                question="What car do I drive?",
                gold="Skoda Fabia",
                evidence_ids=["s1:t1"],
                task_type="store",
                scorer="contains",
            ),
            dict(
                question="Which city is my best friend Radomir visiting from?",
                gold="Brno",
                evidence_ids=["s2:t1"],
                task_type="cross_session_recall",
                scorer="contains",
            ),
        ],
    ),
]


def assistant() -> list[Episode]:
    """The ``builtin:assistant`` episodes."""
    episodes = []
    for episode_id, raw_sessions, raw_questions in _EPISODES:
        sessions = [
            Session(
                id=f"s{k}",
                timestamp=date,
                turns=[
                    Turn(id=f"s{k}:t{j}", role="user" if j % 2 else "assistant", content=text)
                    for j, text in enumerate(lines, 1)
                ],
            )
            for k, (date, lines) in enumerate(raw_sessions, 1)
        ]
        questions = [
            Question(id=f"{episode_id}:q{i}", **{"meta": {}, **fields})
            for i, fields in enumerate(raw_questions, 1)
        ]
        episodes.append(
            Episode(
                id=episode_id,
                sessions=sessions,
                questions=questions,
                meta={"source": "builtin:assistant"},
            )
        )
    return episodes
