"""Fixtures for the dataset tests: the shared benchmark data (skipped when absent) and file
writers."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def shared_data_dir() -> Path:
    """``$OPTLOOP_SHARED_DATA`` or ``<repo>/../shared/data`` (may not exist)."""
    env = os.environ.get("OPTLOOP_SHARED_DATA")
    return Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"shared benchmark data not found at {path} (set OPTLOOP_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def memfail_dir(shared_data: Path) -> Path:
    path = shared_data / "memfail"
    if not path.is_dir():
        pytest.skip(f"no MemFail data at {path}")
    return path


@pytest.fixture(scope="session")
def locomo_file(shared_data: Path) -> Path:
    hits = sorted((shared_data / "locomo").glob("*.json"))
    if not hits:
        pytest.skip(f"no LoCoMo data under {shared_data / 'locomo'}")
    return hits[0]


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[[str, Any], Path]:
    def write(name: str, data: Any) -> Path:
        path = tmp_path / name
        if name.endswith(".jsonl"):
            path.write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
        else:
            path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        return path

    return write


@pytest.fixture
def write_csv(tmp_path: Path) -> Callable[[str, list[dict[str, Any]]], Path]:
    def write(name: str, rows: list[dict[str, Any]], header: list[str] | None = None) -> Path:
        path = tmp_path / name
        fields = header or list(rows[0])
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        return path

    return write
