"""Parallel workers: one or several (``coordinator``), sharing an Optuna study's records
(``study``)."""
