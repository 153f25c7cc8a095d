#!/usr/bin/env bash
# The throughput benchmarks on one GPU: writes results/benchmarks/*_gpu.{json,md} (or under $1).
#
#   bash benchmarks/gpu.sh [OUT_DIR] [PART]      PART: decode | train | costs | all (default)
#
# Needs jax with a CUDA backend and flax/optax (the benchmarks import no seqio or TensorFlow).
# Each part is bounded by `timeout`, so a part that overruns leaves the others' files.
set -u
out=${1:-results/benchmarks}
part=${2:-all}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
run() { echo "== $*"; timeout "${PART_TIMEOUT:-420}" "$py" "$@" || echo "!! exit $? : $*"; }

if [[ $part == all || $part == decode ]]; then
  # The grid (G in 1, 2, 4, 8; 64 and 2048 input; batch 1 and 16) on mini, then T5.1.1-XL
  # (32 heads), whose decoder weights (6 GB in float32) make the bandwidth bound the real floor.
  run benchmarks/decode_roofline.py --presets mini --kv mqa,gqa2,gqa4,mha --batch 1,16 \
      --input-length 64,2048 --out "$out/decode_roofline_gpu"
  run benchmarks/decode_roofline.py --presets xl --kv mqa,gqa2,gqa4,gqa8,mha --batch 1,16 \
      --input-length 2048 --steps 32 --repeats 3 --dtype bfloat16 --out "$out/decode_roofline_xl_gpu"
fi
if [[ $part == all || $part == train ]]; then
  # The cpu preset's train steps as they are, then T5.1.1-base in bfloat16 at a GPU-sized batch.
  run benchmarks/train_throughput.py --preset mini --settings pretrain,finetune --steps 10 \
      --out "$out/train_throughput_gpu"
  run benchmarks/train_throughput.py --preset base --settings pretrain,finetune --batch 128 \
      --steps 10 --dtype bfloat16 --out "$out/train_throughput_base_gpu"
fi
if [[ $part == all || $part == costs ]]; then
  # c and v(gamma): the cpu pair, then T5.1.1-large with a small draft in bfloat16.
  run benchmarks/speculative_costs.py --batch 1,8 --gammas 1,3,5,7 --out "$out/speculative_costs_gpu"
  run benchmarks/speculative_costs.py --target-preset large --draft-preset small --dtype bfloat16 \
      --batch 1,8 --gammas 1,3,5,7 --out "$out/speculative_costs_large_gpu"
fi
