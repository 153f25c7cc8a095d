#!/usr/bin/env bash
# One chunk of `gqa-spec reproduce --preset gpu` on a GPU machine (no TensorFlow, seqio or gin),
# with gpu_kit/ carried beside the tree (`benchmarks/gpu_study_kit.sh` builds it):
#
#   bash benchmarks/gpu_study.sh [STAGE ...]     # default: every stage, as far as the limit goes
#
# Installs the kit's wheels into /tmp/site, unpacks the exported tasks into /tmp/gpu_study/data
# (once per machine), runs the study with `--time-limit ${TIME_LIMIT:-540}` (exit 75: stopped
# cleanly, run the same command again; models and the XLA cache stay under /tmp/gpu_study/work,
# which persists between the commands of one machine), then packs /tmp/gpu_study/results, the
# work dir's job records and the run log into $OUT/results_gpu.tar.gz (`$OUT` holds at most 8
# files; unpack it into results/gpu/ here). Exits with the study's status.
set -u
kit=${KIT:-gpu_kit}
root=${STUDY_ROOT:-/tmp/gpu_study}
out=${OUT:-$root/out}
mkdir -p "$root" "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$kit"/wheels/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ ! -d "$root/data/ddtp_export" ]; then
  mkdir -p "$root/data" && tar -C "$root/data" -xJf "$kit/ddtp_export.tar.xz" || exit 1
fi
nvidia-smi -L || true
stages=()
[ $# -gt 0 ] && stages=(--stages "$@")
python3 -m gqa_spec reproduce --preset gpu --exported "$root/data/ddtp_export" \
    --out "$root/results" --work-dir "$root/work" --time-limit "${TIME_LIMIT:-540}" \
    "${stages[@]}" 2>&1 | tee -a "$root/run.log"
status=${PIPESTATUS[0]}
cp "$root/run.log" "$root/results/run.log" 2>/dev/null
tar -C "$root" -czf "$out/results_gpu.tar.gz" results work/jobs 2>/dev/null
echo "reproduce exit status $status; results in $out/results_gpu.tar.gz"
exit "$status"
