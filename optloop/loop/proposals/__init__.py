"""What optimizers use to make text: the proposal gate (``gate``), the writer's small tasks
(``writer``), an instruction's units (``units``) and each site's job as data (``jobs``)."""
