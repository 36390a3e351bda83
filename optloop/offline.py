"""The environment optloop's commands run in: no network for the embedded default.

Telemetry off for mem0 and graphiti, litellm's bundled cost map instead of a download, Hugging
Face in offline mode. Several libraries read these when they are imported (litellm, through
DSPy, reads its cost map then; mem0 its telemetry switch; Hugging Face its offline mode), so a
command sets them before its other imports, as its first statement::

    import os

    from optloop.offline import offline_defaults

    os.environ.update(offline_defaults())

``import optloop`` itself changes nothing: a program that uses optloop as a library keeps the
environment it has. Each value is a default only: a variable already set is never overridden.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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


def offline_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The offline defaults ``environ`` does not set yet (what a command adds to it)."""
    return {name: value for name, value in OFFLINE_DEFAULTS.items() if name not in environ}
