"""The MLflow Prompt Registry: a changed site's prompt registered as ``optloop.<site>``, and the
``champion`` alias moved when the held-out gain says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def registry_name(system: str, site: str) -> str:
    """The Prompt Registry name of a site: ``optloop.mem0.extract``, ``optloop.mem0.answer``.

    A library site already carries its system (``mem0.extract``, ``graphiti.extract_edges.edge``)
    and is not prefixed twice; a shared site (``answer``, ``retrieve.query``) gets the system.
    """
    return f"optloop.{site}" if site.startswith(f"{system}.") else f"optloop.{system}.{site}"


def register_prompts(
    system: str, texts: Mapping[str, str], *, run_id: str, promote: bool, message: str
) -> dict[str, dict[str, Any]]:
    """Register each changed site's prompt as a new version of :func:`registry_name` (tags: site,
    system).

    The ``champion`` alias moves to the new version only when ``promote`` (held-out gain). A
    version this run already registered with the same text (a resumed run killed before its
    checkpoint said so) is reused, not registered again.
    """
    import mlflow

    registered = {}
    for site, text in texts.items():
        name = registry_name(system, site)
        version = registered_by(name, run_id, text) if run_id else None
        if version is None:
            version = mlflow.genai.register_prompt(
                name=name,
                template=text,
                commit_message=message,
                tags={"optloop_run_id": run_id, "site": site, "system": system},
            ).version
        if promote:
            mlflow.genai.set_prompt_alias(name, alias="champion", version=version)
        registered[site] = {"name": name, "version": version, "champion": promote}
    return registered


def registered_by(name: str, run_id: str, text: str) -> int | None:
    """The version of prompt ``name`` that run ``run_id`` registered with ``text``, if there is
    one."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    token = None
    while True:
        try:
            page = client.search_prompt_versions(name, page_token=token)
        except MlflowException:
            return None  # no prompt of that name yet
        for version in page:
            if version.tags.get("optloop_run_id") == run_id and version.template == text:
                return version.version
        token = getattr(page, "token", None)
        if not token:
            return None
