"""Shared fixtures: every test gets its own optloop state dir; loopback servers live in
``optloop.testing``."""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import pytest


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch, request):
    """Point OPTLOOP_HOME and OPTLOOP_MLRUNS at a temp dir so tests never share caches or
    stores. A unit test (no ``integration`` mark) also gets its own llama.cpp slot files: its
    local model is a fake, and it must not wait for a real model another process is running."""
    monkeypatch.setenv("OPTLOOP_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("OPTLOOP_MLRUNS", str(tmp_path / "mlruns"))
    if request.node.get_closest_marker("integration") is None:
        monkeypatch.setenv("OPTLOOP_LOCK_DIR", str(tmp_path / "llama-slots"))
    for name in (
        "OPTLOOP_LM",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPTLOOP_EMBED",
        "MLFLOW_TRACKING_URI",
        "OPTLOOP_LM_SCHEMA_MODE",
        "OPTLOOP_CONCURRENCY",
        "OPTLOOP_MODELS",
    ):
        monkeypatch.delenv(name, raising=False)
    from optloop.lm import forget_endpoints

    # loopback ports are reused between tests: an endpoint's modes are the test's own
    forget_endpoints()
    return tmp_path / "state"
