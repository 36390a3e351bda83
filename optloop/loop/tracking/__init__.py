"""A run's MLflow side: the controller's sink (``sink``), the run's own records (``run``), the
metrics, artifacts and plots it logs (``metrics``, named in ``names``), the prompt registry."""
