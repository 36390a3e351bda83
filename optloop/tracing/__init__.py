"""Execution graphs: what a memory system did, as variables and operations linked by data flow."""

from optloop.tracing.graph import SCHEMA, ExecutionGraph, Operation, Variable, var_id

__all__ = ["SCHEMA", "ExecutionGraph", "Operation", "Variable", "var_id"]
