"""The README stays true: its Python snippet runs, its links resolve, and it stays a short page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# Pages other parts of the docs own; a link to them is checked once they exist.
LATER = {"docs/servers.md", "docs/reliability.md", "docs/tiered.md"}


def python_snippet() -> str:
    """The README's one ``python`` block that starts with ``import optloop``."""
    [block] = [
        b
        for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
        if b.startswith("import optloop")
    ]
    return block


def test_the_readme_python_snippet_runs(tmp_path, monkeypatch, capsys):
    """The snippet as written, on a loopback endpoint that answers from the dataset's gold answers
    instead of the embedded model (its ``lm="local"`` becomes ``lm="openai:oracle"``): optimize
    returns a LoopResult with a held-out CI, attribute an AttributionReport whose blame entries
    have the keys the snippet reads."""
    from optloop.testing.oracle import OracleEndpoint

    code = python_snippet()
    assert code.count('lm="local"') == 2
    with OracleEndpoint() as endpoint:
        for name, value in {
            "OPTLOOP_HOME": tmp_path / "state",
            "OPTLOOP_MLRUNS": tmp_path / "mlruns",
            "OPTLOOP_EMBED": "openai:oracle",
            "OPENAI_BASE_URL": endpoint.base_url,
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}",
        }.items():
            monkeypatch.setenv(name, str(value))
        scope: dict[str, object] = {}
        exec(compile(code.replace('lm="local"', 'lm="openai:oracle"'), "README.md", "exec"), scope)
    from optloop import AttributionReport, LoopResult

    result, report = scope["result"], scope["report"]
    assert isinstance(result, LoopResult) and isinstance(report, AttributionReport)
    assert result.delta_test_ci.n == result.n_test > 0 and result.config.system == "rag_bm25"
    assert report.questions > 0 and report.failures == len(report.attributions)
    out = capsys.readouterr().out
    assert str(result.delta_test_ci) in out


def test_the_readme_is_a_short_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


PAGES = ["README.md", *(str(p.relative_to(REPO)) for p in sorted((REPO / "docs").glob("*.md")))]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    path = REPO / page
    for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        resolved = (path.parent / target).resolve()
        if str(resolved.relative_to(REPO)) in LATER:
            continue
        assert resolved.exists(), f"{page} links to {target}, which does not exist"


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_is_closed(page):
    """An unclosed fence turns the rest of the page into code."""
    fences = [
        n
        for n, line in enumerate((REPO / page).read_text(encoding="utf-8").splitlines(), 1)
        if line.lstrip().startswith("```")
    ]
    assert len(fences) % 2 == 0, f"{page}: a code block opened at line {fences[-1]} is not closed"
