#!/usr/bin/env bash
# The throughput benchmarks on one GPU: writes results/benchmarks/*_gpu.{json,md} (or under $1).
#
#   bash benchmarks/gpu.sh [OUT_DIR] [PART ...]
#
# PARTs (default: all, in this order): decode-mini decode-xl train-mini train-base costs-mini
# costs-large. Each is bounded by `timeout` (PART_TIMEOUT seconds, default 540), so a part that
# overruns leaves the others' files. Measured on an H100 (2026-11-23): the mini parts take 1-3 min;
# each K/V grouping of a 24-layer model (large, XL) takes 2 min or more to initialise and compile
# (its layers are unrolled), so the XL part fits about three groupings in one 10-minute call.
# Needs jax with a CUDA backend and flax/optax (the benchmarks import no seqio or TensorFlow).
set -u
out=${1:-results/benchmarks}
shift || true
parts=${*:-decode-mini decode-xl train-mini train-base costs-mini costs-large}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
run() { echo "== $*"; timeout "${PART_TIMEOUT:-540}" "$py" "$@" || echo "!! exit $? : $*"; }

for part in $parts; do
  case $part in
    # The grid (G in 1, 2, 4, 8; 64 and 2048 input; batch 1 and 16) on mini.
    decode-mini) run -m benchmarks.decode_roofline --presets mini --kv mqa,gqa2,gqa4,mha \
        --batch 1,16 --input-length 64,2048 --out "$out/decode_roofline_gpu" ;;
    # T5.1.1-XL (32 heads): 6 GB of float32 decoder weights make the bandwidth bound the floor.
    decode-xl) run -m benchmarks.decode_roofline --presets xl --kv mqa,gqa8,mha --batch 1,16 \
        --input-length 2048 --steps 32 --repeats 3 --dtype bfloat16 \
        --out "$out/decode_roofline_xl_gpu" ;;
    # The cpu preset's train steps as they are.
    train-mini) run -m benchmarks.train_throughput --preset mini --settings pretrain,finetune \
        --steps 10 --out "$out/train_throughput_gpu" ;;
    # T5.1.1-base in bfloat16 at a GPU-sized batch.
    train-base) run -m benchmarks.train_throughput --preset base --settings pretrain,finetune \
        --batch 128 --steps 10 --dtype bfloat16 --out "$out/train_throughput_base_gpu" ;;
    # c and v(gamma): the cpu pair, then T5.1.1-large with a small draft in bfloat16.
    costs-mini) run -m benchmarks.speculative_costs --batch 1,8 --gammas 1,3,5,7 \
        --out "$out/speculative_costs_gpu" ;;
    costs-large) run -m benchmarks.speculative_costs --target-preset large --draft-preset small \
        --dtype bfloat16 --batch 1,8 --gammas 1,3,5,7 --out "$out/speculative_costs_large_gpu" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
