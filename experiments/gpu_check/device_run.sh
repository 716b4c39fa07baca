#!/usr/bin/env bash
# Everything the project needs from one lent GPU machine (one H200, 16 CPU cores), in one call:
#
#   1. experiments/gpu_check/gpu_check.py: the CUDA/NCCL pacing path (device-side delay, host and
#      compute stream not blocked, DDP end to end in every exchange mode, zero-delay cost on the GPU),
#      the physics steps (sleep_calibration, kappa_on_device, power_states) and FSDP2's stream check;
#   2. FSDP2's zero-delay pacer overhead on CUDA (issue 24): experiments/bench/bench_fsdp2.py with 2 gloo
#      ranks sharing the one GPU (with one rank FSDP2 issues no collective; NCCL refuses two ranks on one
#      GPU), briefly (20 rounds, at most 80 s);
#   3. the issue's <= 1 % overhead goal with a core per rank, which the 2-core development machine
#      cannot give: experiments/bench/bench_torchdist.py with 4 gloo ranks (1 thread each) on the
#      machine's CPUs, the same configuration as results/torchdist_2rank_async.json.
#
# Usage with the device tool (timeout_s=590; at most 230 + 80 + 250 s of commands; the records come back under $OUT):
#   bash experiments/gpu_check/device_run.sh
# Copy $OUT/gpu_check.json to experiments/gpu_check/results/gpu_check_runN.json (the next N), and
# $OUT/fsdp2_cuda_gloo_2rank.json and $OUT/torchdist_4rank_16core.json to experiments/bench/results/. Dry run on any machine (small, CPU only; check 1 skips with 77):
#   OUT=/tmp/dry ROUNDS=2 REPS=5 bash experiments/gpu_check/device_run.sh
# The image has torch, numpy, scipy and pandas but not hydra or optuna; neither script needs them.
set -u
out="${OUT:-/tmp/pacectl_device_run}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# pacectl is not installed there: the bench and the ranks it spawns import it from this checkout
export PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
{ git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo "commit: unknown"; nproc; lscpu 2>/dev/null | grep -E 'Model name|^CPU\(s\)|Thread|NUMA node\(s\)'; nvidia-smi -L 2>/dev/null; } | tee "$out/machine.txt"
python3 experiments/gpu_check/gpu_check.py --watchdog-s 230 --out "$out/gpu_check.json"
gpu_rc=$?
echo "gpu_check exit code: $gpu_rc"
if [ "$gpu_rc" -ne 77 ]; then  # CUDA present
  timeout 80 python3 experiments/bench/bench_fsdp2.py --device cuda --backend gloo --nproc 2 \
    --rounds "${FSDP2_ROUNDS:-20}" --block 5 --out "$out/fsdp2_cuda_gloo_2rank.json"
  echo "bench_fsdp2 exit code: $? (recorded, not judged)"
fi
timeout 250 python3 experiments/bench/bench_torchdist.py --nproc 4 --widths 1024 --rounds "${ROUNDS:-40}" \
  --block 5 --batch 512 --bucket-cap-mb 25 --reps "${REPS:-50}" --variants plain,py_hook,no_gather,async,piggyback \
  --out "$out/torchdist_4rank_16core.json"
bench_rc=$?
echo "bench exit code: $bench_rc"
# 77 (no CUDA) counts as success for the bench-only dry run
[ "$bench_rc" -eq 0 ] && { [ "$gpu_rc" -eq 0 ] || [ "$gpu_rc" -eq 77 ]; }
