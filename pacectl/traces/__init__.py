"""Trace formats and the importers (``python -m pacectl.traces``).

| `trace=` | input |
| --- | --- |
| `ar`, `st`, `bytedance` | ByteDance what-if parquet + job-meta YAML (`trace.path`, `trace.meta`) |
| `kineto` | PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank: a directory, glob or list; gzip or plain; NCCL (old and new kernel names), gloo and CPU-only; truncated files recovered to the last complete event |
| `steplevel` / `alibaba` | per-worker, per-iteration step times without timestamps (Alibaba PAI mini-batch CSV), as compute plus one collective per step; `batch_time_norm` is normalised (0-1000 per job), so the trace is marked `time_unit="normalized"` |
| `canonical` | pacectl's own Parquet (written by live and simulated runs and by `convert`) |

```bash
python -m pacectl.traces info pacectl/data/h200-capture        # ranks, steps, collectives, spread, clock residual
python -m pacectl.traces info pacectl/data/bytedance/trace-AR.parquet   # a ByteDance trace: meta-AR.yaml beside it is used
python -m pacectl.traces validate PATH...                       # every problem with file, event and field
python -m pacectl.traces convert PATH -o trace.parquet          # to the canonical format (creates -o's folders)
```

Kineto ranks on different hosts are aligned on collective end times (all ranks leave a collective
together) and the residual is reported; collectives are matched by process group and sequence number
where present, else by ordinal within their stream, and the report says which. Malformed inputs
(truncated gzip, invalid JSON, missing keys, NaN or absurd durations, duplicated events, unmatched
collectives, wrong world size, empty directories, oversized files) end with a precise message;
Hypothesis fuzzes the importers with mutations of the real files.

- **Repairs** (warned, with what and how much was dropped, in one wording across importers; `info`
  and `validate` print them as `warning:` lines): exact duplicate rows (CSV, ByteDance and canonical
  Parquet) are dropped; rows that share a key but differ in a value stay an error naming the key.
  Steps not recorded by every worker or rank are dropped
  (`dropped 16 of 254 steps (21 rows): not recorded by all 10 workers: steps [...]`).
- **Truncated Kineto files** are recovered to the last complete event; when a truncated (or much
  shorter) rank file leaves the ranks without common steps or matching collectives, the error names
  that file, says it looks truncated and how to fix it (re-export it, or pass only the complete ranks).
- **A folder holding several jobs** (for example the full `h200-capture/` of the shared traces,
  outside this repository: `gloo4_rank*` and `nccl1_rank0`; the copy shipped in
  `pacectl/data/h200-capture/` holds the gloo job only) is refused with a glob that picks one:
  `'<dir>/gloo4_rank*.json.gz'`.
- **Normalised times**: `OpTrace.time_unit` is `"s"` (real seconds) or `"normalized"` (step-level
  `batch_time_norm`, replayed at `trace.unit_s` seconds per unit, kept as `OpTrace.norm_unit_s`;
  `OpTrace.time_normalized` is the boolean). `info` prints such times in units with a note that
  seconds and it/s derived from them are arbitrary; canonical Parquet (`convert`) keeps the mark.
- Exit codes: 0 usable, 1 unusable trace, 2 bad command line, including an `-o` that cannot be
  written (`could not write <path>: <reason>`, nothing written).
"""
