"""optloop: trace every memory operation, blame the faulty prompt, optimize only that prompt.

Importing optloop changes nothing in the environment; its commands apply the offline defaults
(:mod:`optloop.offline`) when they start.
"""

from __future__ import annotations

__version__ = "0.1.0"
