"""Experiment files: every shipped config loads, bad files fail with one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from optloop.analysis.experiment_files import ExperimentConfig, load_config, with_limit
from optloop.datasets import load_dataset, parse_uri
from optloop.datasets._io import shared_data_dirs
from optloop.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[3] / "experiments" / "configs"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.toml"))
NEEDS_NO_FILES = {"builtin", "synthetic"}


def test_the_readme_lists_exactly_the_config_files() -> None:
    """The parametrized tests below run once per file: the files must be there, and each
    documented."""
    import re

    listed = set(
        re.findall(r"^\| `([\w.]+\.toml)` \|", (CONFIG_DIR / "README.md").read_text(), flags=re.M)
    )
    assert listed and listed == {p.name for p in CONFIG_FILES}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_file_loads(path: Path) -> None:
    config = load_config(path)
    assert isinstance(config, ExperimentConfig)
    assert config.name == path.stem
    assert config.systems and config.datasets


@pytest.mark.parametrize(
    ("path", "uri"),
    [(p, uri) for p in CONFIG_FILES for uri in load_config(p).datasets],
    ids=lambda v: v.name if isinstance(v, Path) else v,
)
def test_config_dataset_uris_load(path: Path, uri: str) -> None:
    scheme = parse_uri(uri)[0]
    if scheme not in NEEDS_NO_FILES and not any(d.is_dir() for d in shared_data_dirs()):
        pytest.skip(f"shared benchmark data not found ({', '.join(map(str, shared_data_dirs()))})")
    config = load_config(path)
    dataset = load_dataset(with_limit(uri, config.episodes))
    assert dataset.episodes
    if config.episodes is not None:
        assert len(dataset.episodes) <= config.episodes


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD = 'name = "x"\nsystems = ["rag_bm25"]\ndatasets = ["builtin:tiny"]\n'


def test_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD))
    assert (config.name, config.systems, config.datasets, config.episodes, config.notes) == (
        "x",
        ["rag_bm25"],
        ["builtin:tiny"],
        None,
        "",
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (
            GOOD + "budget = 5\n",
            "'budget'",
        ),  # no optimization entry point reads a file: not a field
        (GOOD + "episodes = 0\n", "'episodes'"),
        (GOOD + "budjet = 5\n", "'budjet'"),
        ('systems = ["rag_bm25"]\ndatasets = ["builtin:tiny"]\n', "'name'"),
        ('name = "x"\nsystems = []\ndatasets = ["builtin:tiny"]\n', "'systems'"),
        (
            'name = "x"\nsystems = ["rag_bm25", "nope"]\ndatasets = ["builtin:tiny"]\n',
            "'systems[1]'",
        ),
        (
            'name = "x"\nsystems = ["rag_bm25"]\ndatasets = ["builtin:tiny", "nope:x"]\n',
            "'datasets[1]'",
        ),
        ('name = "x"\nsystems = ["rag_bm25"]\ndatasets = "builtin:tiny"\n', "'datasets'"),
        (
            'name = "x"\nsystems = ["rag_bm25"]\ndatasets = ["builtin:tiny?limit=a=b&limit=2"]\n',
            "'datasets[0]'",
        ),
    ],
)
def test_a_bad_file_names_the_file_and_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message and field in message and "\n" not in message


def test_episodes_become_a_limit_where_the_uri_has_none() -> None:
    config = ExperimentConfig(
        name="x",
        systems=["rag_bm25"],
        episodes=2,
        datasets=["builtin:tiny", "builtin:tiny?limit=1", "synthetic:meme?seed=0"],
    )
    assert config.dataset_uris() == [
        "builtin:tiny?limit=2",
        "builtin:tiny?limit=1",
        "synthetic:meme?seed=0&limit=2",
    ]
    assert with_limit("builtin:tiny", None) == "builtin:tiny"


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "name = \n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")
