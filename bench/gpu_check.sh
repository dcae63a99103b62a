#!/usr/bin/env bash
# The checks that need a CUDA GPU, in the order they pay: the `cuda` tests, then the GPU target against
# HF and with the CPU drafter (bench_core), then speculation control on the gpu-target-cpu-drafter profile.
# Run from the repository root on a CUDA host where hetspec is installed (README: Set up); results go
# to bench/figures/ (core-float16-cuda.json, control-gpu-target-cpu-drafter.json, written cell by cell).
#
#     bash bench/gpu_check.sh [SECONDS_FOR_BENCH_CONTROL]
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')" || exit 2
python -m pytest -q -p no:cacheprovider -m cuda -rs
python bench/bench_core.py --device cuda:0 --dtype float16 --drafters int4-lmh8 --adaptive ''
timeout "${1:-900}" python bench/bench_control.py --profile gpu-target-cpu-drafter --workloads chat,code \
    --concurrency 1,16 --repeats 2
