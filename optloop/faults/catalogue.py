"""The catalogue of operation faults the attribution harness plants
(:mod:`optloop.faults.planted`):
each with the site (or knob) and error type a correct attribution must name, grouped by when it
joined (``added``: the original ones, then the preregistered ones, written down before any run
evaluated them)."""

from __future__ import annotations

from collections.abc import Iterable

from optloop.attribution.taxonomy import ErrorType, knob_target, library_target
from optloop.faults.corruptions import (
    UNRELATED_QUERY,
    _already_in_file,
    blur_old,
    compress_old,
    delete_old,
    drop_all,
    drop_numbers,
    echo_question,
    first_memory_only,
    first_only,
    forget_old,
    keys_only,
    lose_alternate_writes,
    overwrite_old,
    query_without_specifics,
    shift_old_numbers,
    truncate_facts,
    truncate_new,
)
from optloop.faults.model import PREREGISTERED, OperationFault
from optloop.sites import (
    ANSWER,
    GATED_ADMIT,
    GRAPHITI_EXTRACT_EDGES,
    MD_FLAT_CURATE,
    MEM0_EXTRACT,
    QUERY_REWRITE,
    TIERED_EXTRACT,
)
from systems import SYSTEMS

_BASELINES_AND_MEM0 = ("mem0", "rag_bm25", "rag_embedding", "long_context")
_ALL_SYSTEMS = tuple(SYSTEMS)

CATALOGUE: tuple[OperationFault, ...] = (
    OperationFault(
        "mem0-extract-drop-numbers",
        ("mem0",),
        MEM0_EXTRACT,
        ErrorType.EXTRACTION,
        "extraction drops every fact with a date or a number",
        site=MEM0_EXTRACT,
        lists=drop_numbers,
    ),
    OperationFault(
        "mem0-extract-first-only",
        ("mem0",),
        MEM0_EXTRACT,
        ErrorType.EXTRACTION,
        "extraction keeps only the first fact of a session",
        site=MEM0_EXTRACT,
        lists=first_only,
    ),
    OperationFault(
        "graphiti-edges-dropped",
        ("graphiti",),
        GRAPHITI_EXTRACT_EDGES,
        ErrorType.EXTRACTION,
        "edge (fact) extraction returns no facts",
        site=GRAPHITI_EXTRACT_EDGES,
        lists=drop_all,
    ),
    OperationFault(
        "mdflat-curate-first-only",
        ("md_flat",),
        MD_FLAT_CURATE,
        ErrorType.EXTRACTION,
        "curation keeps the old file but only the first new fact",
        site=MD_FLAT_CURATE,
        lists=lambda items, inputs: (
            [i for i in items if _already_in_file(i, inputs)]
            + [i for i in items if not _already_in_file(i, inputs)][:1]
        ),
    ),
    OperationFault(
        "mdflat-curate-overwrites",
        ("md_flat",),
        MD_FLAT_CURATE,
        ErrorType.UPDATE,
        "curation rewrites every existing fact with its specifics replaced",
        site=MD_FLAT_CURATE,
        lists=blur_old,
    ),
    OperationFault(
        "mdflat-curate-forgets",
        ("md_flat",),
        MD_FLAT_CURATE,
        ErrorType.DELETION,
        "curation deletes every fact already in the file",
        site=MD_FLAT_CURATE,
        lists=forget_old,
    ),
    OperationFault(
        "tiered-extract-first-only",
        ("tiered",),
        TIERED_EXTRACT,
        ErrorType.EXTRACTION,
        "the extraction stage keeps only the first fact of each message",
        site=TIERED_EXTRACT,
        lists=first_only,
    ),
    OperationFault(
        "tiered-extract-keys-only",
        ("tiered",),
        TIERED_EXTRACT,
        ErrorType.EXTRACTION,
        "the extraction stage writes keys without values (every fact refused)",
        site=TIERED_EXTRACT,
        lists=keys_only,
    ),
    OperationFault(
        "tiered-category-matches-nothing",
        ("tiered",),
        knob_target("search_recipe"),
        ErrorType.RETRIEVAL,
        "retrieval searches only a category no fact or summary is filed under "
        "(search_recipe=category:archived)",
        knobs={"search_recipe": "category:archived"},
    ),
    OperationFault(
        "store-deletes-old",
        ("mem0", "rag_bm25", "rag_embedding", "long_context"),
        library_target("{system}.store"),
        ErrorType.DELETION,
        "the store deletes every memory of earlier sessions when a session is added",
        after_session=delete_old,
    ),
    OperationFault(
        "store-overwrites-old",
        ("mem0", "rag_bm25", "rag_embedding", "long_context"),
        library_target("{system}.store"),
        ErrorType.UPDATE,
        "the store rewrites every memory of earlier sessions with its specifics replaced",
        after_session=overwrite_old,
    ),
    OperationFault(
        "top-k-1",
        ("mem0", "rag_bm25", "rag_embedding", "md_flat", "tiered"),
        knob_target("top_k"),
        ErrorType.RETRIEVAL,
        "top_k set to 1",
        knobs={"top_k": 1},
    ),
    OperationFault(
        "query-unrelated",
        ("mem0", "rag_bm25", "rag_embedding", "tiered"),
        QUERY_REWRITE,
        ErrorType.RETRIEVAL,
        "the query-rewrite site turns every question into an unrelated query",
        site=QUERY_REWRITE,
        outputs={"query": UNRELATED_QUERY},
        query_site=True,
    ),
    OperationFault(
        "answer-unknown",
        ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat"),
        ANSWER,
        ErrorType.RESPONSE,
        "the answer site replies 'unknown'",
        site=ANSWER,
        outputs={"answer": "unknown"},
    ),
    OperationFault(
        "answer-ignores-memories",
        ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat"),
        ANSWER,
        ErrorType.RESPONSE,
        "the answer site ignores the memories it is given",
        site=ANSWER,
        inputs={"memories": "(no memories)"},
    ),
    # --- preregistered ---------------------------------------------------------------------------
    # Ten faults of kinds the catalogue did not have, over store, update, extraction, retrieval and
    # answer. Written down and committed BEFORE any run evaluated them (no figure was seen while
    # writing them), so they are not tuned to the walk. Each one's true target and type say what
    # happened by the taxonomy's definitions (taxonomy.ErrorType), not what the walk is expected to
    # answer. Their first-run figures are reported as they come, next to any later ones.
    # store: writes acknowledged but lost (the evidence never becomes a memory, by the store's
    # fault)
    OperationFault(
        "store-loses-alternate-writes",
        _BASELINES_AND_MEM0,
        library_target("{system}.store"),
        ErrorType.EXTRACTION,
        "the store acknowledges every write but persists only every other memory unit of "
        "a session (the 2nd, 4th, ... are lost)",
        after_session=lose_alternate_writes,
        added=PREREGISTERED,
    ),
    # update: a plausible but wrong value written over a kept one (not blurred, not removed)
    OperationFault(
        "store-shifts-numbers",
        _BASELINES_AND_MEM0,
        library_target("{system}.store"),
        ErrorType.UPDATE,
        "the store rewrites every memory of earlier sessions with each number one higher (3 "
        "-> 4, 2023 -> 2024)",
        after_session=shift_old_numbers,
        added=PREREGISTERED,
    ),
    # update: a lossy summary of the existing memory (MemFail's summary error)
    OperationFault(
        "mdflat-curate-compresses",
        ("md_flat",),
        MD_FLAT_CURATE,
        ErrorType.UPDATE,
        "curation collapses every fact already in the file into one summary line of its "
        "first twelve words",
        site=MD_FLAT_CURATE,
        lists=compress_old,
        added=PREREGISTERED,
    ),
    # extraction: every fact kept, each cut short (partial facts, not dropped facts)
    OperationFault(
        "mem0-extract-truncates",
        ("mem0",),
        MEM0_EXTRACT,
        ErrorType.EXTRACTION,
        "extraction keeps every fact but cuts each to its first four words",
        site=MEM0_EXTRACT,
        lists=truncate_facts,
        added=PREREGISTERED,
    ),
    OperationFault(
        "mdflat-curate-truncates-new",
        ("md_flat",),
        MD_FLAT_CURATE,
        ErrorType.EXTRACTION,
        "curation keeps the old file but cuts every new fact to its first four words",
        site=MD_FLAT_CURATE,
        lists=truncate_new,
        added=PREREGISTERED,
    ),
    # retrieval: a score cut-off that filters (not a rank cut-off), a query that lost its key terms
    # (not an unrelated one), a search over the wrong layer of the graph
    OperationFault(
        "threshold-strict",
        ("mem0", "rag_embedding"),
        knob_target("threshold"),
        ErrorType.RETRIEVAL,
        "the similarity threshold set to 0.99",
        knobs={"threshold": 0.99},
        added=PREREGISTERED,
    ),
    OperationFault(
        "query-drops-specifics",
        ("mem0", "rag_bm25", "rag_embedding"),
        QUERY_REWRITE,
        ErrorType.RETRIEVAL,
        "the query rewrite returns the question with its names, numbers and dates removed",
        site=QUERY_REWRITE,
        edit_outputs=query_without_specifics,
        query_site=True,
        added=PREREGISTERED,
    ),
    OperationFault(
        "graphiti-recipe-nodes-only",
        ("graphiti",),
        knob_target("search_recipe"),
        ErrorType.RETRIEVAL,
        "search_recipe set to NODE_HYBRID_SEARCH_RRF: the search returns entity nodes, "
        "never the facts (edges)",
        knobs={"search_recipe": "NODE_HYBRID_SEARCH_RRF"},
        added=PREREGISTERED,
    ),
    # answer: a degenerate output (not a fixed one), and a context cut short at the answer (not
    # emptied)
    OperationFault(
        "answer-echoes-question",
        _ALL_SYSTEMS,
        ANSWER,
        ErrorType.RESPONSE,
        "the answer site replies with the question itself",
        site=ANSWER,
        edit_outputs=echo_question,
        added=PREREGISTERED,
    ),
    OperationFault(
        "answer-sees-first-memory",
        _ALL_SYSTEMS,
        ANSWER,
        ErrorType.RESPONSE,
        "the answer site sees only the first of the memories it is given",
        site=ANSWER,
        edit_inputs=first_memory_only,
        added=PREREGISTERED,
    ),
    # --- gated: written down before any run evaluated them. Truth is the taxonomy's definition:
    # who let the stale memory into the answer's positive context. Lenient floors leave status and
    # branch to the gate's LLM, so there the gate site decides; with the floors off and no LLM
    # asked, the floors knob does.
    OperationFault(
        "gated-gate-admits-all",
        ("gated",),
        GATED_ADMIT,
        ErrorType.CONTAMINATION,
        "floors lenient (status and branch left to the gate) and the gate admits every "
        "candidate it decides",
        site=GATED_ADMIT,
        knobs={"floors": "lenient"},
        lists=lambda items, _: [
            i.model_copy(update={"verdict": "admit", "reason": "looks relevant"})
            if getattr(i, "by", "floor") != "floor"
            else i
            for i in items
        ],
    ),
    OperationFault(
        "gated-floors-off",
        ("gated",),
        knob_target("floors"),
        ErrorType.CONTAMINATION,
        "floors off and no LLM verdict (gate=floors_only): every retrieved candidate enters "
        "the answer",
        knobs={"floors": "off", "gate": "floors_only"},
    ),
    OperationFault(
        "gated-top-k-1",
        ("gated",),
        knob_target("top_k"),
        ErrorType.RETRIEVAL,
        "top_k set to 1",
        knobs={"top_k": 1},
    ),
)


def faults_for(system: str, names: Iterable[str] | None = None) -> list[OperationFault]:
    wanted = set(names) if names else None
    return [f for f in CATALOGUE if f.applies_to(system) and (wanted is None or f.name in wanted)]
