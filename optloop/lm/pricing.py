"""Dollar prices per token, from litellm's bundled model cost map, read offline.

litellm (installed with mlflow) ships ``model_prices_and_context_window_backup.json``, the
maintained price table of its ``litellm.model_cost``. Importing litellm fetches the newest
table from GitHub first (and, offline, retries for seconds before falling back); optloop
never imports it for prices: the packaged file is located with ``importlib.util.find_spec``
(which does not run the package) and parsed once. A library that imports litellm later in
the process (mem0 with a litellm provider) stays offline by optloop's commands setting
``LITELLM_LOCAL_MODEL_COST_MAP=True`` first (:mod:`optloop.offline`).

A model is priced when its name, as sent to the endpoint, is a key of the table with a
per-token price (``gpt-4o-mini``, ``gpt-4o-mini-2024-07-18``, ``deepseek-chat``), or is one
after a leading ``provider/`` is dropped (``openai/gpt-4o-mini``). Anything else (a vLLM or
Ollama model name, the embedded GGUF) has no price: its calls report tokens and
``cost_usd=None``, never a made-up 0.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PRICE_FILE = "model_prices_and_context_window_backup.json"

_TABLE: dict[str, Any] | None = None
_TABLE_LOCK = threading.Lock()


@dataclass(frozen=True)
class ModelPrice:
    """USD per token: prompt (``input``), completion (``output``), prompt tokens the provider
    served from its cache."""

    model: str  # the table's key that priced it
    input: float
    output: float
    cached_input: float | None = None

    def cost(
        self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0
    ) -> float:
        """Dollars for one call's usage; ``cached_prompt_tokens`` (of ``prompt_tokens``) at the
        cache-read price."""
        cached = (
            min(max(cached_prompt_tokens, 0), prompt_tokens)
            if self.cached_input is not None
            else 0
        )
        return (
            (prompt_tokens - cached) * self.input
            + cached * (self.cached_input or 0.0)
            + completion_tokens * self.output
        )


def price_file() -> Path | None:
    """The bundled price table of the installed litellm, without importing litellm; None if litellm
    is absent."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / PRICE_FILE
        if path.is_file():
            return path
    return None


def price_table() -> dict[str, Any]:
    """The parsed table (model name -> entry), loaded once per process; empty when litellm is not
    installed."""
    global _TABLE
    with _TABLE_LOCK:
        if _TABLE is None:
            path = price_file()
            if path is None:
                logger.warning(
                    "litellm's model cost map is not installed: LM calls report tokens "
                    "only, no dollars"
                )
                _TABLE = {}
            else:
                try:
                    _TABLE = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError) as exc:
                    logger.warning(
                        "cannot read litellm's model cost map %s (%s): tokens only, no dollars",
                        path,
                        exc,
                    )
                    _TABLE = {}
        return _TABLE


def price_source() -> str:
    """Where prices come from, for a run's parameters:
    ``litellm 1.106.2 model_prices_and_context_window_backup.json``."""
    if price_file() is None:
        return "none (litellm not installed)"
    try:
        version = importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"litellm {version} {PRICE_FILE}"


def _entry_price(key: str, entry: Any) -> ModelPrice | None:
    if not isinstance(entry, dict) or key == "sample_spec":
        return None
    prompt, completion = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if not isinstance(prompt, (int, float)) or not isinstance(completion, (int, float)):
        return None
    cached = entry.get("cache_read_input_token_cost")
    return ModelPrice(
        key,
        float(prompt),
        float(completion),
        float(cached) if isinstance(cached, (int, float)) else None,
    )


def model_price(model: str | None) -> ModelPrice | None:
    """The price of ``model`` (the name an endpoint is asked for), or None when the table has
    none."""
    if not model:
        return None
    table = price_table()
    candidates = [model, model.lower()]
    if "/" in model:
        candidates.append(model.split("/", 1)[1])
    for name in candidates:
        if (price := _entry_price(name, table.get(name))) is not None:
            return price
    return None
