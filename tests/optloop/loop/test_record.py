"""Prompt Registry names: one ``optloop.`` prefix, the system only where the site lacks it."""

from __future__ import annotations

from optloop.loop.record import registry_name


def test_library_sites_are_not_prefixed_twice_and_shared_sites_get_the_system():
    assert registry_name("mem0", "mem0.extract") == "optloop.mem0.extract"
    assert registry_name("mem0", "answer") == "optloop.mem0.answer"
    assert registry_name("graphiti", "graphiti.extract_edges.edge") == "optloop.graphiti.extract_edges.edge"
    assert registry_name("graphiti", "retrieve.query") == "optloop.graphiti.retrieve.query"
    assert registry_name("md_flat", "md_flat.curate") == "optloop.md_flat.curate"
    assert registry_name("mem0", "mem0x.extract") == "optloop.mem0.mem0x.extract"
