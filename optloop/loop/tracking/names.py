"""The names of the MLflow metrics a loop run logs (parent run = one ``optloop.run``; child run =
one candidate). A leaf: the modules that build the metrics import it, it imports none of them.

=========================== ======= ===========================================================
name                        run     meaning
=========================== ======= ===========================================================
``acc_dev``                 both    dev accuracy; on the parent with step = trial (0 = baseline)
``acc_dev_best``            parent  best dev accuracy so far, step = trial
``acc_dev/<task>``          child   dev accuracy per task type
``acc_test_before``         parent  held-out test accuracy of the baseline
``acc_test_after``          parent  held-out test accuracy of the best candidate
``delta_test``              parent  ``acc_test_after - acc_test_before``
``acc_test_{before,after}_ci_{low,high}`` parent  95% bootstrap CI of that accuracy over the test
questions ``delta_test_ci_{low,high}`` parent  95% paired bootstrap CI of ``delta_test`` (per
question, after - before);
                                    ``--promote-if ci`` moves ``champion`` only when
                                    ``delta_test_ci_low > 0``
``acc_dev_control``         parent  dev accuracy of the trivial-instruction control
                                    (``optloop.loop.trivial_control``; absent: no control)
``acc_test_control``        parent  its held-out test accuracy, with ``_ci_{low,high}``
``delta_test_control``      parent  ``acc_test_after - acc_test_control`` per question, with its
                                    paired ``_ci_{low,high}``; the tag ``optloop.beats_control``
                                    says whether its CI lies above 0 (``no control``: none)
``n_dev`` ``n_test``        parent  questions in the dev and test splits (the n of those CIs)
``acc_test_{before,after}/<task>`` parent  per task type
``errors/<type>``           both    attributed failures per error type (child: dev; parent:
baseline train+dev) ``errors_test_{before,after}/<type>`` parent  on test
``blame_share/<target>``    both    share of failures blamed on a site or knob (``knob_top_k``)
``llm_calls`` ``model_calls`` ``tokens`` ``seconds``  both  cost (model_calls: not from the cache);
parent: every
                                    process of the run, summed
``cost_usd``                both    dollars, when the model has a price (litellm's table; none:
tokens only) ``llm_calls/<site>`` ``tokens/<site>`` ``cost_usd/<site>``  both  the same per prompt
site (``no_site``: calls
                                    outside any); child: the trial's evaluation, parent: the whole
                                    run
``proposer_*``              parent  the same for a ``--proposer-lm`` of its own
``processes``               parent  processes that worked on the run (resumes, workers)
``ingest_calls`` ``stores_reused``  child  ingestion cost of the candidate, stores it reused
``lm_faults``               child   questions lost to an LM fault the retries did not cure (counted
failed) ``lm_failed_calls``         both    LM calls that failed after their retries (child: its
evaluation; parent:
                                    ``lm_failed_calls_{dev_baseline,test_before,test_after}``);
                                    past 5 % of an evaluation's calls the run stops instead
                                    (``optloop.failures``)
``evaluations``             parent  candidate evaluations used (``<= --budget``)
=========================== ======= ===========================================================
"""

from __future__ import annotations

import re

BEATS_CONTROL = "optloop.beats_control"  # the parent run's tag: True, False or "no control"


def metric_key(name: str) -> str:
    """A metric-safe name: ``knob:top_k`` -> ``knob_top_k``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)
