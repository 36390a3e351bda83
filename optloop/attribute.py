"""``python -m optloop.attribute`` and ``optloop.attribute(...)``: the command lives in
:mod:`optloop.cli.attribute`, the function in :mod:`optloop.analysis`; this module keeps both
documented paths working.

``optloop.attribute`` is at once this module and, by the function's name, what ``import optloop;
optloop.attribute(system=...)`` calls: calling the module runs :func:`attribute`.
"""

import inspect
import os
import sys
import types
from typing import Any

from optloop.offline import quiet_defaults

if __name__ == "__main__":  # run as a command: tqdm's bars off unless --verbose, before any import
    os.environ.update(quiet_defaults())

from optloop.analysis import (  # noqa: E402
    AttributionReport,
    EpisodeDone,
    attribute,
    attribute_dataset,
)
from optloop.cli.attribute import build_parser, main  # noqa: E402

__all__ = [
    "AttributionReport",
    "EpisodeDone",
    "attribute",
    "attribute_dataset",
    "build_parser",
    "main",
]


class _CallableModule(types.ModuleType):
    """This module, callable: ``optloop.attribute(...)`` is :func:`attribute` (the module and the
    function share the name ``optloop.attribute``; calling the module runs the function)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return attribute(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(attribute)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    from optloop.cli.command import run_cli

    sys.exit(run_cli(main))
