"""llama.cpp's own OpenAI-compatible server (``python -m llama_cpp.server``, the ``[server]`` extra
of llama-cpp-python) on the bundled SmolLM2 GGUF, on a free loopback port, and a recording proxy in
front of it that keeps every request body (what a library really sent).

Both are real: the server is the one a user starts with ``pip install 'llama-cpp-python[server]'``;
the proxy forwards bytes unchanged. Run the tests that start it under the machine's LM lock
(``flock /tmp/optloop-lm.lock``): the server uses the CPU for as long as it runs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL_ALIAS = "smollm2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LlamaServer:
    base_url: str
    log: Path
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def server_available() -> str | None:
    """Why llama.cpp's server cannot start here (None: it can)."""
    import importlib.util

    for module in ("llama_cpp.server", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        try:
            if importlib.util.find_spec(module) is None:
                return (
                    f"{module} is not installed (pip install 'llama-cpp-python[server]==0.3.36')"
                )
        except ModuleNotFoundError:
            return f"{module} is not installed (pip install 'llama-cpp-python[server]==0.3.36')"
    return None


def _die_with_parent() -> None:
    """In the server's process, before it runs: the kernel kills it when the process that started
    it dies, however it dies (a pytest killed by ``timeout`` runs no fixture teardown, and a server
    left behind keeps the cores busy with the requests it had queued)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def llama_server(
    log_dir: Path, *, n_ctx: int = 12288, n_threads: int | None = None
) -> Iterator[LlamaServer]:
    """``python -m llama_cpp.server`` on the bundled GGUF and a free loopback port, as a user
    starts it."""
    import os

    from optloop.lm import bundled_model_path

    port = free_port()
    log = log_dir / f"llama-server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(bundled_model_path()),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads or os.cpu_count() or 1),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
    server = LlamaServer(base_url=f"http://127.0.0.1:{port}/v1", log=log, process=process)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"llama.cpp's server exited with {process.returncode}: "
                    f"{server.log_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{server.base_url}/models", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"llama.cpp's server did not start in 120 s: {server.log_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class RecordingProxy:
    """A loopback HTTP proxy to ``upstream`` (a base URL ending in /v1) that records every POST
    body."""

    upstream: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        proxy = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                data = self.rfile.read(length) if length else None
                if data is not None:
                    with lock:
                        proxy.requests.append({"path": self.path, "body": json.loads(data)})
                base = proxy.upstream.removesuffix("/v1")
                request = urllib.request.Request(
                    base + self.path,
                    data=data,
                    method=method,
                    headers={"content-type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=600) as response:
                        status, body = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                self._forward("POST")

            def do_GET(self) -> None:  # noqa: N802
                self._forward("GET")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    def __enter__(self) -> RecordingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
