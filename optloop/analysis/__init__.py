"""What optloop finds out about a memory system without changing it: attribution over a dataset
(:mod:`~optloop.analysis.dataset`, ``optloop.attribute(...)``), over published traces
(:mod:`~optloop.analysis.traces`) and the planted-fault harness's report
(:mod:`~optloop.analysis.planted`). Each returns its report; :mod:`optloop.cli.attribute` prints
and writes them.
"""

from optloop.analysis.dataset import (
    DEFAULT_DATASET,
    DEFAULT_SYSTEM,
    AttributionReport,
    EpisodeDone,
    attribute,
    attribute_dataset,
)
from optloop.analysis.planted import planted_report
from optloop.analysis.traces import traces_report

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_SYSTEM",
    "AttributionReport",
    "EpisodeDone",
    "attribute",
    "attribute_dataset",
    "planted_report",
    "traces_report",
]
