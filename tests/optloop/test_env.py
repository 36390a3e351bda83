"""Offline hygiene: defaults are applied on import, and never override the user."""

from __future__ import annotations

import subprocess
import sys


def _env_after_import(env: dict[str, str]) -> dict[str, str]:
    code = "import json, os, optloop; print(json.dumps(dict(os.environ)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    import json

    return json.loads(out.stdout)


def test_import_sets_offline_defaults(monkeypatch):
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    env = _env_after_import(base)
    assert env["MEM0_TELEMETRY"] == "False" and env["GRAPHITI_TELEMETRY_ENABLED"] == "false"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["HF_HUB_OFFLINE"] == "1"


def test_import_keeps_what_the_user_set():
    env = _env_after_import({"PATH": "/usr/bin:/bin", "HOME": "/tmp", "HF_HUB_OFFLINE": "0", "MEM0_TELEMETRY": "True"})
    assert env["HF_HUB_OFFLINE"] == "0" and env["MEM0_TELEMETRY"] == "True"
