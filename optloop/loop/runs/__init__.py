"""A run's lifecycle: what it is asked for (``request``), the run from its request to its
result (``session``), its wiring (``runner``: ``Loop``) and what it stands on (``context``,
``dirs``, ``split_evaluator``), the run a command resumes and its checkpoint's guard."""
