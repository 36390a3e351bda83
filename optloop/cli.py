"""The start every optloop command shares: its parser (:class:`CommandParser`: the module docstring as
``--help``, ``--verbose``, the LM flags), parsing with logging set up (:func:`parse_command`), the LM the
flags ask for, and the wrapper that runs it (:func:`run_cli`).

Every entry point is wrapped by :func:`run_cli`: an :class:`OptloopError`
becomes one ``optloop: error: ...`` line on stderr and a non-zero exit, never
a traceback wall. ``--verbose`` shows the traceback for debugging.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rich.logging import RichHandler

from optloop.errors import OptloopError
from optloop.lm import LMSettings, OptloopLM

LM_HELP = """\
LM backends (--lm, or the OPTLOOP_LM environment variable):
  local                      the bundled SmolLM2-135M-Instruct, llama.cpp in-process (default)
  local:/path/model.gguf     any GGUF file, llama.cpp in-process
  openai:<model>             any OpenAI-compatible endpoint; --lm-base-url or OPENAI_BASE_URL
                             (vLLM, Ollama, a llama.cpp server), key from OPENAI_API_KEY
"""


class CommandParser(argparse.ArgumentParser):
    """The parser of an optloop command: ``description`` (the module docstring) shown as written, and after
    the command's own flags ``--verbose`` and, with ``lm``, the LM flags (:func:`add_lm_arguments`), added
    when the parser is first used."""

    def __init__(self, prog: str | None = None, description: str | None = None, *, lm: bool = False,
                 **kwargs: Any):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, description=description, **kwargs)
        self._lm = lm
        self._finished = False

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.add_argument("--verbose", action="store_true", help="debug logging and tracebacks")
            if self._lm:
                add_lm_arguments(self)

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        self._finish()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._finish()
        return super().format_help()


def parse_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed by a command's parser, and logging set up (``--verbose``: debug, tracebacks)."""
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    return args


def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LM", "which model answers (see the LM backends below)")
    group.add_argument("--lm", metavar="SPEC", help="LM spec: local | local:/path.gguf | openai:<model>")
    group.add_argument("--lm-base-url", metavar="URL", help="base URL of an OpenAI-compatible endpoint")
    group.add_argument("--lm-timeout", metavar="SECONDS", type=float, help="per-call timeout (default 60)")
    group.add_argument("--lm-retries", metavar="N", type=int, help="retries on transient errors (default 3)")
    group.add_argument("--lm-n-ctx", metavar="TOKENS", type=int, help="context window of a local model (default 12288)")
    group.add_argument("--lm-max-items", metavar="N", type=int,
                       help="local decoding: longest JSON array (default 16; 3 for graphiti)")
    group.add_argument("--lm-max-chars", metavar="N", type=int,
                       help="local decoding: longest JSON string (default 400; 80 for graphiti)")
    group.add_argument("--rpm", metavar="N", type=float, help="requests per minute to the LM, for the whole process")
    group.add_argument("--tpm", metavar="N", type=int, help="tokens per minute to the LM (prompt + max_tokens)")
    group.add_argument("--concurrency", metavar="N", type=int,
                       help="LM requests in flight at once (default $OPTLOOP_CONCURRENCY, else 1 local, 8 endpoint)")
    group.add_argument("--no-cache", action="store_true", help="bypass the persistent LM call cache")


def lm_from_args(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> OptloopLM:
    """The LM the flags ask for; ``defaults`` (a system's ``local_decoding``) fill settings the flags leave unset."""
    return OptloopLM(lm_settings_from_args(args, defaults))


def lm_settings_from_args(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> LMSettings:
    """The settings :func:`lm_from_args` builds its LM from (no LM, no cache file yet)."""
    return LMSettings.from_spec(
        args.lm,
        base_url=args.lm_base_url,
        timeout_s=args.lm_timeout,
        max_retries=args.lm_retries,
        n_ctx=getattr(args, "lm_n_ctx", None),
        max_array_items=_first_set(getattr(args, "lm_max_items", None), (defaults or {}).get("max_array_items")),
        max_string_chars=_first_set(getattr(args, "lm_max_chars", None), (defaults or {}).get("max_string_chars")),
        cache=False if args.no_cache else None,
        rpm=getattr(args, "rpm", None), tpm=getattr(args, "tpm", None), concurrency=getattr(args, "concurrency", None),
    )


def _first_set(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, rich_tracebacks=verbose)],
        force=True,
    )
    if not verbose:  # third-party chatter that says nothing actionable
        for name in ("httpx", "LiteLLM", "mem0", "graphiti_core", "sentence_transformers",
                     "urllib3"):
            logging.getLogger(name).setLevel(logging.ERROR)


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main``; turn an :class:`OptloopError`, or a fault from outside optloop
    (:mod:`optloop.outside`: exit 74 or 75), into one line and its exit code."""
    verbose = "--verbose" in (sys.argv[1:] if argv is None else argv)
    from optloop.outside import describe_run, error_for

    try:
        return main(argv)
    except OptloopError as exc:
        exc = error_for(exc) or exc  # bad input only in appearance: a full disk under a cache, say
        if verbose:
            logging.getLogger("optloop").exception("failed")
        print(f"optloop: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("optloop: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        error = error_for(exc)  # a full disk, an unwritable store, a lost tracking server
        if error is None:
            raise
        if verbose:
            logging.getLogger("optloop").exception("failed")
        print(f"optloop: error: {error}", file=sys.stderr)
        return error.exit_code
    finally:
        describe_run(None)  # what the command said of itself ends with it
