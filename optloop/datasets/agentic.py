"""Agent memory under state: ``agentic:<path>`` (a jsonl layout) and ``agentic:generate?...``
(seeded).

A coding or ops agent writes memories while it works. Each memory belongs to a **workspace** (and
a path in it), has a **status** (``active``, or ``superseded`` once a later completed run wrote a
new value for the same key) and carries the **branch status** of the run that wrote it
(``completed``, ``failed`` or ``rolled_back``). Probes ask for a value where that state decides
the answer (categories ``dead_branch``, ``superseded``, ``clean_recall``,
``failed_branch_truth``); :func:`score_context` scores what a system put in front of the answer
(recall, contamination, cross-workspace leakage, clean context).

Layout (``agentic:<path>``): one episode per line, :class:`AgenticEpisode`::

    {"id": "ep1",
     "facts": [{"id": "f001", "run": "r001", "key": "api.port", "value": "24817",
                "content": "The API server listens on port 24817.", "workspace": "billing",
                "path": "services/api", "status": "active", "branch": "completed"}, ...],
     "probes": [{"id": "p1", "question": "Which port does the API server listen on?",
                 "gold": "24817", "workspace": "billing", "path": "services/api",
                 "category": "dead_branch", "recall": ["24817"], "distractors": ["8080"]}]}

Each episode becomes an :class:`~optloop.datasets.Episode`, one session per run, every turn
ending in the tag line :mod:`systems.gated` reads (``@run``, ``@fact``, ``@end``). Nothing here
calls an LM. The categories, the episode's turns and the generator: ``docs/systems.md``
(``gated``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from optloop.datasets._io import (
    dataset_error,
    existing_file,
    int_param,
    read_jsonl_models,
    validation_error,
)
from optloop.datasets._model import Episode, Question, Session, Turn
from optloop.datasets.scorers import normalize_answer

Status = Literal["active", "superseded"]
Branch = Literal["completed", "failed", "rolled_back"]
DEAD_BRANCHES: tuple[str, ...] = ("failed", "rolled_back")
CATEGORIES = ("dead_branch", "superseded", "clean_recall", "failed_branch_truth")
SESSION_KIND = "agent_run"
GENERATE = "generate"
GENERATE_PARAMS = ("records", "seed", "probes", "workspaces")

# --------------------------------------------------------------------------- the agent log format

TAGS = ("run", "fact", "end")
_TAG = re.compile(r"^@(?P<kind>run|fact|end) (?P<json>\{.*\})\s*$")
_SCOPE = re.compile(
    r"^\s*\[workspace\s+(?P<workspace>[^\s,\]]+)"
    r"(?:\s*,\s*path\s+(?P<path>[^\]]*?))?\s*\]\s*(?P<rest>.*)$",
    re.S,
)


def tag_line(kind: str, data: dict[str, Any]) -> str:
    """``@<kind> {json}``: the machine-readable last line of an agent-log turn."""
    if kind not in TAGS:
        raise ValueError(f"unknown tag {kind!r} (one of {TAGS})")
    return f"@{kind} " + json.dumps(data, ensure_ascii=False, sort_keys=True)


def parse_tag(content: str) -> tuple[str, str | None, dict[str, Any]]:
    """``(text, kind, data)`` of a turn: the human-readable text, and its tag (``None``, ``{}``
    when untagged)."""
    head, _, last = content.rstrip().rpartition("\n")
    match = _TAG.match(last.strip())
    if match is None:
        return content.strip(), None, {}
    try:
        data = json.loads(match["json"])
    except json.JSONDecodeError:
        return content.strip(), None, {}
    return head.strip(), match["kind"], data if isinstance(data, dict) else {}


def scope_header(workspace: str, path: str = "") -> str:
    """``[workspace billing, path services/api]``: where a question is asked."""
    return f"[workspace {workspace}, path {path}]" if path else f"[workspace {workspace}]"


def parse_scope(question: str) -> tuple[str | None, str, str]:
    """``(workspace, path, question without the header)``; ``(None, "", question)`` when there is
    no header."""
    match = _SCOPE.match(question)
    if match is None:
        return None, "", question.strip()
    return match["workspace"], (match["path"] or "").strip().strip("/"), match["rest"].strip()


def path_matches(memory_path: str, query_path: str) -> bool:
    """Whether a memory written under ``memory_path`` applies at ``query_path``: one is a prefix of
    the other, segment by segment (an empty path is the whole workspace)."""
    mem = [p for p in memory_path.strip("/").split("/") if p]
    query = [p for p in query_path.strip("/").split("/") if p]
    return mem[: len(query)] == query or query[: len(mem)] == mem


# --------------------------------------------------------------------------- records


class AgenticFact(BaseModel):
    """One memory an agent run wrote."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    run: str = Field(min_length=1)
    key: str | None = None
    value: str | None = None
    content: str = Field(min_length=1)
    workspace: str = Field(min_length=1, pattern=r"^[^\s,\]]+$")
    path: str = ""
    status: Status = "active"
    branch: Branch = "completed"


class AgenticProbe(BaseModel):
    """One question, with the markers its context must and must not hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    gold: str = Field(min_length=1)
    workspace: str = Field(min_length=1)
    path: str = ""
    category: str = Field(min_length=1)
    key: str | None = None
    recall: list[str] = Field(min_length=1)
    distractors: list[str] = Field(default_factory=list)
    foreign: list[str] | None = None  # None: the values of every fact of another workspace


class AgenticEpisode(BaseModel):
    """One agent's history (facts, in order) and the probes asked after it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    facts: list[AgenticFact] = Field(min_length=1)
    probes: list[AgenticProbe] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> AgenticEpisode:
        ids: set[str] = set()
        runs: dict[str, tuple[str, str, str]] = {}
        closed: set[str] = set()
        previous: str | None = None
        for i, fact in enumerate(self.facts):
            if fact.id in ids:
                raise ValueError(f"facts[{i}].id: duplicate fact id {fact.id!r}")
            ids.add(fact.id)
            where = (fact.workspace, fact.path, fact.branch)
            if fact.run in closed:
                raise ValueError(
                    f"facts[{i}].run: run {fact.run!r} is not contiguous (a run is one session)"
                )
            if fact.run != previous and previous is not None:
                closed.add(previous)
            if runs.setdefault(fact.run, where) != where:
                raise ValueError(
                    f"facts[{i}].run: run {fact.run!r} mixes workspaces, paths or branch statuses "
                    f"({runs[fact.run]} vs {where})"
                )
            previous = fact.run
        for run in runs:
            if {f"{run}:start", f"{run}:end"} & ids:
                raise ValueError(
                    f"facts: a fact id collides with the turn ids of run {run!r} "
                    f"({run}:start/{run}:end)"
                )
        for i, fact in enumerate(self.facts):
            later = _superseding(self.facts, i)
            if later is not None and fact.status == "active":
                raise ValueError(
                    f"facts[{i}].status: {fact.id} is marked active, but {later.id} (a later "
                    "completed run, same workspace and key) supersedes it; mark it superseded"
                )
        probe_ids: set[str] = set()
        workspaces = {f.workspace for f in self.facts}
        for j, probe in enumerate(self.probes):
            if probe.id in probe_ids:
                raise ValueError(f"probes[{j}].id: duplicate probe id {probe.id!r}")
            probe_ids.add(probe.id)
            if probe.workspace not in workspaces:
                raise ValueError(
                    f"probes[{j}].workspace: no fact was written in workspace {probe.workspace!r}"
                )
            for marker in probe.recall:
                if not any(
                    mentions(f.content, marker) or (f.value and mentions(f.value, marker))
                    for f in self.facts
                ):
                    raise ValueError(f"probes[{j}].recall: marker {marker!r} appears in no fact")
        return self


def _superseding(facts: Sequence[AgenticFact], i: int) -> AgenticFact | None:
    """The later fact that supersedes ``facts[i]``: same workspace and key, a completed run, itself
    active."""
    fact = facts[i]
    if fact.key is None:
        return None
    return next(
        (
            f
            for f in facts[i + 1 :]
            if f.key == fact.key
            and f.workspace == fact.workspace
            and f.branch == "completed"
            and f.status == "active"
        ),
        None,
    )


# --------------------------------------------------------------------------- records -> episodes

_OUTCOME = {
    "completed": "completed; its changes were merged",
    "failed": "failed; its checks did not pass",
    "rolled_back": "was rolled back; its changes were reverted",
}


def to_episode(record: AgenticEpisode) -> Episode:
    """The episode a memory system sees: one ``agent_run`` session per run, tagged turns, scoped
    questions."""
    sessions: list[Session] = []
    runs: list[list[AgenticFact]] = []
    for fact in record.facts:
        if runs and runs[-1][0].run == fact.run:
            runs[-1].append(fact)
        else:
            runs.append([fact])
    for index, facts in enumerate(runs):
        first = facts[0]
        where = first.path or "the workspace root"
        turns = [
            Turn(
                id=f"{first.run}:start",
                role="system",
                content=(
                    f"Agent run {first.run} started in workspace {first.workspace} ({where}).\n"
                    + tag_line(
                        "run", {"run": first.run, "workspace": first.workspace, "path": first.path}
                    )
                ),
            )
        ]
        for fact in facts:
            tag: dict[str, Any] = {"key": fact.key, "value": fact.value}
            if (
                fact.status == "superseded"
                and _superseding(record.facts, record.facts.index(fact)) is None
            ):
                # said explicitly: no later fact in the log supersedes it
                tag["status"] = "superseded"
            turns.append(
                Turn(
                    id=fact.id,
                    role="assistant",
                    content=f"{fact.content}\n{tag_line('fact', tag)}",
                )
            )
        turns.append(
            Turn(
                id=f"{first.run}:end",
                role="system",
                content=(
                    f"Run {first.run} {_OUTCOME[first.branch]}.\n"
                    + tag_line("end", {"run": first.run, "branch": first.branch})
                ),
            )
        )
        sessions.append(
            Session(id=first.run, timestamp=_stamp(index), turns=turns, kind=SESSION_KIND)
        )
    questions = []
    for probe in record.probes:
        foreign = (
            probe.foreign
            if probe.foreign is not None
            else [f.value for f in record.facts if f.workspace != probe.workspace and f.value]
        )
        evidence = [
            f.id
            for f in record.facts
            if f.workspace == probe.workspace
            and any(
                mentions(f.content, m) or (f.value and mentions(f.value, m)) for m in probe.recall
            )
        ]
        forbidden = [
            v
            for v in dict.fromkeys([*probe.distractors, *foreign])
            if not any(mentions(v, r) or mentions(r, v) for r in (probe.gold, *probe.recall))
        ]
        questions.append(
            Question(
                id=probe.id,
                question=f"{scope_header(probe.workspace, probe.path)} {probe.question}",
                gold=probe.gold,
                evidence_ids=evidence,
                task_type=probe.category,
                scorer="contains",
                forbidden=forbidden,
                meta={
                    "category": probe.category,
                    "workspace": probe.workspace,
                    "path": probe.path,
                    "key": probe.key,
                    "recall": list(probe.recall),
                    "distractors": list(probe.distractors),
                    "foreign": list(foreign),
                },
            )
        )
    return Episode(
        id=record.id, sessions=sessions, questions=questions, meta={"format": "agentic"}
    )


def _stamp(index: int) -> str:
    day, hour = divmod(index, 8)
    return f"2025-03-{1 + day % 28:02d}T{9 + hour:02d}:00"


# --------------------------------------------------------------------------- metrics


def mentions(text: str, marker: str) -> bool:
    """Whether ``text`` names ``marker``: whole words, after SQuAD normalization (case,
    punctuation)."""
    needle = normalize_answer(marker)
    return bool(needle) and f" {needle} " in f" {normalize_answer(text)} "


class ContextScore(BaseModel):
    """What one probe's context held (``positive``: what the answer is told to use; ``negative``:
    shown as something that did not work)."""

    question_id: str
    category: str
    recall: float  # share of recall markers in the positive context
    # share of recall markers anywhere in the context (negative evidence included)
    recall_any: float
    contaminated: bool  # a distractor marker in the positive context
    leaked: bool  # a foreign (other-workspace) marker anywhere in the context
    positive: int
    negative: int

    @property
    def clean(self) -> bool:
        return not self.contaminated and not self.leaked


def score_context(
    question: Question, positive: Sequence[str], negative: Sequence[str] = ()
) -> ContextScore:
    """Recall, contamination and leakage of one agentic probe's context."""
    meta = question.meta
    recall = [str(m) for m in meta.get("recall") or [question.gold]]
    shown = "\n".join(positive)
    everything = "\n".join([*positive, *negative])
    return ContextScore(
        question_id=question.id,
        category=str(meta.get("category") or question.task_type),
        recall=sum(mentions(shown, m) for m in recall) / len(recall),
        recall_any=sum(mentions(everything, m) for m in recall) / len(recall),
        contaminated=any(mentions(shown, str(m)) for m in meta.get("distractors") or []),
        leaked=any(mentions(everything, str(m)) for m in meta.get("foreign") or []),
        positive=len(positive),
        negative=len(negative),
    )


# --------------------------------------------------------------------------- generator

# key -> (path, question, templates for a value that holds, template for a value a run wrote, value
# kind)
_KEYS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "api.port": (
        "services/api",
        "Which port does the API server listen on?",
        (
            "The API server listens on port {v}.",
            "Set the API server port to {v} in services/api/config.yaml.",
            "The API is now served on port {v}.",
        ),
        "port",
    ),
    "db.host": (
        "services/api",
        "Which database host does the API connect to?",
        (
            "The API connects to the database host {v}.",
            "Pointed the API's database connection at {v}.",
            "The database host for the API is {v}.",
        ),
        "host",
    ),
    "cache.ttl": (
        "services/api",
        "What is the cache TTL of the API?",
        (
            "The API cache TTL is {v}.",
            "Set the API cache TTL to {v}.",
            "Response caching in the API expires after {v}.",
        ),
        "ttl",
    ),
    "schema.migration": (
        "services/api",
        "Which migration is the database schema at?",
        (
            "The schema is at migration {v}.",
            "Applied migration {v} to the schema.",
            "Database schema head is migration {v}.",
        ),
        "migration",
    ),
    "worker.queue": (
        "services/worker",
        "Which queue does the worker consume from?",
        (
            "The worker consumes from queue {v}.",
            "Switched the worker to consume queue {v}.",
            "Jobs reach the worker through queue {v}.",
        ),
        "queue",
    ),
    "worker.image": (
        "services/worker",
        "Which base image does the worker build from?",
        (
            "The worker image builds from {v}.",
            "Changed the worker's base image to {v}.",
            "The worker Dockerfile starts FROM {v}.",
        ),
        "image",
    ),
    "deploy.region": (
        "infra",
        "Which region does the service deploy to?",
        (
            "The service deploys to region {v}.",
            "Moved the deployment target to region {v}.",
            "Production runs in region {v}.",
        ),
        "region",
    ),
    "secret.db_password": (
        "infra",
        "Which secret holds the database password?",
        (
            "The database password lives in secret {v}.",
            "Stored the database password as secret {v}.",
            "The app reads its database password from secret {v}.",
        ),
        "secret",
    ),
    "logs.bucket": (
        "infra",
        "Which bucket receives the service logs?",
        (
            "Service logs are shipped to bucket {v}.",
            "Pointed log shipping at bucket {v}.",
            "The log sink writes to bucket {v}.",
        ),
        "bucket",
    ),
    "ci.integration_job": (
        ".ci",
        "Which CI job runs the integration tests?",
        (
            "The integration tests run in CI job {v}.",
            "Renamed the integration-test CI job to {v}.",
            "CI job {v} runs the integration suite.",
        ),
        "job",
    ),
    "ci.test_timeout": (
        ".ci",
        "What timeout do the integration tests use?",
        (
            "The integration tests time out after {v}.",
            "Raised the integration-test timeout to {v}.",
            "Integration tests are killed after {v}.",
        ),
        "timeout",
    ),
    "web.checkout_flag": (
        "services/web",
        "Which feature flag gates the new checkout page?",
        (
            "The new checkout page is behind feature flag {v}.",
            "Gated the new checkout behind flag {v}.",
            "Feature flag {v} turns the new checkout on.",
        ),
        "flag",
    ),
    "release.branch": (
        "",
        "Which branch are releases cut from?",
        (
            "Releases are cut from branch {v}.",
            "Switched the release branch to {v}.",
            "The release train leaves from branch {v}.",
        ),
        "branch",
    ),
    "python.version": (
        "",
        "Which Python version does the project pin?",
        (
            "The project pins Python {v}.",
            "Bumped the pinned Python version to {v}.",
            "The toolchain uses Python {v}.",
        ),
        "python",
    ),
}
_WORKSPACES = (
    "billing",
    "search",
    "auth",
    "payments",
    "ingest",
    "notify",
    "catalog",
    "reports",
    "gateway",
    "profiles",
    "ledger",
    "media",
)
_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "kr",
    "st",
    "tr",
)
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "x", "s")
_REGIONS = ("eu", "us", "ap", "sa", "me", "af")


class _Values:
    """Made-up values, unique within an episode and none a word of another (a marker names one
    fact)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self) -> str:
        return "".join(
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
            for _ in range(2)
        )

    def _make(self, kind: str) -> str:
        r, w = self.rng, self.word
        makers = {
            "port": lambda: str(r.randint(20000, 29999)),
            "host": lambda: f"db-{w()}-{r.randint(10, 99)}",
            "ttl": lambda: f"{r.randint(101, 997)}s",
            "migration": lambda: f"m{r.randint(1000, 9999)}_{w()}",
            "queue": lambda: f"q.{w()}.{r.randint(10, 99)}",
            "image": lambda: f"{w()}-base:{r.randint(2, 9)}.{r.randint(10, 99)}",
            "region": lambda: f"{r.choice(_REGIONS)}-{w()}-{r.randint(2, 9)}",
            "secret": lambda: f"sec/{w()}/db-{r.randint(10, 99)}",
            "bucket": lambda: f"logs-{w()}-{r.randint(100, 999)}",
            "job": lambda: f"it-{w()}-{r.randint(10, 99)}",
            "timeout": lambda: f"{r.randint(11, 99)}00ms",
            "flag": lambda: f"ff_{w()}_{r.randint(10, 99)}",
            "branch": lambda: f"release/{w()}-{r.randint(10, 99)}",
            "python": lambda: f"3.{r.randint(8, 13)}.{r.randint(20, 99)}",
        }
        return makers[kind]()

    def fresh(self, kind: str) -> str:
        for _ in range(1000):
            value = self._make(kind)
            if not any(mentions(u, value) or mentions(value, u) for u in self.used):
                self.used.add(value)
                return value
        raise RuntimeError("value generator exhausted")  # not reachable at these sizes


def _episode_record(
    rng: random.Random, episode_id: str, categories: Sequence[str], n_workspaces: int
) -> AgenticEpisode:
    values = _Values(rng)
    workspaces = rng.sample(_WORKSPACES, n_workspaces)
    n_keys = max(4, -(-len(categories) // n_workspaces) + 2)
    keys = rng.sample(sorted(_KEYS), min(n_keys, len(_KEYS)))
    pairs = [(ws, key) for ws in workspaces for key in keys]
    probed = rng.sample(pairs, len(categories))
    plan = dict(zip(probed, categories, strict=True))
    # phase -> list of (workspace, key, value, branch, template index): 0 = oldest state, 1 = base,
    # 2 = later runs
    phases: dict[int, list[tuple[str, str, str, str, int]]] = {0: [], 1: [], 2: []}
    probes: list[
        tuple[str, str, str, str, list[str]]
    ] = []  # (workspace, key, category, gold, distractors)
    for ws, key in pairs:
        kind = _KEYS[key][3]
        category = plan.get((ws, key), "filler")
        first = values.fresh(kind)
        if category == "failed_branch_truth":
            phases[2].append((ws, key, first, "failed", rng.randrange(3)))
            probes.append((ws, key, category, first, []))
            continue
        if category == "superseded" or (category == "filler" and rng.random() < 0.3):
            newer = values.fresh(kind)
            phases[0].append((ws, key, first, "completed", rng.randrange(3)))
            phases[1].append((ws, key, newer, "completed", rng.randrange(3)))
            if category == "superseded":
                probes.append((ws, key, category, newer, [first]))
            continue
        phases[1].append((ws, key, first, "completed", rng.randrange(3)))
        if category == "dead_branch" or (category == "filler" and rng.random() < 0.3):
            dead = values.fresh(kind)
            phases[2].append(
                (
                    ws,
                    key,
                    dead,
                    "rolled_back" if rng.random() < 1 / 3 else "failed",
                    rng.randrange(3),
                )
            )
            if category == "dead_branch":
                probes.append((ws, key, category, first, [dead]))
        elif category == "clean_recall":
            probes.append((ws, key, category, first, []))
    facts: list[AgenticFact] = []
    run_no = 0
    for phase in (0, 1, 2):
        groups: dict[tuple[str, str, str], list[tuple[str, str, str, str, int]]] = {}
        items_of_phase = list(phases[phase])
        rng.shuffle(items_of_phase)  # runs of one phase interleave
        for item in items_of_phase:
            ws, key, _, branch, _ = item
            groups.setdefault((ws, _KEYS[key][0], branch), []).append(item)
        runs: list[list[tuple[str, str, str, str, int]]] = []
        for items in groups.values():
            while items:
                size = rng.randint(1, 3)
                runs.append(items[:size])
                items = items[size:]
        rng.shuffle(runs)
        for run in runs:
            run_no += 1
            for ws, key, value, branch, template in run:
                facts.append(
                    AgenticFact(
                        id=f"f{len(facts) + 1:03d}",
                        run=f"r{run_no:03d}",
                        key=key,
                        value=value,
                        content=_KEYS[key][2][template].format(v=value),
                        workspace=ws,
                        path=_KEYS[key][0],
                        branch=branch,
                    )
                )
    facts = [
        f.model_copy(update={"status": "superseded"}) if _superseding(facts, i) else f
        for i, f in enumerate(facts)
    ]
    probe_records = [
        AgenticProbe(
            id=f"{episode_id}:p{j + 1}",
            question=_KEYS[key][1],
            gold=gold,
            workspace=ws,
            path=_KEYS[key][0],
            category=category,
            key=key,
            recall=[gold],
            distractors=distractors,
        )
        for j, (ws, key, category, gold, distractors) in enumerate(
            sorted(probes, key=lambda p: probed.index((p[0], p[1])))
        )
    ]
    return AgenticEpisode(id=episode_id, facts=facts, probes=probe_records)


def generate_records(
    records: int = 2000, seed: int = 0, probes: int = 8, workspaces: int = 3
) -> list[AgenticEpisode]:
    """``records`` probes over episodes of ``probes`` each; categories rotate, so each has a
    quarter."""
    if not 2 <= workspaces <= len(_WORKSPACES):
        raise ValueError(f"workspaces must be 2..{len(_WORKSPACES)}")
    rng = random.Random(seed)
    out: list[AgenticEpisode] = []
    done = 0
    while done < records:
        size = min(probes, records - done)
        categories = [CATEGORIES[(done + i) % len(CATEGORIES)] for i in range(size)]
        out.append(_episode_record(rng, f"agentic-{seed}-{len(out):04d}", categories, workspaces))
        done += size
    return out


# --------------------------------------------------------------------------- files and the loader


def write_agentic_jsonl(records: Iterable[AgenticEpisode], path: str | Path) -> Path:
    """Write records in the ``agentic:`` layout (one :class:`AgenticEpisode` per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.model_dump_json(exclude_defaults=True) + "\n")
    return path


def read_agentic_jsonl(path: Path) -> list[AgenticEpisode]:
    return read_jsonl_models(path, AgenticEpisode, "one agentic episode")


def load_agentic(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """``agentic:generate?records=&seed=&probes=&workspaces=`` or ``agentic:<path>``."""
    if rest.strip() == GENERATE:
        uri = f"agentic:{GENERATE}"
        unknown = sorted(set(params) - set(GENERATE_PARAMS))
        if unknown:
            raise dataset_error(
                uri,
                None,
                unknown[0],
                f"unknown query parameter (accepted: {', '.join(GENERATE_PARAMS)})",
            )
        records = int_param(uri, params, "records", 1, 2000) or 2000
        seed = int_param(uri, params, "seed", 0, 0) or 0
        probes = int_param(uri, params, "probes", 1, 8) or 8
        workspaces = int_param(uri, params, "workspaces", 2, 3) or 3
        if workspaces > len(_WORKSPACES):
            raise dataset_error(uri, None, "workspaces", f"at most {len(_WORKSPACES)}")
        generated = generate_records(records, seed, probes, workspaces)
        name = (
            f"agentic:generate?records={records}&seed={seed}&probes={probes}"
            f"&workspaces={workspaces}"
        )
        return name, [to_episode(r) for r in generated]
    if params:
        raise dataset_error(
            f"agentic:{rest}",
            None,
            sorted(params)[0],
            "unknown query parameter (a file takes none; "
            "the generator takes records, seed, probes, workspaces)",
        )
    path = existing_file(rest, "agentic")
    try:
        return f"agentic:{path.stem}", [to_episode(r) for r in read_agentic_jsonl(path)]
    # an episode the records could not become (a bug, or a record past the checks)
    except ValidationError as exc:
        raise validation_error(path, None, exc) from None


__all__ = [
    "CATEGORIES",
    "AgenticEpisode",
    "AgenticFact",
    "AgenticProbe",
    "ContextScore",
    "generate_records",
    "load_agentic",
    "mentions",
    "parse_scope",
    "parse_tag",
    "path_matches",
    "read_agentic_jsonl",
    "scope_header",
    "score_context",
    "tag_line",
    "to_episode",
    "write_agentic_jsonl",
]
