"""Trace formats and their importers, each into the canonical :class:`~pacectl.traces.model.OpTrace`.

| `trace=` | input | importer |
| --- | --- | --- |
| `ar`, `st`, `bytedance` | ByteDance what-if parquet + job-meta YAML (`trace.path`, `trace.meta`) | :mod:`~pacectl.traces.bytedance` |
| `kineto` | PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank: a directory, glob or list | :mod:`~pacectl.traces.kineto` |
| `flight_recorder` | PyTorch Flight Recorder dumps, one per rank (pickle or JSON) | :mod:`~pacectl.traces.flight_recorder` |
| `nccl_inspector` | NCCL Inspector `<host>-pid<pid>.log` JSON lines | :mod:`~pacectl.traces.nccl_inspector` |
| `steplevel` / `alibaba` | per-worker, per-iteration step times (Alibaba PAI mini-batch CSV), normalised times | :mod:`~pacectl.traces.steplevel` |
| `canonical` | pacectl's own Parquet (written by live and simulated runs and by `convert`) | :mod:`~pacectl.traces.canonical` |

Each format's keys are its dataclass in :mod:`pacectl.traces.formats`; each importer's module
docstring says what it reads, how it maps to ops, what it repairs (with a warning naming what was
dropped) and what it refuses (one line naming the file, event or key, and the fix). The command line
(``info``, ``validate``, ``convert``, ``fit``) and its exit codes: :mod:`pacectl.traces.__main__`.
Hypothesis fuzzes the importers with mutations of the shipped files (``tests/test_fuzz.py``).
"""
