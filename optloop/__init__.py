"""optloop: trace every memory operation, blame the faulty prompt, optimize only that prompt.

Importing optloop applies offline defaults (telemetry off, Hugging Face offline,
litellm's local cost map) without overriding anything the user set.
"""

from __future__ import annotations

from optloop._env import apply_offline_defaults

apply_offline_defaults()

__version__ = "0.1.0"
