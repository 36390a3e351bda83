"""The shared LM flags: a system's local-decoding defaults fill what the flags leave unset."""

from __future__ import annotations

import argparse

import pytest

from optloop.cli.command import add_lm_arguments, lm_from_args
from systems import get_system


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_lm_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "system, argv, expected",
    [
        ("graphiti", [], (3, 80)),  # graphiti's own bounds
        ("graphiti", ["--lm-max-items", "5"], (5, 80)),  # a flag wins, the other default stays
        ("mem0", [], (16, 400)),  # no system default: the LM's
        ("mem0", ["--lm-max-chars", "120"], (16, 120)),
    ],
)
def test_system_decoding_defaults_yield_to_flags(isolated_state, system, argv, expected):
    lm = lm_from_args(_args(*argv), get_system(system).local_decoding)
    assert (lm.settings.max_array_items, lm.settings.max_string_chars) == expected


_WARN = (
    "import warnings; from optloop.cli.command import setup_logging; setup_logging({verbose}); "
    "warnings.simplefilter('default'); "  # what an import may do after setup_logging
    "warnings.warn('old API', DeprecationWarning)"
)


@pytest.mark.parametrize("verbose, shown", [(False, False), (True, True)])
def test_library_warnings_show_only_with_verbose(verbose, shown):
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _WARN.format(verbose=verbose)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ("old API" in run.stderr + run.stdout) is shown, run.stderr


def test_without_a_terminal_a_log_record_is_one_plain_line(capsys):
    import logging

    from optloop.cli.command import setup_logging

    setup_logging(False)
    message = "dev has 4 questions, test 4: a 95% CI this small spans about ±0.5; " * 3
    logging.getLogger("optloop.loop.runs.runner").warning("%s", message.strip())
    assert capsys.readouterr().out == f"WARNING optloop.loop.runs.runner: {message.strip()}\n"
