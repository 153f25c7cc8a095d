#!/usr/bin/env bash
# Issue 37 on a GPU: `--gamma auto` and `--tree best:auto` against every fixed gamma / tree and
# greedy decoding (benchmarks/adaptive_gamma.py, adaptive_tree.py) on the cpu study's trained pair,
# on a machine without TensorFlow or seqio, each in one device call of at most ~6 minutes:
#
#   bash benchmarks/adaptive_gpu.sh kit              # HERE: builds gpu_kit/pair (git-ignored)
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh gamma   # on the GPU machine, carrying gpu_kit
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh tree    # likewise
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh overhead  # no kit: the auto loop's own cost
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh guard   # carrying gpu_kit: the guard, whole runs
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh bigram  # carrying gpu_kit: gamma's bigram cells alone
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh plain   # no kit: the plain path's call against greedy
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh kernels # no kit: kernels per loop iteration (compiles)
#
# kit: the pair's native checkpoints (PAIR_DIR, default the cpu study's fine-tuned
# runs/cpu/models/finetune/ddtp_translate_summarize/{mha_g8,draft}/best; TARGET names the target's
# folder, default mha_g8; where PAIR_DIR holds one folder per task, as the smoke run's
# runs/smoke/models/finetune does, each task gets its own pair) and its two tasks exported
# at the benchmarks' lengths 64,32 (`gqa-spec data export`, from DDTP_DATA_DIR, default
# runs/cpu/data: the pair's own vocabulary), test inputs and training targets (the bigram's fit);
# the wheels of nltk and rouge-score (an exported task imports its metrics; the device image
# lacks them); about 39 MB with the tracked tree, under the 64 MiB a call carries.
# gamma / tree: the benchmark on both pairs (translate, then summarize), batches 1 and 8, T 0 and
# 1, the pair's draft model and a bigram, 5 rounds, under `timeout` (SECONDS_LIMIT, default 300:
# a cell is rewritten to the JSON/Markdown as it is measured, so a cut run keeps its cells and
# says it is partial), with XLA's GPU autotuning off (the cells' compiles are most of the time).
# overhead: benchmarks/adaptive_overhead.py (a random-init target, no kit): `--gamma auto`'s loop
# against `speculative.decode` and greedy decoding, per call and per iteration, at batches 1 and 8
# (the fixed policy with every width and with one, `AdaptiveGamma.one_width`), each run under
# SECONDS_LIMIT (default 220; a method costs ~50 s there, compiles; a cut run keeps the methods it
# measured); BATCHES (default "1 8") and METHODS (default greedy,speculative,fixed,onewidth)
# narrow it.
# The 2026-11-28 H200 run also put the loops in command buffers (CUDA graphs); that changed the
# adaptive loop's extra cost little (results/gpu/guard_2026-11-28), so it is not repeated.
# guard: benchmarks/guard.py on the translation pair's bigram (where the H200 ran `--gamma auto` at
# 0.59x greedy decoding), 24 inputs, batches 1 and 8, T = 0, 3 rounds, under SECONDS_LIMIT
# (default 300): greedy decoding, `--gamma auto --no-guard` and `--gamma auto` over whole runs.
# bigram: gamma's sweep on the translation pair's bigram alone, batches 1 and 8, T = 0, 5 rounds
# (the cells where `--gamma auto` ran at 0.59x and 0.71x on an H200 and the fixed gammas at up to
# 1.07x and 1.14x: the goal "within 5% of the best fixed gamma" read there; ~165 s), with
# `--one-width` (the optimal policy at one verification width as one more row, ~40 s more) and
# `--shuffle` (a new order of the methods every round: on the H200 a program ran slower right after
# another one than right after itself, and the rotation gave each method the same neighbour), under
# SECONDS_LIMIT (default 250).
# plain: benchmarks/plain_path.py --shuffle (a random-init target, no kit): `--gamma auto`'s call
# where it does not speculate, against greedy decoding and the parts it could be made of, batches 1
# and 8, 300 rounds (~100 s on an H200), under SECONDS_LIMIT (default 150).
# kernels: benchmarks/loop_kernels.py (no kit, nothing timed): the kernels each loop's iteration
# launches in XLA:GPU's compiled programs (overhead's methods and the held policy), batches 1 and 8,
# under SECONDS_LIMIT (default 150).
# A device call brings back at most 8 files from $OUT: each mode writes its files (JSON, Markdown,
# logs, nvidia-smi) into $OUT/<mode>/ and packs them into one $OUT/<mode>.tgz at the end, also
# when its benchmark was cut (`tar xzf <mode>.tgz` here). The 2026-11-28 call that ran guard and
# overhead unpacked lost guard's files to that limit.
set -u
mode=${1:?usage: adaptive_gpu.sh kit|gamma|tree|overhead|guard|bigram|plain|kernels}
kit=${KIT:-gpu_kit}/pair
case $mode in
  kit)
    set -e
    pair=${PAIR_DIR:-runs/cpu/models/finetune/ddtp_translate_summarize}
    data=${DDTP_DATA_DIR:-runs/cpu/data}
    target=${TARGET:-mha_g8}
    rm -rf "$kit" && mkdir -p "$kit/models"
    for task in ddtp_translate_en_de ddtp_summarize; do
      [ -d "$pair/$task" ] || continue  # one pair per task
      mkdir -p "$kit/models/$task"
      cp -r "$pair/$task/$target/best" "$kit/models/$task/target"
      cp -r "$pair/$task/draft/best" "$kit/models/$task/draft"
    done
    if [ ! -d "$kit/models/ddtp_translate_en_de" ]; then  # one pair for both tasks
      cp -r "$pair/$target/best" "$kit/models/target"
      cp -r "$pair/draft/best" "$kit/models/draft"
    fi
    gqa-spec data export ddtp_translate_en_de ddtp_summarize --out "$kit/export" \
        --lengths 64,32 --splits train,test --data-dir "$data"
    rm -f "$kit"/export/*/train.text.jsonl  # raw training text: not read, 39 MB
    # What the device image lacks (an exported task imports its metrics): as gpu_study_kit.sh
    ${PYTHON:-python} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 -d "$kit/wheels" nltk==3.9.1
    ${PYTHON:-python} -m pip wheel -q --no-deps -w "$kit/wheels" rouge-score==0.1.2
    du -sh "$kit"
    ;;
  gamma|tree|guard|bigram)
    out=${OUT:?OUT: where the results go}/$mode
    mkdir -p "$out"; trap 'tar czf "$out.tgz" -C "$out" . && rm -rf "$out"' EXIT
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    if ls "$kit"/wheels/*.whl > /dev/null 2>&1; then
      ${PYTHON:-python3} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
          --upgrade --target /tmp/adaptive_gpu_site "$kit"/wheels/*.whl || exit 1
      export PYTHONPATH="$PYTHONPATH:/tmp/adaptive_gpu_site"
    fi
    export XLA_FLAGS="--xla_gpu_autotune_level=0 ${XLA_FLAGS:-}"
    { nvidia-smi -L 2>/dev/null || true; } > "$out/nvidia-smi_$mode.txt"
    m=$kit/models; t=$m/ddtp_translate_en_de; s=$m/ddtp_summarize
    [ -d "$t" ] || { t=$m; s=$m; }
    set -o pipefail
    if [ "$mode" = guard ]; then
      timeout "${SECONDS_LIMIT:-300}" ${PYTHON:-python3} -m benchmarks.guard \
          --pair translate "$t/target" "$t/draft" "exported:$kit/export/ddtp_translate_en_de" \
          --pair-drafts bigram --examples 24 --batches 1,8 --temperatures 0 --repeats 3 \
          --out "$out/guard_gpu_bigram" 2>&1 | tee "$out/guard_gpu_bigram.log"
      exit
    fi
    if [ "$mode" = bigram ]; then
      timeout "${SECONDS_LIMIT:-250}" ${PYTHON:-python3} -m benchmarks.adaptive_gamma \
          --pair translate "$t/target" "$t/draft" "exported:$kit/export/ddtp_translate_en_de" \
          --pair-drafts bigram --batches 1,8 --temperatures 0 --repeats 5 --one-width \
          --gammas 1,2,3,4,5,6,7,8 --gamma-max 8 --shuffle --out "$out/adaptive_gamma_gpu_bigram" 2>&1 \
          | tee "$out/adaptive_gamma_gpu_bigram.log"
      exit
    fi
    if [ "$mode" = gamma ]; then extra=(--gammas 1,2,3,4,5,6,7,8 --gamma-max 8)
    else extra=(--nodes 2,4,8,16 --nodes-max 16 --depth 4); fi
    timeout "${SECONDS_LIMIT:-300}" ${PYTHON:-python3} -m "benchmarks.adaptive_$mode" \
        --pair translate "$t/target" "$t/draft" "exported:$kit/export/ddtp_translate_en_de" \
        --pair summarize "$s/target" "$s/draft" \
            "exported:$kit/export/ddtp_summarize" \
        --pair-drafts draft,bigram --batches 1,8 --temperatures 0,1 --repeats 5 "${extra[@]}" \
        --out "$out/adaptive_${mode}_gpu_pair" 2>&1 | tee "$out/adaptive_${mode}_gpu_pair.log"
    ;;
  plain)
    out=${OUT:?OUT: where the results go}/$mode
    mkdir -p "$out"; trap 'tar czf "$out.tgz" -C "$out" . && rm -rf "$out"' EXIT
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export XLA_FLAGS="--xla_gpu_autotune_level=0 ${XLA_FLAGS:-}"
    timeout "${SECONDS_LIMIT:-150}" ${PYTHON:-python3} -m benchmarks.plain_path --shuffle \
        --batches 1,8 --rounds 300 --out "$out/plain_path_gpu_shuffled" \
        > "$out/plain_path_gpu_shuffled.log" 2>&1
    ;;
  kernels)
    out=${OUT:?OUT: where the results go}/$mode
    mkdir -p "$out"; trap 'tar czf "$out.tgz" -C "$out" . && rm -rf "$out"' EXIT
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export XLA_FLAGS="--xla_gpu_autotune_level=0 ${XLA_FLAGS:-}"
    for batch in 1 8; do
      timeout "${SECONDS_LIMIT:-150}" ${PYTHON:-python3} -m benchmarks.loop_kernels \
          --batch "$batch" --methods greedy,speculative,fixed,onewidth,held --out "$out/loop_kernels_gpu_b$batch" \
          > "$out/loop_kernels_gpu_b$batch.log" 2>&1
    done
    ;;
  overhead)
    out=${OUT:?OUT: where the results go}/$mode
    mkdir -p "$out"; trap 'tar czf "$out.tgz" -C "$out" . && rm -rf "$out"' EXIT
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export XLA_FLAGS="--xla_gpu_autotune_level=0 ${XLA_FLAGS:-}"
    for batch in ${BATCHES:-1 8}; do
      timeout "${SECONDS_LIMIT:-220}" ${PYTHON:-python3} -m benchmarks.adaptive_overhead \
          --batch "$batch" --methods "${METHODS:-greedy,speculative,fixed,onewidth}" \
          --out "$out/adaptive_overhead_gpu_b$batch" > "$out/adaptive_overhead_gpu_b$batch.log" 2>&1
    done
    ;;
  *) echo "unknown mode $mode (kit, gamma, tree, overhead, guard, bigram, plain or kernels)" >&2
     exit 2 ;;
esac
