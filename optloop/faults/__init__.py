"""Planted faults: a system broken on purpose in one known place (:mod:`optloop.faults.model`),
the operation faults that measure attribution (:mod:`optloop.faults.catalogue`) and the
instruction faults that measure repair (:mod:`optloop.faults.sabotages`)."""
