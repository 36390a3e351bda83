"""Offline hygiene, applied once when :mod:`optloop` is imported.

The embedded default must run with no network: telemetry off for mem0 and
graphiti, litellm's bundled cost map instead of a download, Hugging Face in
offline mode. Each value is a default only: a variable the user already set
is never overridden.
"""

from __future__ import annotations

import os

OFFLINE_DEFAULTS: dict[str, str] = {
    "MEM0_TELEMETRY": "False",
    "GRAPHITI_TELEMETRY_ENABLED": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # qdrant-client and chromadb read this one.
    "ANONYMIZED_TELEMETRY": "False",
    "DO_NOT_TRACK": "1",
    # MLflow turns its telemetry off only for "true" here (DO_NOT_TRACK=1 is not enough).
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply_offline_defaults() -> dict[str, str]:
    """Set each offline default unless the user set it; return what was set."""
    applied = {}
    for name, value in OFFLINE_DEFAULTS.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied
