"""Published traces attributed offline: MEME's traces (``meme:<dir>``) imported as one graph per
system and episode, every probe their judge failed attributed with no LM (``optloop attribute
--from-traces``)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from optloop.attribution import blame
from optloop.errors import ConfigError


def traces_report(uri: str, out: Path, lexical_only: bool = False) -> dict[str, Any]:
    """Import published traces (``meme:<dir>``), attribute every failed probe offline, save the
    graphs."""
    from optloop.attribution.traces import attribute_traces, llm_calls, warm_embedder
    from optloop.tracing.meme_traces import import_traces

    scheme, _, rest = uri.partition(":")
    if scheme != "meme" or not rest:
        raise ConfigError(
            f"--from-traces {uri!r}: expected meme:<dir> (a checkout of meme-eval, or its "
            "src/data/<name>.json)"
        )
    started = time.perf_counter()
    runs = import_traces(rest)
    import_s = time.perf_counter() - started
    embedder, load_s = (None, 0.0) if lexical_only else warm_embedder()
    failures = attribute_traces(runs, embedder)
    for run in runs:
        run.graph.save(out / "graphs" / run.system / f"{run.episode.id}.json")
    attributions = [f.attribution for f in failures]
    ms = sorted(f.seconds * 1000 for f in failures)
    return {
        "source": uri,
        "systems": list(dict.fromkeys(r.system for r in runs)),
        "probes": sum(len(r.probes) for r in runs),
        "failures": len(failures),
        "blame": [e.model_dump() for e in blame(attributions)],
        "by_type_and_site": [
            {"type": t, "target": s, "n": n}
            for (t, s), n in Counter(
                (a.error_type.value, a.target or "-") for a in attributions
            ).most_common()
        ],
        "by_system_and_type": [
            {"system": sy, "type": t, "n": n}
            for (sy, t), n in Counter(
                (f.system, f.attribution.error_type.value) for f in failures
            ).items()
        ],
        "attributions": [f.to_json() for f in failures],
        "ms_per_failure": sum(ms) / len(ms) if ms else None,
        "median_attribution_ms": ms[len(ms) // 2] if ms else None,
        "ambiguous": sum(a.ambiguous for a in attributions),
        "llm_calls": llm_calls(failures),
        "judges": "lexical" if embedder is None else f"lexical+embedding ({embedder.name})",
        "cost": {
            "llm_calls": llm_calls(failures),
            "tokens": 0,
            "seconds": round(time.perf_counter() - started, 3),
            "import_seconds": round(import_s, 3),
            "embedder_load_seconds": round(load_s, 3),
        },
    }
