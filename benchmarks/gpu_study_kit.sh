#!/usr/bin/env bash
# Builds gpu_kit/ (git-ignored): what `benchmarks/device_check.sh study` needs on a GPU machine without
# TensorFlow, seqio or gin. Run HERE, in the repository root, where they are installed:
#
#   bash benchmarks/gpu_study_kit.sh        # then carry gpu_kit to the GPU (docs/reproduce.md)
#
#   1. the DDTP corpus and its 8000-piece vocabulary (`gqa-spec data prepare`, as the cpu study's
#      corpus stage builds it, from LISTS_DIR, default /var/lib/apt/lists: `gqa-spec data fetch`),
#      unless DDTP_DATA_DIR already holds one;
#   2. `gqa-spec data export` of the gpu preset's tasks (ddtp_mixture for pre-training, the
#      translate + summarize mixture for fine-tuning and evaluation) at its pre-training lengths
#      128,64 (span corruption is exported at exactly those; the tasks' shorter fine-tuning
#      lengths are trimmed from them), splits train, validation and test, as one .tar.xz;
#   3. wheels of the pure-Python packages the GPU image lacks: rouge-score (sdist only on PyPI:
#      built here into a py3-none-any wheel) and nltk (which it imports); the rest is there;
#   4. a size check: the kit plus the tracked files must stay under the 64 MiB a call carries.
set -euo pipefail
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
