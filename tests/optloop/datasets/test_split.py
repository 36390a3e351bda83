"""split_episodes: deterministic, by whole episode, proportional."""

from __future__ import annotations

import pytest

from optloop.datasets import Dataset, load_dataset, split_episodes


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return load_dataset("synthetic:meme?seed=1&episodes=8&fillers=0")


def test_split_partitions_episodes_in_proportion(dataset: Dataset) -> None:
    train, dev, test = split_episodes(dataset)
    assert (len(train.episodes), len(dev.episodes), len(test.episodes)) == (4, 2, 2)
    ids = [e.id for part in (train, dev, test) for e in part.episodes]
    assert sorted(ids) == sorted(e.id for e in dataset.episodes)
    assert (train.name, dev.name, test.name) == (
        f"{dataset.name}[train]",
        f"{dataset.name}[dev]",
        f"{dataset.name}[test]",
    )
    order = [e.id for e in dataset.episodes]
    assert [e.id for e in train.episodes] == sorted(
        (e.id for e in train.episodes), key=order.index
    )


def test_split_is_deterministic_and_independent_of_input_order(dataset: Dataset) -> None:
    first = [[e.id for e in part.episodes] for part in split_episodes(dataset, seed=3)]
    again = [[e.id for e in part.episodes] for part in split_episodes(dataset, seed=3)]
    reversed_input = dataset.model_copy(update={"episodes": dataset.episodes[::-1]})
    shuffled = [
        sorted(e.id for e in part.episodes) for part in split_episodes(reversed_input, seed=3)
    ]
    assert first == again and [sorted(p) for p in first] == shuffled
    others = [[e.id for e in part.episodes] for part in split_episodes(dataset, seed=4)]
    assert others != first


def test_every_positive_fraction_gets_an_episode_when_possible() -> None:
    small = load_dataset("builtin:tiny?limit=3")
    sizes = [len(p.episodes) for p in split_episodes(small, (0.8, 0.1, 0.1))]
    assert sizes == [1, 1, 1]
    assert [len(p.episodes) for p in split_episodes(small, (1, 0, 0))] == [3, 0, 0]


def test_bad_fractions_are_rejected(dataset: Dataset) -> None:
    with pytest.raises(ValueError, match="three non-negative numbers"):
        split_episodes(dataset, (0.5, 0.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="three non-negative numbers"):
        split_episodes(dataset, (1.0, -0.5, 0.5))
