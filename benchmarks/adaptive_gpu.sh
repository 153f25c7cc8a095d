#!/usr/bin/env bash
# Issue 37 on a GPU: `--gamma auto` and `--tree best:auto` against every fixed gamma / tree and
# greedy decoding (benchmarks/adaptive_gamma.py, adaptive_tree.py) on the cpu study's trained pair,
# on a machine without TensorFlow or seqio, each in one device call of at most ~6 minutes:
#
#   bash benchmarks/adaptive_gpu.sh kit              # HERE: builds gpu_kit/pair (git-ignored)
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh gamma   # on the GPU machine, carrying gpu_kit
#   OUT=$OUT bash benchmarks/adaptive_gpu.sh tree    # likewise
#
# kit: the pair's native checkpoints (PAIR_DIR, default the cpu study's fine-tuned
# runs/cpu/models/finetune/ddtp_translate_summarize/{mha_g8,draft}/best) and its two tasks exported
# at the benchmarks' lengths 64,32 (`gqa-spec data export`, from DDTP_DATA_DIR, default
# runs/cpu/data: the pair's own vocabulary), test inputs and training targets (the bigram's fit);
# the wheels of nltk and rouge-score (an exported task imports its metrics; the device image
# lacks them); about 39 MB with the tracked tree, under the 64 MiB a call carries.
# gamma / tree: the benchmark on both pairs (translate, then summarize), batches 1 and 8, T 0 and
# 1, the pair's draft model and a bigram, 5 rounds, under `timeout` (SECONDS_LIMIT, default 300:
# a cell is rewritten to the JSON/Markdown as it is measured, so a cut run keeps its cells and
# says it is partial), with XLA's GPU autotuning off (the cells' compiles are most of the time).
set -u
mode=${1:?usage: adaptive_gpu.sh kit|gamma|tree}
kit=${KIT:-gpu_kit}/pair
case $mode in
  kit)
    set -e
    pair=${PAIR_DIR:-runs/cpu/models/finetune/ddtp_translate_summarize}
    data=${DDTP_DATA_DIR:-runs/cpu/data}
    rm -rf "$kit" && mkdir -p "$kit/models"
    cp -r "$pair/mha_g8/best" "$kit/models/target"
    cp -r "$pair/draft/best" "$kit/models/draft"
    gqa-spec data export ddtp_translate_en_de ddtp_summarize --out "$kit/export" \
        --lengths 64,32 --splits train,test --data-dir "$data"
    rm -f "$kit"/export/*/train.text.jsonl  # raw training text: not read, 39 MB
    # What the device image lacks (an exported task imports its metrics): as gpu_study_kit.sh
    ${PYTHON:-python} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 -d "$kit/wheels" nltk==3.9.1
    ${PYTHON:-python} -m pip wheel -q --no-deps -w "$kit/wheels" rouge-score==0.1.2
    du -sh "$kit"
    ;;
  gamma|tree)
    out=${OUT:?OUT: where the results go}
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    if ls "$kit"/wheels/*.whl > /dev/null 2>&1; then
      ${PYTHON:-python3} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
          --upgrade --target /tmp/adaptive_gpu_site "$kit"/wheels/*.whl || exit 1
      export PYTHONPATH="$PYTHONPATH:/tmp/adaptive_gpu_site"
    fi
    export XLA_FLAGS="--xla_gpu_autotune_level=0 ${XLA_FLAGS:-}"
    { nvidia-smi -L 2>/dev/null || true; } > "$out/nvidia-smi_$mode.txt"
    if [ "$mode" = gamma ]; then extra=(--gammas 1,2,3,4,5,6,7,8 --gamma-max 8)
    else extra=(--nodes 2,4,8,16 --nodes-max 16 --depth 4); fi
    set -o pipefail
    timeout "${SECONDS_LIMIT:-300}" ${PYTHON:-python3} -m "benchmarks.adaptive_$mode" \
        --pair translate "$kit/models/target" "$kit/models/draft" \
            "exported:$kit/export/ddtp_translate_en_de" \
        --pair summarize "$kit/models/target" "$kit/models/draft" \
            "exported:$kit/export/ddtp_summarize" \
        --pair-drafts draft,bigram --batches 1,8 --temperatures 0,1 --repeats 5 "${extra[@]}" \
        --out "$out/adaptive_${mode}_gpu_pair" 2>&1 | tee "$out/adaptive_${mode}_gpu_pair.log"
    ;;
  *) echo "unknown mode $mode (kit, gamma or tree)" >&2; exit 2 ;;
esac
