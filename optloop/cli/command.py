"""The start every optloop command shares: its parser (:class:`CommandParser`: the module docstring
as ``--help``, ``--verbose``, the LM flags), parsing with logging set up (:func:`parse_command`),
the LM the flags ask for, and the wrapper that runs it (:func:`run_cli`).

Every entry point is wrapped by :func:`run_cli`: an :class:`OptloopError`
becomes one ``optloop: error: ...`` line on stderr and a non-zero exit, never
a traceback wall. ``--verbose`` shows the traceback for debugging.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from rich.logging import RichHandler

from optloop.errors import OptloopError
from optloop.lm import LMSettings, OptloopLM
from optloop.output import is_terminal

LM_HELP = """\
LM backends (--lm, or the OPTLOOP_LM environment variable):
  local                      the bundled SmolLM2-135M-Instruct, llama.cpp in-process (default)
  local:<name>               a model by name: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b (installed
                             by `make setup`), smollm2-135m; python -m optloop models list
  local:/path/model.gguf     any GGUF file, llama.cpp in-process
  openai:<model>             any OpenAI-compatible endpoint; --lm-base-url or OPENAI_BASE_URL
                             (vLLM, Ollama, a llama.cpp server), key from OPENAI_API_KEY;
                             the schema mode and the concurrency are found at start-up
                             (--lm-schema-mode auto, --concurrency auto; docs/servers.md)
"""


_COMMAND: ContextVar[str | None] = ContextVar("optloop_command", default=None)


@contextmanager
def command_name(name: str) -> Iterator[None]:
    """Within this block, parsers name themselves ``name`` (``optloop run``): set by the
    ``optloop`` command (:mod:`optloop.cli.console`)."""
    token = _COMMAND.set(name)
    try:
        yield
    finally:
        _COMMAND.reset(token)


# How each dataset scheme is written; a scheme missing here is still listed (as SCHEME:...).
_DATASET_FORMS = {
    "memfail": "memfail:<task>[:path]",
    "locomo": "locomo:<path>?sessions=N&questions=N",
    "longmemeval": "longmemeval:<path>",
    "meme": "meme:<path>",
    "jsonl": "jsonl:<path>",
    "agentic": "agentic:<path>, agentic:generate?records=N",
}


def dataset_help(default: str) -> str:
    """``--dataset``'s help, naming every dataset kind the registries hold
    (``optloop.datasets.LOADERS``, the built-in datasets, the synthetic generators)."""
    from optloop.datasets import LOADERS
    from optloop.datasets.builtin import BUILTINS
    from optloop.datasets.synthetic import GENERATORS

    forms = {
        "builtin": ", ".join(f"builtin:{name}" for name in BUILTINS),
        "synthetic": ", ".join(f"synthetic:{kind}?seed=K" for kind in GENERATORS),
        **_DATASET_FORMS,
    }
    kinds = "; ".join(forms.get(scheme, f"{scheme}:...") for scheme in LOADERS)
    return (
        f"dataset URI (default {default}): {kinds}. Any URI takes ?limit=N (episodes), "
        "questions=N, tasks=a,b (docs/systems.md)"
    )


class CommandParser(argparse.ArgumentParser):
    """The parser of an optloop command: ``description`` (the module docstring) shown as written,
    and after the command's own flags ``--verbose`` and, with ``lm``, the LM flags
    (:func:`add_lm_arguments`), added when the parser is first used."""

    def __init__(
        self,
        prog: str | None = None,
        description: str | None = None,
        *,
        lm: bool = False,
        **kwargs: Any,
    ):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=_COMMAND.get() or prog, description=description, **kwargs)
        self._lm = lm
        self._finished = False

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.add_argument(
                "--verbose",
                action="store_true",
                help="debug logging, tracebacks and third-party progress bars (tqdm)",
            )
            if self._lm:
                add_lm_arguments(self)

    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        self._finish()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._finish()
        return super().format_help()


def parse_command(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """``argv`` parsed by a command's parser, and logging set up (``--verbose``: debug,
    tracebacks)."""
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    return args


def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LM", "which model answers (see the LM backends below)")
    group.add_argument(
        "--lm",
        metavar="SPEC",
        help="LM spec: local | local:<name> | local:/path.gguf | openai:<model> (default: local, "
        "SmolLM2-135M: on the default dataset the model with headroom; the Qwen 0.5B answers "
        "0.95-1.00 there; docs/models.md, 'Defaults, as measured')",
    )
    group.add_argument(
        "--lm-base-url", metavar="URL", help="base URL of an OpenAI-compatible endpoint"
    )
    group.add_argument(
        "--lm-timeout", metavar="SECONDS", type=float, help="per-call timeout (default 60)"
    )
    group.add_argument(
        "--lm-retries", metavar="N", type=int, help="retries on transient errors (default 3)"
    )
    group.add_argument(
        "--lm-n-ctx",
        metavar="TOKENS",
        type=int,
        help="context window of a local model (default: its training context, read "
        "from the GGUF; 12288 for mem0, whose extraction prompt is longer)",
    )
    group.add_argument(
        "--lm-max-items",
        metavar="N",
        type=int,
        help="longest JSON array under a grammar: the embedded model's; on a json_object "
        "endpoint, the bound a cut answer is tightened from (default 16; 3 for graphiti)",
    )
    group.add_argument(
        "--lm-max-chars",
        metavar="N",
        type=int,
        help="longest JSON string under a grammar, as --lm-max-items (default 400; 80 for "
        "graphiti)",
    )
    group.add_argument(
        "--rpm",
        metavar="N",
        type=float,
        help="requests per minute to the LM, for the whole process",
    )
    group.add_argument(
        "--tpm", metavar="N", type=int, help="tokens per minute to the LM (prompt + max_tokens)"
    )
    group.add_argument(
        "--lm-schema-mode",
        choices=["auto", "json_schema", "json_object", "none"],
        help="how an endpoint gets a response schema (default $OPTLOOP_LM_SCHEMA_MODE, else auto: "
        "json_schema, else json_object + schema (llama.cpp's servers), else none (the schema "
        "in the instructions, answers checked), the first the endpoint takes)",
    )
    group.add_argument(
        "--concurrency",
        metavar="N|auto",
        type=_concurrency,
        help="LM requests in flight at once (default $OPTLOOP_CONCURRENCY, else 1 local, auto "
        "on an endpoint: measured at start-up, 1 for a server that answers one request at a "
        "time)",
    )
    group.add_argument(
        "--no-cache", action="store_true", help="bypass the persistent LM call cache"
    )


def lm_from_args(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> OptloopLM:
    """The LM the flags ask for; ``defaults`` (a system's ``local_decoding``) fill settings the
    flags leave unset."""
    return OptloopLM(lm_settings_from_args(args, defaults))


def lm_settings_from_args(
    args: argparse.Namespace, defaults: Mapping[str, Any] | None = None
) -> LMSettings:
    """The settings :func:`lm_from_args` builds its LM from (no LM, no cache file yet)."""
    return LMSettings.from_spec(args.lm, defaults=defaults, **lm_overrides(args))


def lm_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The LM flags (:func:`add_lm_arguments`) as :class:`LMSettings` fields, None where a flag
    is not given (or the parser has no such flag)."""
    return {
        "base_url": args.lm_base_url,
        "timeout_s": args.lm_timeout,
        "max_retries": args.lm_retries,
        "n_ctx": getattr(args, "lm_n_ctx", None),
        "max_array_items": getattr(args, "lm_max_items", None),
        "max_string_chars": getattr(args, "lm_max_chars", None),
        "cache": False if args.no_cache else None,
        "rpm": getattr(args, "rpm", None),
        "tpm": getattr(args, "tpm", None),
        "concurrency": getattr(args, "concurrency", None),
        "schema_mode": getattr(args, "lm_schema_mode", None),
    }


def _concurrency(text: str) -> int | str:
    """``--concurrency``: ``auto`` or a whole number (its range is :class:`LMSettings`' to
    check)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give auto or a whole number from 1 to 1024"
        ) from None


class _StdoutHandler(logging.StreamHandler):
    """A stream handler on whatever ``sys.stdout`` is when a record comes (as rich's console is),
    not the stream it was when logging was set up (a redirect since, a test's capture)."""

    @property
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # StreamHandler sets it; sys.stdout is read at each record


def setup_logging(verbose: bool) -> None:
    """Log records on stdout, WARNING and up (``verbose``: DEBUG, with tracebacks): rich's
    columns on a terminal; elsewhere one plain line each, ``WARNING optloop.loop.runs.runner:
    ...``, as a log file reads best (rich's columns there wrap every message at 80 columns and pad
    it)."""
    handler: logging.Handler
    if is_terminal(sys.stdout):
        handler = RichHandler(show_path=False, rich_tracebacks=verbose)
    else:
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    if not verbose:  # third-party chatter that says nothing actionable
        for name in (
            "httpx",
            "LiteLLM",
            "mem0",
            "graphiti_core",
            "sentence_transformers",
            "urllib3",
        ):
            logging.getLogger(name).setLevel(logging.ERROR)
        # MLflow gives its loggers their own handler and level when it is imported (INFO unless
        # this says otherwise: "Creating initial MLflow database tables..."), so the level is set
        # before that import, and again for a process that imported it already. A level the user
        # set is kept.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        logging.getLogger("mlflow").setLevel(os.environ["MLFLOW_LOGGING_LEVEL"].upper())
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # Libraries' warnings (deprecations inside MLflow's migrations, say) go to logging, where
        # they show with --verbose: a filter here would not hold, as an import that runs later
        # may put its own "default" filter in front of it.
        logging.captureWarnings(True)
        logging.getLogger("py.warnings").setLevel(logging.ERROR)


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main``; turn an :class:`OptloopError`, or a fault from outside optloop
    (:mod:`optloop.services.outside`: exit 74 or 75), into one line and its exit code."""
    verbose = "--verbose" in (sys.argv[1:] if argv is None else argv)
    from optloop.services.outside import describe_run, error_for

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
