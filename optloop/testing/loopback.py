"""A real HTTP server on 127.0.0.1, the base of the loopback endpoints the tests and benchmarks
speak to (:class:`~optloop.testing.scripted.ScriptedOpenAIServer`,
:class:`~optloop.testing.replay.ReplayServer`): the real ``openai`` client goes over the real
network path, so status codes, bodies that do not parse and answers that never come are
exercised as a hosted endpoint would give them."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Reply:
    """What one request gets: ``payload`` as JSON (or ``raw`` bytes), after ``delay_s``."""

    code: int = 200
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    delay_s: float = 0.0


class LoopbackServer:
    """An HTTP server on 127.0.0.1 (a context manager; :attr:`base_url` once started) answering
    each POST with :meth:`post` and each GET with :meth:`get`, on daemon threads (requests may
    come from many threads at once). A ``None`` reply sends nothing: the client waits for its
    timeout."""

    protocol_version = "HTTP/1.0"  # HTTP/1.1 keeps a client's pooled connections alive
    backlog = 128  # connections queued at once (the default of 5 resets a burst of clients)
    thread_name: str | None = None

    def __init__(self, port: int = 0):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = server.protocol_version

            def log_message(self, *args: Any) -> None:  # keep the caller's output clean
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server naming
                server._send(self, server.get(self.path))

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                server._send(self, server.post(self.path, self.rfile.read(length), self.headers))

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = server.backlog

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, daemon=True, name=self.thread_name
        )

    def post(self, path: str, body: bytes, headers: Message) -> Reply | None:
        raise NotImplementedError

    def get(self, path: str) -> Reply | None:
        return Reply(501, {"error": {"message": f"GET {path} is not served here"}})

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, reply: Reply | None) -> None:
        if reply is None:
            return
        if reply.delay_s > 0:
            time.sleep(reply.delay_s)
        data = reply.raw if reply.raw is not None else json.dumps(reply.payload).encode()
        handler.send_response(reply.code)
        handler.send_header("content-type", "application/json")
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_completion(
    body: dict[str, Any],
    content: str,
    usage: dict[str, int],
    *,
    id: str = "cmpl-1",
    model: str = "m",
) -> dict[str, Any]:
    """An OpenAI chat-completions answer of ``content`` to the request ``body``."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", model),
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": usage,
    }


def closed_port_url() -> str:
    """A loopback URL on which nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
