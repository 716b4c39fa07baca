"""Write the synthetic fixtures shipped beside the real gloo dumps (formats torch 2.13 on CPU cannot produce).

Run from the repository root::

    python experiments/flight_recorder/write_synthetic.py

- ``pacectl/data/flight-recorder/synth_megatron_nccl/``: Flight Recorder format 2.10 pickles of an
  8-rank Megatron-style job (dp 2 x pp 2 x tp 2, Megatron's group descriptions), NCCL entries
  ``completed`` with ``duration_ms`` (as ``TORCH_NCCL_ENABLE_TIMING=1`` writes them), the hosts
  running 30 to 50 ms ahead of the devices (so enqueue times mislead and durations do not), rank 2
  (stage 0, DP rank 1) a straggler by 20 ms every step.
- ``pacectl/data/flight-recorder/synth_pp2_p2p/``: Flight Recorder format 2.10 pickles of a
  4-rank dp 2 x pp 2 job (Megatron's group descriptions), NCCL entries with ``duration_ms``; each
  step a GPipe schedule of 2 microbatches on each pipeline group (2 activations sent stage 0 -> 1,
  2 gradients back, ``p2p_seq_id`` counted as ProcessGroupNCCL counts it), then 2 gradient
  reduce-scatters per DP group; rank 1 (stage 0, DP rank 1) a straggler by 20 ms every step; the
  first stage of each pipeline had posted the next step's first send when the dumps were taken
  (its recv is in no dump: one unmatched send per pipeline). gloo records no send/recv in torch
  2.13, so no real dump can show point-to-point matching on CPU.
- ``pacectl/data/nccl-inspector/verbose/`` and ``plain/``: NCCL Inspector logs (format ``v4.0``) of
  a 4-rank DP job, rank 2 late by 20 ms every step; ``verbose`` with ``event_trace_ts``
  (``NCCL_INSPECTOR_DUMP_VERBOSE=1``), ``plain`` without.

All come from :mod:`pacectl.testing.synth_traces` with a fixed seed, so rerunning writes the same
files; ``tests/test_traces_flight_recorder.py`` checks that and that the importers recover the
ground truth.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pacectl.testing.synth_traces import (
    SynthJob,
    flight_recorder_dumps,
    nccl_inspector_logs,
    write_flight_recorder,
)

DATA = Path(__file__).resolve().parents[2] / "pacectl" / "data"
MEGATRON = SynthJob(
    dp=2, pp=2, tp=2, steps=6, buckets=2, straggler_s={2: 0.02}, host_lead_s=0.03, host_jitter_s=0.02, seed=1
)
PIPELINE = SynthJob(
    dp=2, pp=2, steps=6, buckets=2, microbatches=2, p2p_in_flight=True, straggler_s={1: 0.02}, seed=3
)
INSPECTOR = SynthJob(dp=4, steps=6, buckets=2, straggler_s={2: 0.02}, seed=2)


def write_all(data: Path = DATA) -> list[Path]:
    """Write every synthetic fixture under ``data``; returns the folders."""
    fr = data / "flight-recorder" / "synth_megatron_nccl"
    shutil.rmtree(fr, ignore_errors=True)
    write_flight_recorder(flight_recorder_dumps(MEGATRON, version="2.10", backend="nccl"), fr)
    pp = data / "flight-recorder" / "synth_pp2_p2p"
    shutil.rmtree(pp, ignore_errors=True)
    write_flight_recorder(flight_recorder_dumps(PIPELINE, version="2.10", backend="nccl"), pp)
    out = [fr, pp]
    for verbose in (True, False):
        folder = data / "nccl-inspector" / ("verbose" if verbose else "plain")
        shutil.rmtree(folder, ignore_errors=True)
        nccl_inspector_logs(INSPECTOR, folder, verbose=verbose)
        out.append(folder)
    return out


if __name__ == "__main__":
    for f in write_all():
        print(f"wrote {f} ({sum(p.stat().st_size for p in f.iterdir())} bytes)")
