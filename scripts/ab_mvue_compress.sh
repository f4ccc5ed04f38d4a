#!/usr/bin/env bash
# Time variants of the fused MVUE compressor side by side (scripts/ab_mvue_compress.cu), on the GPU:
# (AB_HARNESS=scripts/ab_fp8_mvue_compress.cu: the fp8 one, fp8_compress_kernels.cu, instead)
#
#   bash scripts/ab_mvue_compress.sh xla_ffi /path/to/variant_xla_ffi ...   (default: xla_ffi)
#   bash scripts/ab_mvue_compress.sh git:f88f697~1 xla_ffi    (an older commit's kernel against this one)
#
# Each argument is a directory holding compress_kernels.cu and its headers (a copy of xla_ffi/ with
# a change), or git:<rev> for xla_ffi/ as it was at <rev> (extracted to a temporary directory; the
# old kernel lives only there, never in the library). Three interleaved rounds; results to stdout
# and $OUT/<harness name>.txt. Variants that draw differently (another generator or formula, e.g.
# before and after issue 20's MVUE change) print different output hashes; variants that only change
# how the same draws are computed must print equal ones.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
INC=$(python3 -c "import jax; print(jax.ffi.include_dir())") || exit 1
dirs=("${@:-xla_ffi}")
HARNESS=${AB_HARNESS:-scripts/ab_mvue_compress.cu}
NAME=$(basename "$HARNESS" .cu)
for n in "${!dirs[@]}"; do
  if [[ "${dirs[$n]}" == git:* ]]; then
    rev=${dirs[$n]#git:}
    tmp=$(mktemp -d /tmp/ab_mvue_src.XXXXXX)
    git archive "$rev" xla_ffi | tar -x -C "$tmp" || { echo "cannot extract xla_ffi at $rev"; exit 1; }
    dirs[$n]="$tmp/xla_ffi"
    echo "variant $n: xla_ffi at $rev ($(git rev-parse --short "$rev")) -> ${dirs[$n]}"
  fi
done
# one binary per harness and variant, removed first: a failed build never leaves an older binary to time
pids=()
for n in "${!dirs[@]}"; do
  bin="/tmp/${NAME}_$n"; rm -f "$bin"
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -DNDEBUG -I"$INC" \
    -I"${dirs[$n]}" -o "$bin" "$HARNESS" > "$bin.log" 2>&1 &
  pids[$n]=$!
done
for n in "${!dirs[@]}"; do
  wait "${pids[$n]}" && [ -x "/tmp/${NAME}_$n" ] || { echo "build of ${dirs[$n]} failed:"; tail -20 "/tmp/${NAME}_$n.log"; exit 1; }
done
for round in 1 2 3; do
  for n in "${!dirs[@]}"; do echo "== round $round variant ${dirs[$n]}"; "/tmp/${NAME}_$n" || exit 1; done
done 2>&1 | tee "$OUT/$NAME.txt"
