#!/usr/bin/env bash
# One device call of full-depth node runs through gpu_check.sh, each run into its own folder under $OUT
# (gpu_check.sh packs a folder's files itself; the folders are packed into $OUT/node.tgz at the end).
#   RUNS="name|ENV=VAL ENV2=VAL2|gpu_check steps ..." separated by ';' (default: none)
# e.g. RUNS="b32|NODE_SPECS=llama-7b:32:fsdp=4:32:full NODE_ARGS='--control shared'|node"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
export NCCL_NVLS_ENABLE=0
status=0
IFS=';' read -ra runs <<< "${RUNS:-}"
for run in "${runs[@]}"; do
  IFS='|' read -r name envs steps <<< "$run"
  echo "=== $name: $envs bash scripts/gpu_check.sh $steps"
  # envs may quote values with spaces: NODE_ARGS='--control shared'
  eval "$envs OUT=\"\$OUT/\$name\" bash scripts/gpu_check.sh $steps" 2>&1 | grep -E "^(== |ERROR)"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
dirs=$(cd "$OUT" && ls -d */ 2>/dev/null | tr -d /)
[ -n "$dirs" ] && tar -czf "$OUT/node.tgz" -C "$OUT" $dirs && rm -rf $(for d in $dirs; do echo "$OUT/$d"; done)
exit $status
