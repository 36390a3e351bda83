"""An OpenAI-compatible endpoint on loopback that replays answers from an optloop LM cache file.

    python -m optloop.testing.replay --cache .optloop/lm_cache.sqlite \\
        --latency-ms 300 --jitter-ms 50 --seed 0 --rate-429 0.1 --retry-after 1

prints its base URL (``http://127.0.0.1:PORT/v1``) on the first line of stdout and serves until
interrupted; ``GET /stats`` returns what it served. ``optloop.run --lm openai:replay
--lm-base-url <url>`` then runs against it: the throughput benchmark's endpoint, whose answers
are the real ones recorded once from the embedded LM. A request is answered from the cache under
the key optloop's engine gives it (:func:`request_keys`), after a latency, or with an HTTP 429,
drawn from ``--seed`` and that key (:class:`ReplayConfig`), so a run at any concurrency sees the
same ones; what else a request can get: :meth:`ReplayServer.answer`.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import hashlib
import json
import logging
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from email.message import Message
from email.utils import formatdate
from pathlib import Path
from typing import Any, cast

from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.errors import ConfigError
from optloop.lm.cache import LMCache
from optloop.lm.grammar import SPACE_KEY
from optloop.lm.requests import Request, response_format_to_schema
from optloop.testing.loopback import LoopbackServer, Reply, chat_completion

logger = logging.getLogger(__name__)

# What a cache's schema calls may have been decoded under (``Backend.decoding``): the embedded
# model's default bounds and graphiti's (systems.graphiti_system.local_decoding), with and without
# the grammar's whitespace key, and an endpoint's modes.
DEFAULT_DECODINGS = (
    f"bounds:16x400;{SPACE_KEY}",
    f"bounds:3x80;{SPACE_KEY}",
    "bounds:16x400",  # caches written before the grammar's whitespace joined the key
    "bounds:3x80",
    "schema_mode:json_schema",
    "schema_mode:json_object",
)


def bundled_identity() -> str:
    """The identity the embedded LM writes its cache entries under
    (``LocalLlamaBackend.identity``)."""
    from optloop.lm.settings import bundled_model_path

    path = bundled_model_path()
    return f"local:{path.name}:{path.stat().st_size}"


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    """Every response in an optloop LM cache file, by key (read-only; the file may be in use)."""
    if not path.is_file():
        raise ConfigError(f"no LM cache at {path}; record one with a run on the embedded LM first")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT key, response FROM responses").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"{path} is not a readable optloop LM cache ({exc})") from None
    return {key: json.loads(response) for key, response in rows}


def request_of(body: dict[str, Any]) -> Request:
    """The :class:`Request` a chat-completions body carries (as optloop's engine keys it)."""
    schema, json_mode = response_format_to_schema(body.get("response_format"))
    stop = body.get("stop")
    return Request(
        messages=list(body.get("messages") or []),
        schema=schema,
        json_mode=json_mode,
        temperature=body.get("temperature", 0.0),
        max_tokens=cast(int, body.get("max_tokens")),
        seed=cast(int, body.get("seed")),
        stop=[stop] if isinstance(stop, str) else (stop or None),
    )


def request_keys(body: dict[str, Any], identity: str, decodings: Sequence[str]) -> list[str]:
    """The cache keys a chat-completions body may have been stored under, most specific first.

    The body is turned back into optloop's :class:`Request` (messages, response format,
    temperature, max_tokens, seed, stop) and keyed exactly as
    :class:`~optloop.lm.engine.OptloopEngine` keys its cache, under the model ``identity`` the
    cache was written with (``--identity``; default the bundled GGUF, ``local:<file>:<size>``)
    and, for a schema request, each of the backend ``decodings`` the cache may hold
    (``--decoding``; default :data:`DEFAULT_DECODINGS`). A request whose answer was sampled for a
    DSPy rollout cannot be found (its key holds the rollout id, which does not travel over HTTP);
    evaluations use none."""
    request = request_of(body)
    json_mode, schema = request.json_mode, request.schema
    payload = {"model": identity, **asdict(request), "rollout_id": None}
    keys = (
        [LMCache.key({**payload, "decoding": d}) for d in decodings]
        if json_mode and schema
        else []
    )
    return [*keys, LMCache.key(payload)]


def _probe_answer(body: dict[str, Any]) -> str | None:
    """The answer to one of optloop's start-up probes (schema mode, concurrency), None for any
    other request."""
    from optloop.lm.endpoint import SCHEMA_PROBE
    from optloop.lm.probe import CONCURRENCY_PROBE

    text = json.dumps(body.get("messages") or [])
    return (
        '{"city": "Lisbon"}'
        if SCHEMA_PROBE in text
        else "ok"
        if CONCURRENCY_PROBE in text
        else None
    )


def _unit(*parts: Any) -> float:
    """A number in [0, 1) fixed by ``parts``."""
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


@dataclass
class ReplayConfig:
    """The faults a replay injects, each drawn from ``seed``, the request's key and how many times
    that key was asked before: a latency of ``latency_ms + uniform(-jitter_ms, +jitter_ms)``
    before each answer, and HTTP 429 at once for a ``rate_429`` fraction of requests, with
    ``Retry-After: retry_after`` (seconds, or an HTTP date with ``retry_after_date``)."""

    latency_ms: float = 300.0
    jitter_ms: float = 50.0
    seed: int = 0
    rate_429: float = 0.0
    retry_after: float = 1.0
    # send Retry-After as an HTTP date (whole seconds) instead of seconds
    retry_after_date: bool = False

    def __post_init__(self) -> None:
        if self.latency_ms < 0 or self.jitter_ms < 0 or self.jitter_ms > self.latency_ms:
            raise ConfigError("latency must be >= 0 and jitter at most the latency")
        if not 0 <= self.rate_429 < 1:
            raise ConfigError("--rate-429 must be a fraction in [0, 1)")
        if self.retry_after < 0:
            raise ConfigError("--retry-after must be >= 0 seconds")

    def latency_s(self, key: str, occurrence: int = 0) -> float:
        """The injected latency of the ``occurrence``-th request for ``key`` (0-based)."""
        unit = _unit(self.seed, key, occurrence, "latency")
        return max(0.0, self.latency_ms + self.jitter_ms * (2 * unit - 1)) / 1000

    def refuses(self, key: str, occurrence: int = 0) -> bool:
        """Whether the ``occurrence``-th request for ``key`` gets HTTP 429."""
        return self.rate_429 > 0 and _unit(self.seed, key, occurrence, "429") < self.rate_429


@dataclass
class ReplayStats:
    requests: int = 0
    hits: int = 0
    misses: int = 0
    probes: int = 0
    startup_probes: int = 0  # the schema-mode and --concurrency auto probes
    injected_429: int = 0
    latency_s: float = 0.0  # injected, summed over answered requests
    missed: list[str] = field(default_factory=list)  # the first few missed prompts, shortened


class ReplayServer(LoopbackServer):
    """The replay endpoint on 127.0.0.1 (a context manager; ``base_url`` once started)."""

    protocol_version = "HTTP/1.1"  # keep-alive: a client's pooled connections are reused
    backlog = 256  # a burst of N new connections is not refused
    thread_name = "replay-server"

    def __init__(
        self,
        responses: dict[str, dict[str, Any]],
        *,
        identity: str,
        decodings: Sequence[str] = DEFAULT_DECODINGS,
        config: ReplayConfig | None = None,
        port: int = 0,
        fallback: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ):
        """``fallback``: what answers a chat request (its body) the responses do not hold, with a
        chat completion (recording: the embedded model), its answer then kept in ``responses``
        under the request's first key and served from there."""
        self.responses = responses
        self.fallback = fallback
        self._fallback_lock = threading.Lock()
        self.identity = identity
        self.decodings = tuple(decodings)
        self.config = config or ReplayConfig()
        self.stats = ReplayStats()
        self._asked: Counter[str] = Counter()
        self._lock = threading.Lock()
        super().__init__(port)

    def get(self, path: str) -> Reply:
        if path.rstrip("/").endswith("/stats"):
            with self._lock:
                return Reply(200, asdict(self.stats))
        return Reply(404, {"error": {"message": "GET /stats or POST /v1/chat/completions"}})

    def post(self, path: str, body: bytes, headers: Message) -> Reply:
        try:
            request = json.loads(body or b"{}")
        except json.JSONDecodeError:
            return Reply(
                400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}
            )
        if not path.rstrip("/").endswith("/chat/completions"):
            return Reply(
                404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}}
            )
        code, payload, extra, delay = self.answer(request)
        return Reply(code, payload, extra, delay_s=delay)

    # --- what a request gets -------------------------------------------------------------

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str], float]:
        """(status, payload, headers, seconds to wait before sending) for one chat request.

        A request with no recorded answer gets HTTP 400 ``no recorded response`` (not retried by
        optloop, so the question fails visibly), except a 1-token probe (``max_tokens == 1``,
        :meth:`~optloop.lm.OptloopLM.check_endpoint`'s ping), answered ``ok``; the start-up probes
        of the schema mode and of ``--concurrency auto`` are answered as a json_schema endpoint
        that serves requests side by side would."""
        try:
            keys = request_keys(body, self.identity, self.decodings)
        except Exception as exc:  # noqa: BLE001 - a request optloop would not send
            return (
                400,
                {
                    "error": {
                        "message": f"unreadable request: {exc}",
                        "type": "invalid_request_error",
                    }
                },
                {},
                0.0,
            )
        key = next((k for k in keys if k in self.responses), None)
        if key is None and (probe := _probe_answer(body)) is not None:
            # the start-up probes: a json_schema endpoint that serves side by side (not in requests
            # or probes)
            with self._lock:
                self.stats.startup_probes += 1
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            return (
                200,
                chat_completion(body, probe, usage, id="replay-probe", model="replay"),
                {},
                self.config.latency_ms / 1000,
            )
        if key is None and self.fallback is not None and body.get("max_tokens") != 1:
            # one model, one call at a time; a request asked twice is computed once
            with self._fallback_lock:
                if not any(k in self.responses for k in keys):
                    self.responses[keys[0]] = self.fallback(body)
            key = next(k for k in keys if k in self.responses)
        with self._lock:
            self.stats.requests += 1
            if key is None:
                if body.get("max_tokens") == 1:
                    self.stats.probes += 1
                else:
                    self.stats.misses += 1
                    if len(self.stats.missed) < 5:
                        self.stats.missed.append(
                            str((body.get("messages") or [{}])[-1].get("content"))[:120]
                        )
            occurrence = self._asked[key or keys[-1]]
            self._asked[key or keys[-1]] += 1
            refused = key is not None and self.config.refuses(key, occurrence)
            if refused:
                self.stats.injected_429 += 1
        if key is None:
            if body.get("max_tokens") == 1:
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                return (
                    200,
                    chat_completion(body, "ok", usage, id="replay-probe", model="replay"),
                    {},
                    0.0,
                )
            return (
                400,
                {
                    "error": {
                        "message": "no recorded response for this request (replay server)",
                        "type": "invalid_request_error",
                        "code": "replay_miss",
                    }
                },
                {},
                0.0,
            )
        if refused:
            cfg = self.config
            value = (
                formatdate(time.time() + cfg.retry_after, usegmt=True)
                if cfg.retry_after_date
                else f"{cfg.retry_after:g}"
            )
            return (
                429,
                {
                    "error": {
                        "message": "rate limited (replay server)",
                        "type": "rate_limit_error",
                        "code": "rate_limit_exceeded",
                    }
                },
                {"retry-after": value},
                0.0,
            )
        delay = self.config.latency_s(key, occurrence)
        with self._lock:
            self.stats.hits += 1
            self.stats.latency_s += delay
        return 200, {**self.responses[key], "model": body.get("model", "replay")}, {}, delay


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m optloop.testing.replay", __doc__)
    parser.add_argument(
        "--cache", type=Path, required=True, help="an optloop LM cache file (lm_cache.sqlite)"
    )
    parser.add_argument(
        "--identity", help="model identity the cache was written under (default: the bundled GGUF)"
    )
    parser.add_argument(
        "--decoding",
        action="append",
        help=f"backend decoding to try (repeatable; default {', '.join(DEFAULT_DECODINGS)})",
    )
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument(
        "--jitter-ms", type=float, default=50.0, help="latency is uniform in latency +- jitter"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rate-429", type=float, default=0.0, help="fraction of requests answered HTTP 429"
    )
    parser.add_argument(
        "--retry-after", type=float, default=1.0, help="seconds in the 429's Retry-After"
    )
    parser.add_argument(
        "--retry-after-date", action="store_true", help="send Retry-After as an HTTP date"
    )
    parser.add_argument("--port", type=int, default=0)
    args = parse_command(parser, argv)
    config = ReplayConfig(
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        seed=args.seed,
        rate_429=args.rate_429,
        retry_after=args.retry_after,
        retry_after_date=args.retry_after_date,
    )
    responses = load_cache(args.cache)  # a missing or unreadable cache: one line, exit 2 (run_cli)
    identity = args.identity or bundled_identity()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ReplayServer(
        responses,
        identity=identity,
        decodings=args.decoding or DEFAULT_DECODINGS,
        config=config,
        port=args.port,
    ) as server:
        print(server.base_url, flush=True)
        print(f"replaying {len(responses)} responses as {identity}", file=sys.stderr, flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        print(json.dumps(asdict(server.stats)), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
