#!/usr/bin/env bash
# The checks that need a CUDA GPU, in the order they pay: the `cuda` tests, then the GPU target against
# HF and with the CPU drafter (bench_core), the CPU drafter's ONNX Runtime threads (bench_drafting),
# the cost model's predictions per draft length (a profiling run), overlap across the two devices
# (bench_overlap), and speculation control on the gpu-target-cpu-drafter profile.
# Run from the repository root on a CUDA host where hetspec is installed (README: Set up); results go
# to bench/figures/ (core-float16-cuda.json, drafting.json, overlap-cuda.json, overlap-cuda-int8.json,
# control-gpu-target-cpu-drafter.json, written cell by cell) and $TMPDIR/hetspec-gpu-profile/ (report.md).
#
#     bash bench/gpu_check.sh [SECONDS_FOR_BENCH_CONTROL]
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')" || exit 2
python -m pytest -q -p no:cacheprovider -m cuda -rs
python bench/bench_core.py --device cuda:0 --dtype float16 --drafters int4-lmh8 --adaptive ''
python bench/bench_drafting.py --batches 1,16 --k 4 --repeats 3 --threads 1,4,8,16
python -m orchestrator.cli profile run --profile gpu-target-cpu-drafter --workload chat --num-prompts 5 \
    --max-new-tokens 48 --sweep k=1,2,4 -k auto --out "${TMPDIR:-/tmp}/hetspec-gpu-profile" --no-progress
python bench/bench_overlap.py --parts device,device-remote --device cuda:0 --dtype float16 --drafter-threads 4 \
    --prompts 6 --tokens 128
python bench/bench_overlap.py --parts device --device cuda:0 --dtype float16 --drafter-threads 4 \
    --prompts 6 --tokens 128 --drafter int8 --k 6  # the drafter whose pre-drafts hit 80% on the CPU pair
timeout "${1:-900}" python bench/bench_control.py --profile gpu-target-cpu-drafter --workloads chat,code \
    --concurrency 1,16 --repeats 2
