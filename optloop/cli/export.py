"""Export optimized prompts from MLflow into a product that uses vanilla mem0 or graphiti.

    python -m optloop export --run RUN_ID --format mem0 --out mem0_prompts.py
    python -m optloop export --prompt optloop.mem0.extract@champion --format mem0 \\
        --out mem0_prompts.py
    python -m optloop export --run RUN_ID --format graphiti --out graphiti_prompts.py
    python -m optloop export --run RUN_ID --format json --out prompts.json
    python -m optloop export --run RUN_ID --format dspy --out program.json
    python -m optloop export --run RUN_ID --format pack --out pack.json

Sources (one of):
  --run RUN_ID       a finished `python -m optloop.run` (its parent run; the id it printed, also in
                     `make ui`): every site's prompt as the best candidate sends it
                     (prompts_after.json), the knobs of that candidate, the DSPy program
  --prompt REF       one prompt of the MLflow Prompt Registry: NAME@ALIAS or NAME/VERSION,
                     optionally as prompts:/NAME@ALIAS. optloop registers the changed sites of each
                     run as optloop.<site> (optloop.mem0.extract,
                     optloop.graphiti.extract_edges.edge) or optloop.<system>.<site>
                     (optloop.mem0.answer); alias `champion` = held-out winner

Formats:
  json      {site: exact prompt text}: instructions with any demos rendered, what the site sends as
            its system message (graphiti then appends its own framing, as always)
  mem0      a standalone Python module (no optloop needed) for a vanilla mem0.Memory:
                import mem0_prompts; mem0_prompts.apply(memory)
            mem0 then sends the optimized extraction (and LLM-rerank) prompt with the site's JSON
            schema as response_format and the run's sampling (SAMPLING): the same request as the
            optimization run
  graphiti  a standalone Python module for vanilla graphiti:
                Graphiti(..., prompt_library=graphiti_prompts.prompt_library())
            or graphiti_prompts.apply(graphiti) on a live instance
  dspy      the run's DSPy program JSON (every site's instructions and demos; dspy's load())
  pack      a JSON prompt pack: {format, system, prompts, knobs, knob_values, sites, source};
            sites gives each optloop-defined site's input fields and output fields (type,
            description, JSON schema), knob_values the system's knob value spaces: what optloop's
            own systems (tiered, gated: SystemClass(...).apply_pack(json.load(open(path)))) need
            to run with the optimized prompts and knobs

Without the export step, optloop.product.apply(memory, "prompts:/optloop.mem0.extract@champion")
applies registry prompts to a live mem0 or graphiti from Python (optloop installed).

Nothing is written unless the export succeeds; the file is replaced in one step.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import argparse
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from optloop.cli.command import CommandParser, parse_command
from optloop.errors import ConfigError
from optloop.product.export import FORMATS, from_prompt, from_run, render

# --- output ----------------------------------------------------------------------------------


def check_out(out: str) -> Path | None:
    """The output path (None: stdout), refused before any work when it cannot be written."""
    if out == "-":
        return None
    path = Path(out).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"--out {out} is a directory; name the file to write, e.g. {path / 'prompts.py'}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--out {out}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"--out {out} is not writable; pick another path")
    return path


def _file_mode(path: Path) -> int:
    """The mode a plain ``open(path, "w")`` would leave: the file's own when it exists, else 0666
    less the umask."""
    if path.exists():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write(path: Path | None, text: str) -> None:
    """Write through a temporary file in the same directory, then rename: never half a file."""
    if path is None:
        sys.stdout.write(text)
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _file_mode(path))  # not mkstemp's 0600: a service of another user reads it
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(
            f"--out {path}: cannot write ({exc.strerror or exc}); pick another path"
        ) from None


# --- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("optloop export", __doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="RUN_ID", help="a finished optloop.run parent run")
    source.add_argument(
        "--prompt", metavar="REF", help="a registry prompt: NAME@ALIAS or NAME/VERSION"
    )
    parser.add_argument(
        "--format", required=True, choices=FORMATS, help="json | mem0 | graphiti | dspy | pack"
    )
    parser.add_argument(
        "--out", required=True, metavar="PATH", help="file to write (- for stdout)"
    )
    parser.add_argument(
        "--schema-mode",
        choices=["json_schema", "json_object"],
        default="json_schema",
        help="mem0 format: how the module asks for the JSON schema; json_schema (OpenAI, vLLM; "
        "default) or json_object (a llama.cpp server), as the run's LM endpoint did",
    )
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default sqlite:///mlruns/mlflow.db, or MLFLOW_TRACKING_URI)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    out = check_out(args.out)
    from optloop.services import tracking

    tracking.open_existing(args.tracking_uri)
    bundle = from_run(args.run) if args.run else from_prompt(args.prompt)
    source = shlex.join(["--run", args.run] if args.run else ["--prompt", args.prompt.strip()])
    text = render(
        bundle,
        args.format,
        schema_mode=args.schema_mode,
        command=f"python -m optloop export {source} --format {args.format}",
    )
    write(out, text)
    if out is not None:
        print(
            f"wrote {out} ({args.format}, {len(bundle.prompts)} prompt(s) from {bundle.label})",
            file=sys.stderr,
        )
    return 0
