"""The environment optloop's commands run in: no network for the embedded default, no
third-party progress bars.

Telemetry off for mem0 and graphiti, litellm's bundled cost map instead of a download, Hugging
Face in offline mode. Several libraries read these when they are imported (litellm, through
DSPy, reads its cost map then; mem0 its telemetry switch; Hugging Face its offline mode), so a
command sets them before its other imports, as its first statement::

    import os

    from optloop.offline import offline_defaults, quiet_defaults

    os.environ.update(offline_defaults())
    if __name__ == "__main__":  # run as a command, not imported
        os.environ.update(quiet_defaults())

:func:`quiet_defaults` sets ``TQDM_DISABLE=1`` unless the command line says ``--verbose``. tqdm
reads ``TQDM_*`` variables once, when it is imported, as the defaults of every bar: GEPA's "GEPA
Optimization" bar, MLflow's and Hugging Face's download bars would otherwise draw on stderr, into
the console and into any file a run's output is redirected to, where the command's own progress
lines already say what runs. A bar whose caller passes ``disable=`` itself (DSPy's parallel
executor) is not reached by it: see ``optloop.loop.optimizers.rounds.dspy_bars_hidden``. The
``optloop`` command sets both (:func:`command_defaults`) before it imports anything that imports
tqdm.

``import optloop`` itself changes nothing: a program that uses optloop as a library keeps the
environment it has. Each value is a default only: a variable already set is never overridden.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

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


QUIET_DEFAULTS: dict[str, str] = {
    # tqdm's default for every bar that does not pass disable= itself (GEPA's, MLflow's).
    "TQDM_DISABLE": "1",
}


def quiet_defaults(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The defaults that hide third-party progress bars, unless ``argv`` (default ``sys.argv``)
    holds ``--verbose``; a variable ``environ`` sets already is kept."""
    if "--verbose" in (sys.argv[1:] if argv is None else argv):
        return {}
    return {name: value for name, value in QUIET_DEFAULTS.items() if name not in environ}


def command_defaults(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """What a command adds to its environment first: :func:`offline_defaults` and
    :func:`quiet_defaults`."""
    return {**offline_defaults(environ), **quiet_defaults(argv, environ)}
