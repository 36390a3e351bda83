"""What optloop meets outside itself, each behind small functions the layers above call or are
handed: the MLflow tracking store (:mod:`~optloop.services.tracking`, the embedded SQLite store
made whole by :mod:`~optloop.services.tracking_store`), the checks before a run writes anything
(:mod:`~optloop.services.preflight`: the tracking server and a database ``--storage`` probed, the
places written checked writable) and the faults met mid-run (:mod:`~optloop.services.outside`: a
full disk, an unwritable store, a lost server, as one line and an exit code). Nothing here imports
the loop or a command.
"""
