#!/usr/bin/env bash
# End-to-end GPT train-step benchmarks on the GPU machine, one bench_train_gpt.py run per
# configuration (each writes its JSON + markdown as soon as a size is measured):
#   gpt2 (throughput + 150-step quality run), gpt2-medium, gpt2-medium with 2:4 attention projections.
#   OUT=dir bash scripts/gpu_bench_gpt.sh [build]
#   WIDTHS="2048:8:16 4096:4:32" bash scripts/gpu_bench_gpt.sh build   # width sweep instead
#   EXTRA_ARGS="--grad-accum 4" ...   # extra bench_train_gpt.py flags for every run
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/logs"
PY=${PYTHON:-python3}
if [ "${1:-}" = build ]; then OUT=$OUT bash scripts/gpu_check.sh build; mkdir -p "$OUT/logs"; fi
run() {  # tag timeout args...
  local tag=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" $PY benchmarks/bench_train_gpt.py --out "$OUT" --tag "$tag" --rounds 3 --iters ${ITERS:-20} "$@" ${EXTRA_ARGS:-} > "$OUT/logs/$tag.log" 2>&1
  echo "== $tag rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/logs/summary.txt"
  tar -C "$OUT" -czf "$OUT/logs.tgz" logs
}
if [ -n "${WIDTHS:-}" ]; then  # width sweep only: "d:layers:heads ..." (gpt2-medium batch), e.g. "2048:8:16 4096:4:32"
  for w in $WIDTHS; do IFS=: read -r d l h <<< "$w"
    run h100_width$d ${WIDTH_TIMEOUT:-200} --size gpt2-medium --quality-steps 0 --n-embd $d --n-layer $l --n-head $h \
      --recipes ${WIDTH_RECIPES:-dense,srste,sste,ste}
  done
  rm -rf "$OUT/logs"; exit 0
fi
run h100_gpt2 ${GPT2_TIMEOUT:-240} --size gpt2 --quality-steps ${QUALITY_STEPS:-150}
run h100_gpt2-medium ${MEDIUM_TIMEOUT:-170} --size gpt2-medium --quality-steps 0
run h100_gpt2-medium_sparse-attn ${MEDIUM_TIMEOUT:-170} --size gpt2-medium --quality-steps 0 --sparse-attn --recipes dense,srste,sste,ste
rm -rf "$OUT/logs"
