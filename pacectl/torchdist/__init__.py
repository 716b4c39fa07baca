"""The real torch.distributed backend: pace a live DDP job, record it, replay it.

Import this package only when a live run is wanted: :mod:`pacectl.torchdist.core` is pure numpy,
while :mod:`~pacectl.torchdist.pacer`, :mod:`~pacectl.torchdist.worker` and
:mod:`~pacectl.torchdist.launch` import torch. Replay, simulation and tuning never import it
(``pacectl.experiment`` loads :class:`~pacectl.torchdist.experiment.TorchExperiment` lazily).

Any DDP loop gets it with one line (``attach``), once the process group is initialised::

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import Pacer
    engine = DecisionEngine("threshold", {}, {"max_delay_frac": 0.5},
                            num_ranks=dist.get_world_size(), seed=0)   # the same on every rank
    pacer = Pacer(engine, control_path="pacing.json").attach(ddp_model)
    ...                 # training loop unchanged
    pacer.flush()       # every rank, at the end: decide on the figures still in flight

Reference for users
-------------------

### Arrival skew without synchronized clocks

All ranks leave a collective together, so a rank's earliness is its wait inside the paced
collective minus the smallest wait (:mod:`pacectl.torchdist.core`). Every rank decodes the same
exchanged figures and runs the same guarded controller, so all ranks take bit-identical decisions
without waiting for one another (tested). The figures are exchanged in one of three ways
(`backend.pacing.gather`; `gather_every=k` sends k iterations' figures at once; the mechanism:
:mod:`pacectl.torchdist.pacer`):

| mode | how | decision applies |
| --- | --- | --- |
| `auto` (default) | `async` on gloo, `piggyback` on NCCL | 1 iteration later (gloo), 2 (NCCL) |
| `async` | one tiny all-reduce at the end of the gradient sync, not waited for | 1 iteration later |
| `piggyback` | appended to the next iteration's smallest gradient bucket: no extra collective, one copy of that bucket (`backend.pacing.piggyback_max_bytes=N`: on CPU a larger carrier is not copied, the figures go in a tiny all-reduce beside it) | 2 iterations later |
| `collective` | the same tiny all-reduce, blocking (one round trip per iteration) | 1 iteration later |

Why `auto` is what it is, with the measurements: :func:`~pacectl.torchdist.core.resolve_gather`.
Replay and simulation model any of these with `exchange.lag_iters` and `exchange.every_iters`.

### Runtime control and safety

- **Switch off or retune without a restart.** A JSON control file (`backend.pacing.control_path`;
  write it atomically) switches pacing off (`{"enabled": false}`) or retunes the controller
  (`{"controller": {"name": "pid", "kp": 0.2}}`). Every rank applies it at the same iteration; a file
  already there at the start is applied at the first poll. It retunes the paced runs only: the
  no-pacing baseline stays unpaced.
- **Every control is logged** with the iteration it took effect, on the console and in
  `summary.json` (`measured.<run>.runtime_controls`). A malformed file is ignored with a warning and
  listed with the reason (`measured.<run>.runtime_controls_rejected`).
- **The guard** caps every delay; a controller error or a non-finite input means zero delay and a
  warning.
- **A dead rank** ends the job with a clear error within the process-group timeout
  (`backend.pg_timeout_s`), never a hang. Ctrl-C stops the job with one line.
- Every `backend.*` key and value is checked before any rank starts, unknown keys included.

### Probe delays

`backend.probe` (off by default: `ranks: []`) injects small random sleeps between forward and
backward that give the fit (`comm=fitted`) variation in arrivals no controller caused; how they are
drawn and recorded: :class:`~pacectl.torchdist.core.ProbeSpec` (`experiments/probe/`).

### Records and replay fidelity

Every run writes `records/<controller>.parquet`, its canonical record, replayable with
`trace=canonical`, and `records/<controller>.episode.pkl`, the episode and the measured costs. Both
are moved into place only when the whole run succeeded; a `backend.record_dir` that already holds
records of the same controllers gets a warning before the run.

**One time axis.** Every rank stamps its own marks, each stamp late by however long that rank's
thread waited for a core. Ranks on one host (network namespaces included) share the clock behind
`time.perf_counter`, so the record puts them on one axis (`torchdist.core.shared_clock_marks`): the
record and the episode use the same iteration times, and they sum to the wall time. Ranks on
different hosts fall back to the mean of the ranks' own periods (`common_periods`). The summary
reports fidelity, replay against live, per run (`fidelity.by_run`, with `compares` saying what):

- **Self-replay** (the null model's consistency check): each record replayed with its recorded
  delays, against the live iteration times. Buckets are recorded as issued, not serialised
  (gloo's two worker threads let a later bucket finish first), and a bucket is posted after the
  compute that ended before it in every recorded step.
- **Counterfactual** (`counterfactual_vs_live_none`, paced runs only): the paced record replayed with
  zero delays, against the live no-pacing run on the same straggler schedule (`mean_err_frac`: mean
  iteration time). On CPU/gloo the pacing sleep blocks the training thread, so records mark it
  (`pacing_blocks_compute`) and the replay delays the compute after bucket 0's launch too.
- **The effect of pacing**: `predicted_pacing_effect_s`, the record replayed with its delays minus
  without them, against `live_pacing_effect_s`, the paced run's mean iteration minus the unpaced
  run's.

The console and `report.md` print the self-replay and counterfactual checks, one line each per run:

```
replay counterfactual of threshold: its record replayed with zero delays vs the live no-pacing run: mean iteration +0.0206 %; pacing effect per iteration predicted +0.501 ms, live +0.508 ms (one job, no interval: single jobs scatter by a few ms, experiments/live_fidelity)
```

`experiments/live_fidelity/` repeats the default job over many seeds; its README has the figures (in
short: on average the replay predicts what pacing costs to within about 1 ms, and no live effect
below the prediction has been established). A `trace=canonical` replay of a live record reports the
same self-replay fidelity (the record carries its measured iteration times); the counterfactual
needs the live no-pacing run beside it. The self-replay is exact for iteration times, not for the
arrival spread: the live run derives arrivals from waits inside the first bucket's all-reduce, the
replay from the recorded enter stamps, each late by its own rank's wait for a core.
"""

from __future__ import annotations
