"""The planted-fault model: both kinds plant themselves on a real system and name the site a
blame must find."""

from __future__ import annotations

import pytest

from optloop.faults.catalogue import CATALOGUE
from optloop.faults.model import InstructionFault, OperationFault, PlantedFault
from optloop.faults.sabotages import SABOTAGES
from optloop.sites import ANSWER, QUERY_REWRITE
from systems.baselines import BM25RagSystem
from tests.systems._gated_fakes import BowEmbedder


def rag(tmp_path, **kwargs) -> BM25RagSystem:
    return BM25RagSystem(  # type: ignore[arg-type]
        None, tmp_path, embedder=BowEmbedder(), query_site=True, **kwargs
    )


def test_every_planted_fault_is_one_model_with_unique_names():
    faults: list[PlantedFault] = [*CATALOGUE, *SABOTAGES]
    assert all(isinstance(f, OperationFault) for f in CATALOGUE)
    assert all(isinstance(f, InstructionFault) and f.target == f.site for f in SABOTAGES)
    assert len({f.name for f in faults}) == len(faults)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("replace", "Say nothing."),
        ("append", "{clean} Say nothing."),
        ("prepend", "Say nothing. {clean}"),
    ],
)
def test_an_instruction_fault_writes_the_sites_instruction_as_its_start_says(
    tmp_path, mode, expected
):
    system = rag(tmp_path)
    clean = system.prompt_sites()[ANSWER].instructions
    fault = InstructionFault(
        "answer-nothing", ("rag_bm25",), ANSWER, mode=mode, text="Say nothing."
    )

    fault.apply(system)

    assert system.prompt_sites()[ANSWER].instructions == expected.format(clean=clean)
    assert system.prompt_sites()[QUERY_REWRITE].changed is False  # only its own site
    assert (
        fault.system == "rag_bm25"
        and fault.applies_to("rag_bm25")
        and not fault.applies_to("mem0")
    )


def test_an_operation_fault_sets_its_knobs_on_the_system(tmp_path):
    system = rag(tmp_path)
    fault = next(f for f in CATALOGUE if f.name == "top-k-1")

    fault.apply(system)

    assert system.knobs()["top_k"] == 1 and fault.target == "knob:top_k"
