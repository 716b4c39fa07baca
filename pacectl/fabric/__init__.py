"""Communication-duration and compute-noise models: what a delay can and cannot change.

The structural fact every model here respects (tested as a property in
``tests/test_structural.py``):

**A per-rank delay within earliness moves nothing on the fabric.** A collective starts when its
last rank arrives. If every rank's delay at a collective is at most its earliness there (how much
earlier than the last rank it arrived), the last arrival, and so the collective's start, is the
same instant as without pacing. Every duration model here is keyed on when transfers start: the
max-min fair sharing of :func:`~pacectl.fabric.topology.max_min_fair`, the on/off cross traffic of
:class:`~pacectl.fabric.contention.ContentionComm` (and its replay form,
:class:`~pacectl.fabric.profile.ReplayContention`), the several jobs sharing links of
:class:`~pacectl.backends.multijob.MultiJobSimBackend`. So each returns exactly the durations it
returns without pacing. Per-rank pacing can change an iteration in only three ways:

- what the delayed rank does while it waits: a rank that sleeps instead of spinning steals no
  cycles from a co-located peer still computing (early-arrival interference,
  :class:`~pacectl.fabric.contention.EarlyArrivalInterference`; the ``sleep_wait`` controller
  gives exactly this, with no delay at all);
- overshoot: a delay longer than the earliness delays the last arrival, which moves the start and
  lengthens the iteration (under max-plus, ``comm=null``, that is all it can do);
- what the delay also holds back: on CPU the pacer's sleep on the training thread blocks backward.

**A delay of every rank of a job is different.** It moves the job's collective, and so can
interleave it with another job's on the links they share (Cassini, NSDI 2024; MLTCP, 2024), or
move it out of a burst of cross traffic. That is the job-level ``phase`` controller, judged on the
sum over jobs, so that a gain for one job is not a loss moved onto another.
"""
