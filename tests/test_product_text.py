"""The product speaks of the product: no tracked text names how the work on it was organised.

Every file git tracks (code, comments, docs, CLI values, reports, tests, results JSON, fixtures) is
scanned for references a user cannot resolve: a tracker's issue numbers, numbered or relative work
periods, dates of work (a results file's provenance date is the product's own), the people or
agents who did the work, and notes between them (paths of the workspaces they shared). The
examples at the end of this file show each kind; this file, which defines the rule, is the one
file not scanned.

Conversations are part of the domain: MEME and LoCoMo episodes are made of numbered sessions, so a
line that names a session is a work period only when nothing on it speaks of conversation data
(:data:`CONVERSATION`: an episode, a snapshot, a probe, a turn, something stored, deleted or asked,
a memory ...) or when the session number is a parenthetical annotation of the text around it,
which is how work periods were written and never how a conversation is.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ISSUE = re.compile(r"\bissues?[ _#-]*\d+\b", re.IGNORECASE)
SESSION_N = re.compile(r"\bsession ?#?\d+\b", re.IGNORECASE)
SESSION_NOTE = re.compile(r"\(session ?\d+\b|\bsession ?\d+\)|,\s*session ?\d+\b", re.IGNORECASE)
RELATIVE_SESSION = re.compile(
    r"\b(?:this|that|the previous|the next|the last|an earlier|a later|earlier|later|"
    r"previous|next|last) session\b",
    re.IGNORECASE,
)
CONVERSATION = re.compile(
    r"conversation|episode|snapshot|probe|\bturns?\b|dialog|ingest|\bstor(?:e|ed|es)\b|"
    r"delet|\basked\b|memor|\bunits?\b|\bfacts?\b|meme|locomo|sw_0|^\s*#+ ?session|"
    r"#+ ?session \d",
    re.IGNORECASE,
)
PEOPLE = re.compile(
    r"`\w+` (?:engineer|helper)s?\b|\bhelper (?:session|agent)s?\b|\bsub-?agents?\b|"
    r"\bengineers? (?:on|of) (?:this|the) (?:project|team)\b|"
    r"\bthe lead\b(?! of\b)(?!'s)(?= (?:runs|will|merges|reconciles|reviews|asked|said|wants)\b)",
    re.IGNORECASE,
)
WORK_DATE = re.compile(
    r"\b(?:written|decided|fixed|noted|planned) (?:on|in) (?:19|20)\d\d-\d\d-\d\d\b", re.IGNORECASE
)
NOTES = re.compile(
    r"/work/wt/|/_notes\b|\bpreamble\.md\b|\bworker notes\b|\bthis round of work\b|"
    r"\bnotes? (?:to|for) the (?:next|other) (?:engineer|session|worker)s?\b",
    re.IGNORECASE,
)


def process_references(line: str) -> list[str]:
    """What on ``line`` refers to how the work was organised (empty: nothing)."""
    found = [
        m.group(0) for pattern in (ISSUE, PEOPLE, NOTES, WORK_DATE) for m in pattern.finditer(line)
    ]
    if SESSION_NOTE.search(line):
        found += [m.group(0) for m in SESSION_NOTE.finditer(line)]
    elif not CONVERSATION.search(line):
        found += [
            m.group(0) for pattern in (SESSION_N, RELATIVE_SESSION) for m in pattern.finditer(line)
        ]
    return found


def tracked_text_files(root: Path) -> list[Path]:
    """Every file git tracks under ``root`` that reads as UTF-8 text."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout
    files = []
    for name in listing.decode().split("\0"):
        path = root / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def scan(root: Path) -> list[str]:
    """``path:line: text [what]`` for every reference in the tracked text files."""
    hits = []
    for path in tracked_text_files(root):
        if path.resolve() == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if found := process_references(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]} {found}")
    return hits


def test_no_tracked_text_refers_to_how_the_work_was_organised():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing tracked to scan")
    hits = scan(ROOT)
    assert not hits, (
        "text that refers to how the work was organised, not to the product; say what the "
        "product does instead:\n" + "\n".join(hits)
    )


# The rule itself, on lines built here (so this file holds none of them verbatim).
ISS, S = "iss" + "ue", "sess" + "ion"


@pytest.mark.parametrize(
    "line",
    [
        f"the faults {ISS} 21 added",
        f"`--faults {ISS}-21`",
        f"({ISS} #20)",
        f"see {ISS}s 19",
        f"Measured (2026-11-23, {S} 14); later",
        f"Seeds 1 and 2 ({S} 13, same command",
        f"first run ({S} 12, `x.md`)",
        f"the tests' size and time this {S}",
        "(minutes; the lead runs it)",
        "the `structure` engineer splits it",
        "a note for the next engineer",
        "read /work/wt/_notes/preamble.md",
        "# Fourth, written on 2026-11-23 after",
    ],
)
def test_a_reference_to_the_work_is_found(line):
    assert process_references(line)


@pytest.mark.parametrize(
    "line",
    [
        f"`meme:<checkout>` loads the episode as two (`sw_033-before`, asked after {S} 13, and",
        f"before {S} 14 nor `#aurora-pager`/the runbook URL in any snapshot).",
        f'"""The dog\'s name is stored in {S} 1 and deleted in {S} 2; the walk says '
        'DeletionError."""',
        f"The store removes every unit that existed before this {S}.",
        f"DAILY (2024-01-02):\\n---\\n## {S.title()} 1\\nTeam lead is Ana.",
        "Kim is the lead of project Apollo.",
        "reword the lead's line",
        "GitHub: mem0ai/mem0/issues/2170",
        "each worker logs its trials as child runs",
        "a helper that formats the table",
    ],
)
def test_domain_text_is_not_a_reference_to_the_work(line):
    assert not process_references(line)
