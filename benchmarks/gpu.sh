#!/usr/bin/env bash
# The throughput benchmarks on one GPU: writes results/benchmarks/*_gpu.{json,md} (or under $1).
# For a lent device with minutes of time, `benchmarks/device_check.sh bench` is the one prepared call
# (at most 6 minutes, bounded by its own clock); the parts below are longer.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [PART ...]
#
# PARTs (default: all, in this order): decode-mini decode-xl train-mini train-base costs-mini
# costs-large, then the decode-acceleration parts: loop-overhead loop-overhead-cmdbuf decode-large
# decode-xxl costs-large-2layer hf-large. `smoke` runs every decode-acceleration command at nano
# size (seconds on a CPU: `JAX_PLATFORMS=cpu bash benchmarks/gpu.sh /tmp/smoke smoke`). Decode
# parts use bfloat16 activations and parameters cast once (`--param-dtype bfloat16`). Each is bounded by `timeout` (PART_TIMEOUT seconds, default 540), so a part that
# overruns leaves the others' files. Measured on an H100 (2026-11-23): the mini parts take 1-3 min;
# each K/V grouping of a 24-layer model (large, XL) takes 2 min or more to initialise and compile
# (its layers are unrolled), so the XL part fits about three groupings in one 10-minute call.
# Needs jax with a CUDA backend and flax/optax (the benchmarks import no seqio or TensorFlow).
set -u
out=${1:-results/benchmarks}
shift || true
parts=${*:-decode-mini decode-xl train-mini train-base costs-mini costs-large loop-overhead \
  loop-overhead-cmdbuf decode-large decode-xxl costs-large-2layer hf-large}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
run() { echo "== $*"; timeout "${PART_TIMEOUT:-540}" "$py" "$@" || echo "!! exit $? : $*"; }
bf16="--dtype bfloat16 --param-dtype bfloat16"
# XLA:GPU command buffers (CUDA graphs) for the while loop and conditionals as well as the default
# kinds. The whole list, not `+WHILE,+CONDITIONAL`: XLA's parser applies only the first of several
# +/- entries (xla/debug_options_flags.cc, the `return true` inside its loop).
cmdbuf="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"

for part in $parts; do
  case $part in
    # The grid (G in 1, 2, 4, 8; 64 and 2048 input; batch 1 and 16) on mini.
    decode-mini) run -m benchmarks.decode_roofline --presets mini --kv mqa,gqa2,gqa4,mha \
        --batch 1,16 --input-length 64,2048 --out "$out/decode_roofline_gpu" ;;
    # T5.1.1-XL (32 heads): 6 GB of float32 decoder weights make the bandwidth bound the floor.
    decode-xl) run -m benchmarks.decode_roofline --presets xl --kv mqa,gqa8,mha --batch 1,16 \
        --input-length 2048 --steps 32 --repeats 3 $bf16 \
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
        $bf16 --batch 1,8 --gammas 1,3,5,7 --out "$out/speculative_costs_large_gpu" ;;
    # Per-iteration cost of the decode loop: while loop vs static-trip-count chunks (loop_chunk),
    # then the same with XLA:GPU command buffers for WHILE/CONDITIONAL (a separate process: XLA
    # reads its flags once).
    loop-overhead) run -m benchmarks.loop_overhead --preset nano $bf16 --chunks 1,8,32 \
        --out "$out/loop_overhead_gpu"
      run -m benchmarks.decode_roofline --presets nano,mini --kv mha --batch 1 --input-length 64 \
        --steps 128 $bf16 --loop-chunk 8 --out "$out/decode_roofline_chunk8_gpu" ;;
    loop-overhead-cmdbuf) XLA_FLAGS="${XLA_FLAGS:-} $cmdbuf" run -m benchmarks.loop_overhead \
        --preset nano $bf16 --chunks 1,8 --out "$out/loop_overhead_cmdbuf_gpu" ;;
    # Goal: batch-1 decode <= 1.3x the bandwidth bound for every K/V grouping, bf16 weights.
    decode-large) run -m benchmarks.decode_roofline --presets large --kv mqa,gqa2,gqa4,gqa8,mha \
        --batch 1 --input-length 2048 --steps 32 --repeats 3 $bf16 \
        --out "$out/decode_roofline_large_gpu" ;;
    decode-xxl) run -m benchmarks.decode_roofline --presets xxl --kv mqa,gqa8,mha --batch 1 \
        --input-length 2048 --steps 32 --repeats 3 $bf16 --out "$out/decode_roofline_xxl_gpu" ;;
    # Goal: a 2-layer draft's step <= 0.1 of the large target's (c in the JSON rows).
    costs-large-2layer) run -m benchmarks.speculative_costs --target-preset large \
        --draft-preset small --draft-layers 2 $bf16 --batch 1 --gammas 3,5 \
        --out "$out/speculative_costs_large_2layer_gpu" ;;
    # Goal: greedy batch-1 tokens/s >= 2x HF transformers' generate, T5.1.1-large, same weights.
    hf-large) run -m benchmarks.hf_decode --preset large $bf16 --max-decode-len 128 \
        --out "$out/hf_decode_large_gpu" ;;
    smoke) run -m benchmarks.loop_overhead --preset nano $bf16 --steps 4,8 --chunks 1,4 \
        --repeats 2 --out "$out/loop_overhead_smoke"
      run -m benchmarks.decode_roofline --presets nano --kv mqa,mha --batch 1 --input-length 16 \
        --steps 8 --repeats 2 $bf16 --loop-chunk 4 --out "$out/decode_roofline_smoke"
      run -m benchmarks.speculative_costs --target-preset nano --draft-preset nano \
        --draft-layers 1 $bf16 --batch 1 --gammas 2 --max-decode-len 8 --input-length 16 \
        --repeats 1 --out "$out/speculative_costs_smoke"
      run -m benchmarks.hf_decode --preset nano $bf16 --max-decode-len 8 --input-length 16 \
        --repeats 2 --out "$out/hf_decode_smoke" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
