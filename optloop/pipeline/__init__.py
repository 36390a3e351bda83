"""The one episode pipeline: ingest (or reuse the store) → answer → score → record the graph →
attribute.

Every consumer of a memory system runs its episodes through :func:`run_episode`
(or :func:`run_episodes`, ``--concurrency`` at a time):

====================================== ===========================================================
caller                                 how it runs the pipeline
====================================== ===========================================================
``Evaluator.evaluate`` (the loop)      cached stores (:class:`CachedStores`), one candidate's
modules
                                       and knobs applied before each question, LM faults fail the
                                       question, graphs saved only when a fault hit the episode
``optloop.analysis.attribute_dataset`` fresh stores, recorded, every failure attributed (the LLM
                                       agent refines the ambiguous ones), every graph saved
``attribution.planted.run_planted``    fresh stores with a planted fault, recorded, the failures of
                                       clean passes attributed (``Attributor.select``)
``experiments.bench._common``          fresh stores, not recorded, not attributed: the system
alone,
                                       timed per stage
====================================== ===========================================================

The stages, in order:

1. **ingest**: an :class:`EpisodeStores` gives the episode's :class:`Store` (the system with every
   session ingested, and the recorder that watched it), built or reused.
2. **answer**: each question is retrieved and answered (:func:`answer`). On a *private* store the
   questions go on recording on the ingestion's recorder: one graph for the episode. On a *shared*
   store (kept for reuse by other candidates) each question records on its own copy of the
   ingestion graph, folded into an episode graph, so the store's own graph never changes.
3. **score**: :func:`judge` scores the prediction with the question's own scorer.
4. **record the graph**: the episode graph is saved by the caller's ``save_graph`` when it asks.
5. **attribute**: each failure is attributed on its final graph (the question's own copy, or the
   episode graph once every question is asked) by an :class:`Attributor`.

Concurrency lives here too. ``N`` is the LM's own ``--concurrency`` (``lm.settings.concurrency``,
:func:`concurrency`: 1 on the embedded model, 8 on an endpoint); there is no second knob. At
``N = 1`` everything runs one after another on the caller's thread, as it always did. At ``N > 1``
(:class:`Workers`: two pools of up to ``N`` daemon threads, every task in a copy of its submitter's
context, so the prompt site, the active recorder and the LM call collectors follow it):

* the episodes of a split run ``N`` at a time (:func:`run_episodes`), each in its own store;
* the questions of an episode run ``N`` at a time once its ingestion is done (the sessions of an
  episode always go in order: memory is stateful), then its attributions, ``N`` at a time too;
* the results are the serial run's, whatever ``N``: outcomes, graphs and attributions are put
  together in episode and question order, never in the order they finish, and the first error in
  that order is the one raised. Every question records on its own copy of the ingestion graph
  (:meth:`Recorder.resume`) and the copies are folded into the episode graph in question order,
  which is the graph the serial run records (on a private store the serial run records on the
  ingestion's recorder itself; ``tests/optloop/test_pipeline_concurrency.py`` compares the two).
  The store's lock is held for all of an episode's questions, and ``prepare`` runs once for them:
  they ask one candidate. The LM calls of an episode, a question or an attribution are counted by
  the LM layer's collectors (:func:`~optloop.lm.collect_calls`, context variables), not by marks in
  the log every thread writes. A shared :class:`StoreCache` decides reuse in episode order
  (:meth:`StoreCache.plan`). Systems whose memory ids are uuid4s (mem0, graphiti) name memories
  differently in any two runs, at one ``N`` or two.

graphiti goes through the same pools (chosen over its native async API end to end): each
``GraphitiSystem`` drives its own event loop on its own thread, as at ``N = 1``, and the calls
graphiti makes at once inside one ``add_episode`` (its ``semaphore_gather``) run on the LM's
threads (``lm.to_thread``). The one limit shared by every episode is the LM's throttle
(``--concurrency`` requests in flight, ``--rpm``, ``--tpm``), which every request of the process
passes, whichever thread or event loop makes it. So an episode runs exactly the code it runs at
``N = 1`` (the same requests, the same cache keys); one event loop for every episode would need an
async pipeline and recorder beside the synchronous ones every other system uses, for no more
requests in flight than the throttle allows.

An interrupt (SIGTERM, Ctrl-C) reaches the caller's thread while it waits for results: what has not
started is cancelled, and the calls in flight are left to their daemon threads, which leave with
the process (a ``ThreadPoolExecutor``'s would be waited for, on a hanging endpoint for its
timeouts).

See ``docs/architecture.md`` for where this sits in the whole data flow.
"""

from optloop.pipeline._episode import (
    Attributor,
    EpisodeResult,
    QuestionOutcome,
    answer,
    failed_outcome,
    judge,
    run_episode,
    run_episodes,
)
from optloop.pipeline._stores import (
    CachedStores,
    EpisodeStores,
    FreshStores,
    Store,
    StoreCache,
    StorePlan,
    ingest,
)
from optloop.pipeline._workers import Workers, concurrency, in_order

__all__ = [
    "Attributor",
    "CachedStores",
    "EpisodeResult",
    "EpisodeStores",
    "FreshStores",
    "QuestionOutcome",
    "Store",
    "StoreCache",
    "StorePlan",
    "Workers",
    "answer",
    "concurrency",
    "failed_outcome",
    "in_order",
    "ingest",
    "judge",
    "run_episode",
    "run_episodes",
]
