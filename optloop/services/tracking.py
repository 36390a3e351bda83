"""MLflow is the system of record: where the store lives and how experiments are made.

The embedded default is a SQLite tracking store, ``mlruns/mlflow.db``, with
artifacts beside it in ``mlruns/artifacts`` (MLflow 3 keeps traces and the
prompt registry only in a SQL store). ``--tracking-uri`` or
``MLFLOW_TRACKING_URI`` point at any other store or server instead: the same
code with another URI. ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``
(``make ui``) shows it.
"""

from __future__ import annotations

import logging
import os

from optloop.paths import mlruns_dir

logger = logging.getLogger(__name__)


def default_tracking_uri(*, create: bool = True) -> str:
    """The embedded store's URI (``create=False``: its folder is not created)."""
    return f"sqlite:///{mlruns_dir(create=create).resolve() / 'mlflow.db'}"


def resolve_uri(tracking_uri: str | None = None, *, create: bool = True) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the embedded store (``create=False``:
    for checks before anything is written)."""
    return (
        tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or default_tracking_uri(create=create)
    )


def configure(tracking_uri: str | None = None) -> str:
    """Point MLflow at :func:`resolve_uri` of ``tracking_uri``."""
    import mlflow

    from optloop.services.preflight import bound_mlflow_http

    bound_mlflow_http()  # a tracking server that is gone fails a call in seconds, not minutes
    uri = resolve_uri(tracking_uri)
    if uri.startswith("sqlite:///"):
        from pathlib import Path

        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    return uri


def experiment(name: str) -> str:
    """The id of experiment ``name``, created (artifacts under ``mlruns/artifacts``) when
    missing."""
    import mlflow

    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        mlflow.set_experiment(experiment_id=found.experiment_id)
        return found.experiment_id
    location = None
    if mlflow.get_tracking_uri().startswith("sqlite:"):
        location = (mlruns_dir().resolve() / "artifacts" / name).as_uri()
    experiment_id = mlflow.create_experiment(name, artifact_location=location)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def open_existing(tracking_uri: str | None = None) -> str:
    """:func:`configure` for readers: a SQLite store that does not exist is an error, not a new
    empty store."""
    from pathlib import Path

    from optloop.errors import ConfigError

    uri = resolve_uri(tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(
            f"no MLflow store at {uri.removeprefix('sqlite:///')}; run python -m optloop.run "
            "first, or point --tracking-uri (MLFLOW_TRACKING_URI) at the store that holds the "
            "run"
        )
    return configure(uri)
