#!/usr/bin/env bash
# Time variants of the fused MVUE compressor side by side (scripts/ab_mvue_compress.cu), on the GPU:
#
#   bash scripts/ab_mvue_compress.sh xla_ffi /path/to/variant_xla_ffi ...   (default: xla_ffi)
#
# Each argument is a directory holding compress_kernels.cu and its headers (a copy of xla_ffi/ with
# a change). Three interleaved rounds; results to stdout and $OUT/ab_mvue_compress.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
INC=$(python3 -c "import jax; print(jax.ffi.include_dir())") || exit 1
dirs=("${@:-xla_ffi}")
for n in "${!dirs[@]}"; do
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -DNDEBUG -I"$INC" \
    -I"${dirs[$n]}" -o "/tmp/ab_mvue_$n" scripts/ab_mvue_compress.cu > "/tmp/ab_mvue_$n.log" 2>&1 &
done
wait
for n in "${!dirs[@]}"; do
  [ -x "/tmp/ab_mvue_$n" ] || { echo "build of ${dirs[$n]} failed:"; tail -20 "/tmp/ab_mvue_$n.log"; exit 1; }
done
for round in 1 2 3; do
  for n in "${!dirs[@]}"; do echo "== round $round variant ${dirs[$n]}"; "/tmp/ab_mvue_$n" || exit 1; done
done 2>&1 | tee "$OUT/ab_mvue_compress.txt"
