"""The doctor's model list: every model of the registry, installed or not, and the speed of each
installed one measured here."""

from __future__ import annotations

import pytest
from rich.console import Console

from optloop.cli import doctor
from optloop.lm import MODELS, bundled_model_path


def rendered(table) -> str:
    console = Console(width=400, record=True)
    console.print(table)
    return console.export_text()


def test_the_model_list_names_every_model_and_how_to_install_a_missing_one():
    text = rendered(doctor.models_table(measure=False))
    for name in MODELS:
        assert name in text
    assert "install: python -m optloop models install qwen2.5-coder-1.5b" in text
    assert str(MODELS["qwen2.5-coder-1.5b"].path()) in text  # where it will be
    assert str(bundled_model_path()) in text and "not measured" in text


@pytest.mark.integration
def test_the_speed_of_the_bundled_model_is_measured_holding_a_slot():
    speed = doctor.model_speed(bundled_model_path())
    assert speed.prompt_tps > 0 and speed.generate_tps > 0 and speed.threads >= 1
