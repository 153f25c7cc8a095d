#!/usr/bin/env bash
# The accelerator evidence in prepared device calls of at most 6 minutes each (issue 35):
#
#   bash benchmarks/device_check.sh bench        # on the GPU machine: everything under $OUT
#   bash benchmarks/device_check.sh study        # the gpu reproduction, with gpu_kit/ carried
#   OUT=/tmp/dc JAX_PLATFORMS=cpu bash benchmarks/device_check.sh bench --size nano   # CPU check
#
# `study` needs gpu_kit/ beside the tree (`bash benchmarks/gpu_study_kit.sh` builds it here: the
# exported DDTP tasks and the wheels the image lacks; carry it with the call).
# Needs only what the device image has (jax with CUDA, flax, optax, torch, transformers): the
# benchmarks import no seqio, TensorFlow or gin. `benchmarks/device_check.py` runs the parts under
# its own clock (--budget, default 330 s of wall time) and leaves summary.{json,md} and one archive
# of every part's JSON, Markdown and log in $OUT (a device call brings back 8 files at most).
set -u
mode=${1:?usage: [OUT=DIR] device_check.sh bench|study [--size nano] [--budget S] [--parts a,b]}
shift
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-results/gpu/device_check_$mode}
mkdir -p "$out"
{ nvidia-smi -L 2>/dev/null || true; } | tee "$out/nvidia-smi.txt"
${PYTHON:-python3} -m benchmarks.device_check "$mode" --out "$out" "$@" 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
