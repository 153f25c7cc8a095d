#!/usr/bin/env bash
# The accelerator evidence in prepared device calls of at most 6 minutes each:
#
#   bash benchmarks/device_check.sh bench        # on the GPU machine: everything under $OUT
#   bash benchmarks/device_check.sh study        # the gpu reproduction, with gpu_kit/ carried
#   bash benchmarks/device_check.sh kit          # HERE, before a study: builds gpu_kit/
#   OUT=/tmp/dc JAX_PLATFORMS=cpu bash benchmarks/device_check.sh bench --size nano   # CPU check
#
# bench and study need only what the device image has (jax with CUDA, flax, optax, torch,
# transformers; no seqio, TensorFlow or gin). `benchmarks/device_check.py` runs them under its own
# clock (--budget, default 330 s of wall time) and leaves summary.{json,md} and one archive of
# every part's files and log in $OUT (default runs/benchmarks/device_check_MODE).
#
# kit builds gpu_kit/ (git-ignored) where TensorFlow, seqio and sentencepiece are installed:
#   1. the DDTP corpus and its 8000-piece vocabulary (`gqa-spec data prepare`, from LISTS_DIR,
#      default /var/lib/apt/lists), unless DDTP_DATA_DIR already holds one;
#   2. `gqa-spec data export` of the gpu preset's tasks at its pre-training lengths 128,64, splits
#      train, validation and test, as one .tar.xz;
#   3. wheels of the pure-Python packages the GPU image lacks: rouge-score (built here) and nltk;
#   4. a size check: the kit plus the tracked files must stay under the 64 MiB a call carries.
set -u
mode=${1:?usage: [OUT=DIR] device_check.sh bench|study|kit [--size nano] [--budget S] [--parts a,b]}
shift
if [ "$mode" = kit ]; then
  set -eo pipefail
  kit=${KIT:-gpu_kit}
  data=${DDTP_DATA_DIR:-runs/gpu/data}
  py=${PYTHON:-python}
  rm -rf "$kit"
  mkdir -p "$kit/wheels"
  if [ ! -f "$data/sentencepiece.model" ]; then
    gqa-spec data prepare --data-dir "$data" --vocab-size "${VOCAB_PIECES:-8000}" \
        ${LISTS_DIR:+--lists-dir "$LISTS_DIR"}
  fi
  gqa-spec data export ddtp_mixture ddtp_translate_summarize --out "$kit/ddtp_export" \
      --lengths 128,64 --splits train,validation,test --data-dir "$data"
  tar -C "$kit" -cJf "$kit/ddtp_export.tar.xz" ddtp_export
  rm -rf "$kit/ddtp_export"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 -d "$kit/wheels" nltk==3.9.1
  "$py" -m pip wheel -q --no-deps -w "$kit/wheels" rouge-score==0.1.2
  kit_bytes=$(du -sb "$kit" | cut -f1)
  tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
  limit=$((64 * 1024 * 1024))
  echo "gpu_kit: $kit_bytes bytes; tracked files: $tree_bytes; limit $limit"
  ls -l "$kit" "$kit/wheels"
  if [ $((kit_bytes + tree_bytes)) -gt "$limit" ]; then
    echo "the kit and the tree exceed the 64 MiB a device call carries" >&2
    exit 1
  fi
  exit 0
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-${GQA_SPEC_BENCH_DIR:-runs/benchmarks}/device_check_$mode}
mkdir -p "$out"
{ nvidia-smi -L 2>/dev/null || true; } | tee "$out/nvidia-smi.txt"
${PYTHON:-python3} -m benchmarks.device_check "$mode" --out "$out" "$@" 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
