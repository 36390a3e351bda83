"""Fixtures shared by the tests of ``optloop``."""

from __future__ import annotations

import pytest


@pytest.fixture
def oracle_state(tmp_path, monkeypatch):
    """A loopback endpoint that needs no model (also the embedder's), and the state directory and
    MLflow store under ``tmp_path``."""
    from optloop.testing.oracle import OracleEndpoint

    for name, value in {
        "OPTLOOP_HOME": tmp_path / "state",
        "OPTLOOP_MLRUNS": tmp_path / "ml",
        "OPTLOOP_EMBED": "openai:oracle",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}",
    }.items():
        monkeypatch.setenv(name, str(value))
    with OracleEndpoint() as endpoint:
        monkeypatch.setenv("OPENAI_BASE_URL", endpoint.base_url)  # the embedder's
        yield endpoint
