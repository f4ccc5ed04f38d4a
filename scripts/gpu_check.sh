#!/usr/bin/env bash
# Build the CUDA extension offline, run the GPU tests, compute-sanitizer and the benchmarks on a
# Hopper machine; logs and JSON go to $OUT (default ./gpu_out).
#
#   bash scripts/gpu_check.sh [all|build|test|bench|profile|sanitize|multigpu|llama ...]   (default: all)
#   profile: Nsight Compute on the compressors, and a GPT step's kernel time by kind of kernel
#            (benchmarks/bench_step_breakdown.py; PROFILE_SIZE, PROFILE_RECIPES)
#   multigpu: the GPT example under data- and tensor-parallel meshes over every visible GPU (16-bit
#            GEMMs per backend, MULTIGPU_BACKENDS; then fp8 with current and delayed scaling, MULTIGPU_FP8=0 skips)
#   llama: the three GEMMs of the LLaMA-1B / -7B layer shapes at 16384 tokens (bench_layer.py
#          --shapes: the rows of the `auto` table for those models) and the LLaMA train-step
#          benchmark (bench_train_gpt.py --size llama-7b,llama-1b); LLAMA_SECTIONS="gemm table train"
#          (default "gemm train"; table: rebuild the auto table with this run's layer results first);
#          LLAMA_SIZES ("size:layers ..."), LLAMA_RECIPES, LLAMA_TRAIN_ARGS (e.g. "--batch-size 4" for
#          8192 tokens per step) and LLAMA_TAG_SUFFIX (appended to the results' tag)
#   fp8probe: scripts/probe_fp8.py (fp8 compress + GEMM correctness through the FFI targets, and
#            GEMM timings against bf16 / XLA fp8 dense); PROBE_FP8_ARGS (e.g. --quick, or
#            "--step llama-7b --speed-only": every fp8 configuration on the step's three GEMMs per layer)
#   fp8: the fp8 GPU tests (tests/test_gpu_fp8.py) and benchmarks/bench_fp8_gemm.py
#   launch: benchmarks/bench_launch.py (custom-call launch cost under XLA command-buffer settings)
#   breakdown: benchmarks/bench_step_breakdown.py (per-step time by kind of kernel and the gap to the
#            1.6x GEMM ceiling) for BREAKDOWN_SPECS="size[:n_layer] ..." (default "llama-300m llama-7b:4"),
#            BREAKDOWN_RECIPES (default dense,srste), BREAKDOWN_ARGS (more flags, e.g. "--baseline
#            dense+fp8-flax"); results tagged <gpu>_<size>[_l<n_layer>]<BREAKDOWN_TAG_SUFFIX> (gpu: h100, h200)
#   quality: benchmarks/bench_quality.py on the real corpus carried in runs/data/ (QUALITY_DATA: the text, or
#            a token directory of prepare_data.py; QUALITY_PARALLEL=1: one recipe per GPU; QUALITY_SIZE,
#            QUALITY_TOKENS, QUALITY_RECIPES, QUALITY_SEED, QUALITY_FLAGS (bench_quality's --flags),
#            QUALITY_RUNS = the --runs directory, returned as
#            $OUT/quality_runs.tgz: merge the runs of several calls here with --report-only)
#   gpt: bench_train_gpt.py on GPT_SPECS="size:layers[:sparse-attn] ..." (default "gpt2:12 gpt2:12:sparse-attn"),
#        GPT_RECIPES (default dense,srste,srste/prepared,sste,ste,step), GPT_TAG_SUFFIX, GPT_ROUNDS (7),
#        GPT_ITERS (10), GPT_WORKERS (concurrent compilations, 8), GPT_TIMEOUT (240 s per spec), GPT_ARGS (more
#        bench_train_gpt.py flags, e.g. "--park host")
#   exloop: the example's own training loop, one process per run (EXLOOP_RUNS, EXLOOP_SIZE, EXLOOP_FLAGS, ...)
#   loader: benchmarks/bench_loader.py (the example's loader vs a fixed batch in one train step; LOADER_DATA, LOADER_SIZE)
#   example: the README's GPU command (examples/train.py --compare dense,srste; EXAMPLE_DATA, EXAMPLE_ARGS, EXAMPLE_STEPS, EXAMPLE_TAG)
#   rematcheck: scripts/probe_remat_hlo.py (under --remat dots no 2:4 GEMM runs twice; REMATCHECK_ARGS)
#   maskcheck: benchmarks/bench_mask_check.py (the device-side mask check's cost in a step)
#   node: full-depth LLaMA over every visible GPU (bench_train_gpt.py --mesh; NODE_SPECS="size:layers:mesh:batch ...",
#         NODE_RECIPES, NODE_ROUNDS, NODE_ITERS, NODE_ARGS, NODE_TAG_SUFFIX; NODE_PARK=none keeps every variant's state on
#         the GPUs (LLaMA-7B with host parking on 4 x H200 compiled but did not finish timing within 6 minutes;
#         moving three 107 GB states through host memory every round is the suspect)
#   scaling: weak scaling, the same model and tokens per GPU on 1, 2, 4 GPUs (SCALING_SPEC="size:layers:batch_per_gpu[:remat]",
#         SCALING_GPUS, SCALING_RECIPES; FSDP over the GPUs of each count; benchmarks/weak_scaling.py makes one table)
#   distckpt: one process per GPU (examples/launch.py, train_gpt.py --distributed, FSDP over every GPU), sharded
#         checkpoints, resumed on half the processes; losses compared (DISTCKPT_SIZE, _LAYERS, _STEPS, _BATCH, _ARGS)
#   test: the GPU tests (-m gpu); TEST_PATHS, TEST_K (pytest -k), TEST_TIMEOUT (480 s), TEST_SHARD=I/N (the I-th of N
#         parts: on a multi-GPU host the whole suite takes longer than one device call; scripts/gpu_test_report.py
#         adds the parts up)
#   keepext: copy the built extension to $OUT/ext/ (carry it back as jax_sparse24/_sparse24_ffi*.so
#            and leave out `build` to skip the compile on the next machine: same sources only)
#
# At the end the logs become $OUT/logs.tgz, and more than 7 other files in $OUT are packed into
# $OUT/results.tgz (a device call returns at most 8 files). The limit counts every file under the
# device's output folder: when one device command runs this script several times with OUT set to
# subfolders of it, the subfolders' files add up (a session lost a step breakdown's three files so);
# pack them yourself at the end (e.g. `tar -czf $OUT/all.tgz -C $OUT a b c && rm -rf $OUT/{a,b,c}`). Runs into
# one OUT share its logs (a later run unpacks the earlier logs.tgz and adds to it; a log of the same name is
# replaced).
#
# Offline: needs the nvidia-cutlass wheel in .whl/ (or the headers importable) and jax with CUDA. Every
# step after `build` needs the CUDA kernels (built in the call, or a carried extension): without them
# the script stops with an error (GPU_CHECK_NO_KERNELS=1 runs anyway).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
# A second run into the same OUT (one device call running this script twice) adds to the first run's logs
# instead of replacing its logs.tgz
[ -f "$OUT/logs.tgz" ] && [ ! -d "$OUT/logs" ] && tar -C "$OUT" -xzf "$OUT/logs.tgz"
mkdir -p "$OUT" "$OUT/logs"
export PYTHONUNBUFFERED=1
STEPS=${*:-all}
PY=${PYTHON:-python3}
want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
asked() { [[ " $STEPS " == *" $1 "* ]]; }  # steps that "all" leaves out
status=0
note() { echo "== $*" | tee -a "$OUT/logs/summary.txt"; tar -C "$OUT" -czf "$OUT/logs.tgz" logs; }
BENCHES=${BENCHES:-"bench_spmm bench_mask_kernels"}
BENCH_ARGS=${BENCH_ARGS:-}

# The GPU's short name for result tags (h100, h200): results say which card gave them.
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h[0-9]{3}|a[0-9]{3}|b[0-9]{3}' | head -1 | tr 'A-Z' 'a-z')
GPU_TAG=${GPU_TAG:-gpu}

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv; nvcc --version | tail -1;
  $PY -c "import jax, jaxlib, flax, optax, nanobind, scikit_build_core as s; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__, 'nanobind', nanobind.__version__, 'skbuild', s.__version__)"; } 2>&1 | tee "$OUT/logs/env.txt"

if want build; then
  t0=$(date +%s)
  JAX_SPARSE24_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $PY -m pip install --no-build-isolation --no-deps -v -e . > "$OUT/logs/build.log" 2>&1
  rc=$?; note "build rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -60 "$OUT/logs/build.log"; status=1; }
  $PY -c "import jax_sparse24._src.ffi as f; print('extension:', f.extension() is not None, f.extension_error() or '', 'kernels available:', f.cuda_kernels_available())" 2>&1 | tee -a "$OUT/logs/summary.txt"
fi

# Every other step measures or tests the CUDA kernels: without them (no `build` in this call and no
# carried extension) the 2:4 layers would silently take the jnp reference path and the results would
# read like the kernels' (a session lost a LLaMA benchmark so). GPU_CHECK_NO_KERNELS=1 runs anyway.
why=$($PY -c "import sys, jax, jax_sparse24._src.ffi as f
if not f.cuda_kernels_available():
    print(f.extension_error() or f'no CUDA device ({jax.default_backend()})')
    sys.exit(1)" 2>&1 | tail -1; exit "${PIPESTATUS[0]}")
if [ $? -ne 0 ]; then
  if [ "${GPU_CHECK_NO_KERNELS:-0}" = 1 ]; then
    note "WARNING: the CUDA kernels are not available ($why); running anyway (GPU_CHECK_NO_KERNELS=1)"
  else
    note "ERROR: the CUDA kernels are not available ($why): add 'build', or carry a built extension as"\
" jax_sparse24/_sparse24_ffi*.so (see keepext); GPU_CHECK_NO_KERNELS=1 runs without them"
    exit 1
  fi
fi

if asked keepext; then
  so=$($PY -c "import jax_sparse24._sparse24_ffi as m; print(m.__file__)" 2>/dev/null)
  mkdir -p "$OUT/ext" && [ -n "$so" ] && cp "$so" "$OUT/ext/" && note "extension kept: $(basename "$so")" || note "keepext: no extension"
fi

if want test; then
  t0=$(date +%s)
  # TEST_PATHS (default tests) and TEST_K (a pytest -k expression) pick a part of the suite; TEST_SHARD=I/N runs
  # the I-th of N round-robin parts (tests/conftest.py --shard): the whole suite in N device calls, added up by
  # `python scripts/gpu_test_report.py <the calls' gpu_tests_shard*.xml>`
  log="gpu_tests${TEST_SHARD:+_shard${TEST_SHARD%/*}of${TEST_SHARD#*/}}"
  timeout ${TEST_TIMEOUT:-480} $PY -m pytest -m gpu -q -rs --junitxml="$OUT/logs/$log.xml" ${TEST_PATHS:-tests} \
    ${TEST_K:+-k "$TEST_K"} ${TEST_SHARD:+--shard "$TEST_SHARD"} > "$OUT/logs/$log.log" 2>&1
  rc=$?; note "gpu tests${TEST_SHARD:+ (part $TEST_SHARD)} rc=$rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/logs/$log.log")"; [ $rc -eq 0 ] || status=1
  grep -E "^(FAILED|ERROR)" "$OUT/logs/$log.log" | head -30
fi

if want bench; then
  for b in $BENCHES; do
    if [ -f benchmarks/$b.py ]; then
      t0=$(date +%s)
      timeout ${BENCH_TIMEOUT:-300} $PY benchmarks/$b.py --out "$OUT" $BENCH_ARGS > "$OUT/logs/$b.log" 2>&1
      rc=$?; note "$b rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -30 "$OUT/logs/$b.log"; status=1; }
    fi
  done
fi

if want profile; then
  # Nsight Compute on the fused compressors (d = 1280 FFN shapes): occupancy, throughput, stalls.
  if [ "${NCU:-1}" != 0 ]; then
    t0=$(date +%s)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${PROFILE_TIMEOUT:-180} ncu --kernel-name regex:CompressTile --set full \
      $PY scripts/profile_compress.py > "$OUT/logs/ncu_compress.txt" 2>&1
    rc=$?; note "ncu compress rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || status=1
  fi
  # GPU kernel time of a GPT train step by kernel and kind, dense vs 2:4 recipes (jax.profiler trace);
  # PROFILE_RECIPES takes RECIPE[@ATTENTION] names (benchmarks/bench_step_breakdown.py --help).
  t0=$(date +%s)
  timeout ${PROFILE_TIMEOUT:-180} $PY benchmarks/bench_step_breakdown.py --size ${PROFILE_SIZE:-gpt2} \
    --recipes ${PROFILE_RECIPES:-dense,srste} --out "$OUT" --tag "profile_${PROFILE_SIZE:-gpt2}" \
    > "$OUT/logs/profile_breakdown.log" 2>&1
  rc=$?; note "bench_step_breakdown (profile) rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'kernel time .* per step' "$OUT/logs/profile_breakdown.log" | tr '\n' ' ')"; [ $rc -eq 0 ] || status=1
fi

if asked breakdown; then
  for spec in ${BREAKDOWN_SPECS:-llama-300m llama-7b:4}; do
    size=${spec%%:*}; layers=; [[ $spec == *:* ]] && layers=${spec#*:}
    tag="${GPU_TAG}_${size}${layers:+_l$layers}${BREAKDOWN_TAG_SUFFIX:-}"; t0=$(date +%s)
    timeout ${BREAKDOWN_TIMEOUT:-300} $PY benchmarks/bench_step_breakdown.py --size "$size" ${layers:+--n-layer $layers} \
      --recipes ${BREAKDOWN_RECIPES:-dense,srste} ${BREAKDOWN_ARGS:-} --out "$OUT" --tag "$tag" \
      > "$OUT/logs/breakdown_$tag.log" 2>&1
    rc=$?; note "bench_step_breakdown $tag rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E ': kernel time .*, ceiling ' "$OUT/logs/breakdown_$tag.log" | tr '\n' ' ')"
    [ $rc -eq 0 ] || { tail -20 "$OUT/logs/breakdown_$tag.log"; status=1; }
  done
fi

if want sanitize; then
  t0=$(date +%s)
  # memcheck on a small end-to-end run of every kernel (XLA's own allocator is left alone).
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${SANITIZE_TIMEOUT:-180} compute-sanitizer --tool memcheck --print-limit 20 --error-exitcode 7 \
    $PY scripts/sanitize_smoke.py > "$OUT/logs/memcheck.log" 2>&1
  rc=$?; note "memcheck rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'ERROR SUMMARY' "$OUT/logs/memcheck.log" | tail -1)"; [ $rc -eq 0 ] || status=1
  # racecheck (shared-memory hazards): one process per kernel family (a sanitizer failure names
  # it), instrumenting our kernels (namespace jax_sparse24) and CUTLASS's sparse GEMM, not XLA's.
  # Our kernels are checked in the cases without a vendor GEMM: with the filter on our namespace,
  # an *uninstrumented* TMA GEMM (CUTLASS's or cuSPARSELt's) in the same process ends in "Internal
  # Sanitizer Error: failed to handle a hardware exception" (H100, CUDA 13.0), while the same CUTLASS
  # kernel instrumented (kns=cutlass) is clean. cuSPARSELt's kernels are not racechecked (memcheck is).
  for kns in ${RACECHECK_KERNELS:-jax_sparse24 cutlass}; do
    for case in ${RACECHECK_CASES:-$($PY scripts/sanitize_smoke.py --list)}; do
      case "$kns:$case" in  # which family each case instruments (cusparselt_linear: none, see above)
        cutlass:cutlass_linear|cutlass:cutlass_configs|jax_sparse24:masks|jax_sparse24:mvue|jax_sparse24:compress) ;;
        *) continue ;;
      esac
      t0=$(date +%s); log="$OUT/logs/racecheck_${kns}_$case.log"
      XLA_FLAGS="--xla_gpu_autotune_level=0" XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${SANITIZE_TIMEOUT:-180} \
        compute-sanitizer --tool racecheck --racecheck-report hazard --kernel-name kns=$kns --print-limit 20 \
        --error-exitcode 7 $PY scripts/sanitize_smoke.py $case > "$log" 2>&1
      rc=$?; note "racecheck[$kns: $case] rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|Internal Sanitizer Error' "$log" | tail -1)"; [ $rc -eq 0 ] || status=1
    done
  done
fi

if asked llama; then
  LS=${LLAMA_SECTIONS:-gemm train}
  if [[ " $LS " == *" gemm "* ]]; then
    IFS=';' read -ra specs <<< "${LLAMA_GEMM_SPECS:-llama7b_t16384:compress gemm:4096:22016 11008:4096 4096:12288 4096:4096;llama1b_t16384:gemm:2048:11264 5632:2048 2048:6144 2048:2048}"
    for spec in "${specs[@]}"; do
      name=${spec%%:*}; rest=${spec#*:}; sections=${rest%%:*}; shapes=${rest#*:}
      t0=$(date +%s)
      timeout ${LLAMA_GEMM_TIMEOUT:-240} $PY benchmarks/bench_layer.py --out "$OUT" --name "layer_$name" \
        --sections $sections --tokens 16384 --trials ${LLAMA_TRIALS:-5} --shapes $shapes > "$OUT/logs/layer_$name.log" 2>&1
      rc=$?; note "bench_layer $name rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -20 "$OUT/logs/layer_$name.log"; status=1; }
    done
  fi
  if [[ " $LS " == *" table "* ]]; then  # the auto table from its current inputs plus this run's layer files
    new=$(cd "$OUT" && ls layer_llama*.json 2>/dev/null); cp "$OUT"/layer_llama*.json benchmarks/results/ 2>/dev/null
    args=$($PY - $new <<'PYEOF'
import json, sys
t = json.load(open("jax_sparse24/_src/spmm_autotune.json"))  # its inputs are recorded in it
kn = t.get("source_kn", []) + [f"benchmarks/results/{n}" for n in sys.argv[1:]]
print(" ".join(t["source"]), "--layer", " ".join(dict.fromkeys(kn)),
      "--cusparselt-version", t.get("cusparselt_version", "0.8.1"))
PYEOF
)
    $PY benchmarks/make_autotune_table.py $args > "$OUT/logs/table.log" 2>&1
    rc=$?; note "make_autotune_table rc=$rc"; cp jax_sparse24/_src/spmm_autotune.json "$OUT/"
  fi
  if [[ " $LS " == *" train "* ]]; then
    for spec in ${LLAMA_SIZES:-llama-7b:4 llama-1b:4}; do
      size=${spec%%:*}; layers=${spec#*:}; t0=$(date +%s)
      timeout ${LLAMA_TRAIN_TIMEOUT:-300} $PY benchmarks/bench_train_gpt.py --out "$OUT" \
        --tag "${GPU_TAG}_${size}_l$layers${LLAMA_TAG_SUFFIX:-}" \
        --size $size --n-layer $layers --quality-steps 0 --rounds ${LLAMA_ROUNDS:-5} --iters ${LLAMA_ITERS:-10} \
        --compile-workers 4 --recipes ${LLAMA_RECIPES:-dense,srste,srste@cusparselt,srste@cutlass} ${LLAMA_TRAIN_ARGS:-} \
        > "$OUT/logs/train_$size.log" 2>&1
      rc=$?; note "bench_train_gpt $size x$layers rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -20 "$OUT/logs/train_$size.log"; status=1; }
    done
  fi
fi

if asked gpt; then
  # The GPT example's train step against dense (bench_train_gpt.py) for GPT_SPECS="size:layers[:sparse-attn] ..."
  # (default "gpt2:12 gpt2:12:sparse-attn"), GPT_RECIPES, GPT_ROUNDS x GPT_ITERS; tags
  # <gpu>_<size>_l<layers>[_sparse-attn]<GPT_TAG_SUFFIX>
  for spec in ${GPT_SPECS:-gpt2:12 gpt2:12:sparse-attn}; do
    IFS=: read -r size layers attn <<< "$spec"; t0=$(date +%s)
    tag="${GPU_TAG}_${size}_l$layers${attn:+_$attn}${GPT_TAG_SUFFIX:-}"
    timeout ${GPT_TIMEOUT:-240} $PY benchmarks/bench_train_gpt.py --out "$OUT" --tag "$tag" --size $size --n-layer $layers \
      --quality-steps 0 --rounds ${GPT_ROUNDS:-7} --iters ${GPT_ITERS:-10} --compile-workers ${GPT_WORKERS:-8} ${attn:+--$attn} \
      --recipes ${GPT_RECIPES:-dense,srste,srste/prepared,sste,ste,step} ${GPT_ARGS:-} > "$OUT/logs/train_$tag.log" 2>&1
    rc=$?; note "bench_train_gpt $tag rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'tokens/s' "$OUT/logs/train_$tag.log" | tr -s ' ' | tr '\n' ';')"
    [ $rc -eq 0 ] || { tail -20 "$OUT/logs/train_$tag.log"; status=1; }
  done
fi

if asked exloop; then
  # The harness's own loop (benchmarks/harness/train_gpt.py: tokens/s over the run, compilation and evaluation excluded),
  # one process per run: EXLOOP_REPEATS (default 2) rounds of EXLOOP_RUNS="recipe:prepare-weights ..." (default
  # "dense:on srste:always srste:off"; each once, dense:on for the ratios; the order rotates per round) on
  # EXLOOP_SIZE (gpt2) for EXLOOP_STEPS (400) steps with EXLOOP_FLAGS (EXLOOP_TIMEOUT per run);
  # table: $OUT/example_loop_<gpu>_<size><EXLOOP_TAG_SUFFIX>.md
  size=${EXLOOP_SIZE:-gpt2}; tag="${GPU_TAG}_${size}${EXLOOP_TAG_SUFFIX:-}"; t0=$(date +%s)
  rm -rf /tmp/exloop  # a warm machine keeps the runs of an earlier call: this table is this call's only
  read -r -a order <<< "${EXLOOP_RUNS:-dense:on srste:always srste:off}"
  for rep in $(seq 1 ${EXLOOP_REPEATS:-2}); do
    n=${#order[@]}; k=$(( (rep - 1) % n ))  # each repeat starts one run later (the order rotates)
    for run in "${order[@]:$k}" "${order[@]:0:$k}"; do
      recipe=${run%%:*}; how=${run#*:}; mkdir -p "/tmp/exloop/$rep"
      # the card's SM clock and power during the run (a power-capped card's clock depends on the run's
      # moment and its kernels; the table shows both beside tokens/s)
      nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 \
        > "/tmp/exloop/$rep/$recipe-$how.smi" 2>/dev/null & smi=$!
      timeout ${EXLOOP_TIMEOUT:-150} $PY benchmarks/harness/train_gpt.py --recipe $recipe --size $size --steps ${EXLOOP_STEPS:-400} \
        --prepare-weights $how --eval-every 100000 --ckpt-every 0 --finetune-fraction 0 --quiet --overwrite \
        --out "/tmp/exloop/$rep/$recipe-$how" ${EXLOOP_FLAGS:-} > "$OUT/logs/exloop_${rep}_$recipe-$how.log" 2>&1 \
        || { note "exloop $rep $run failed"; tail -5 "$OUT/logs/exloop_${rep}_$recipe-$how.log"; status=1; }
      kill $smi 2>/dev/null; wait $smi 2>/dev/null
    done
  done
  $PY - "$OUT/example_loop_$tag.md" "$size" "${EXLOOP_STEPS:-400}" "${EXLOOP_FLAGS:-}" <<'PYEOF'
import json, pathlib, statistics, sys
sys.path.insert(0, "benchmarks")
from gpu_clock import parse_sample
out, size, steps, flags = sys.argv[1:]
runs, clocks, order = {}, {}, []


def busy_clock(smi):
    """Mean SM clock (MHz) and power (W) over the samples while the GPU trained (power above half the
    run's largest sample: compilation and start-up excluded); None without samples."""
    lines = smi.read_text().splitlines() if smi.exists() else []
    rows = [s for s in map(parse_sample, lines) if s is not None]
    top = max((p for _, p in rows), default=0.0)
    busy = [(c, p) for c, p in rows if p > top / 2]
    return (statistics.fmean(c for c, _ in busy), statistics.fmean(p for _, p in busy)) if busy else None


for f in sorted(pathlib.Path("/tmp/exloop").glob("*/*/summary.json"),
                key=lambda f: (int(f.parent.parent.name), f.stat().st_mtime)):
    runs.setdefault(f.parent.name, []).append(json.loads(f.read_text())["tokens_per_s"])
    clocks.setdefault(f.parent.name, []).append(busy_clock(f.parent.parent / f"{f.parent.name}.smi"))
    order.append(f.parent.name)
if "dense-on" not in runs:
    print("exloop: no dense:on run, the ratios are NaN", file=sys.stderr)
base = statistics.median(runs.get("dense-on", [float("nan")]))
lines = [f"# The example's own loop: {size}, {steps} steps per run, flags `{flags}`", "",
         "`python benchmarks/harness/train_gpt.py --recipe R --size SIZE --steps N --prepare-weights HOW --eval-every 100000 "
         "--ckpt-every 0 --finetune-fraction 0 --quiet --overwrite FLAGS`, one process per run, runs interleaved; "
         "tokens/s over the run (compilation and evaluation excluded). Runs in this order: " + ", ".join(order)
         + ". `SM MHz / W`: the card's mean SM clock and power draw while each run trained (nvidia-smi every "
         "0.5 s): on a power-capped card a run's clock, and so its tokens/s, depends on when it ran.", "",
         "| recipe / --prepare-weights | tokens/s per run | median | vs dense (median) | SM MHz / W per run |",
         "|---|---|---|---|---|"]
for k in sorted(runs):
    v = runs[k]
    smi = ", ".join("–" if c is None else f"{c[0]:.0f} / {c[1]:.0f}" for c in clocks[k])
    lines.append(f"| {k} | {', '.join(f'{x:,.0f}' for x in v)} | {statistics.median(v):,.0f} | "
                 f"{statistics.median(v) / base:.3f}x | {smi} |")
pathlib.Path(out).write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
  note "exloop $tag in $(( $(date +%s) - t0 )) s"
fi

if asked fp8probe; then
  t0=$(date +%s)
  timeout ${PROBE_FP8_TIMEOUT:-300} $PY scripts/probe_fp8.py --out "$OUT" ${PROBE_FP8_ARGS:-} > "$OUT/logs/probe_fp8.log" 2>&1
  rc=$?; note "probe_fp8 rc=$rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/logs/probe_fp8.log")"; [ $rc -eq 0 ] || status=1
  cp "$OUT/logs/probe_fp8.log" "$OUT/" 2>/dev/null
fi

if asked fp8; then
  t0=$(date +%s)
  timeout ${FP8_TEST_TIMEOUT:-150} $PY -m pytest -m gpu -q -rs tests/test_gpu_fp8.py > "$OUT/logs/gpu_fp8_tests.log" 2>&1
  rc=$?; note "fp8 gpu tests rc=$rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/logs/gpu_fp8_tests.log")"; [ $rc -eq 0 ] || { grep -E "^(FAILED|ERROR)|Error" "$OUT/logs/gpu_fp8_tests.log" | head -20; status=1; }
  t0=$(date +%s)
  timeout ${FP8_BENCH_TIMEOUT:-240} $PY benchmarks/bench_fp8_gemm.py --out "$OUT" ${FP8_BENCH_ARGS:-} > "$OUT/logs/bench_fp8_gemm.log" 2>&1
  rc=$?; note "bench_fp8_gemm rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -20 "$OUT/logs/bench_fp8_gemm.log"; status=1; }
fi

if asked launch; then
  t0=$(date +%s)
  timeout ${LAUNCH_TIMEOUT:-240} $PY benchmarks/bench_launch.py --out "$OUT" ${LAUNCH_ARGS:-} > "$OUT/logs/bench_launch.log" 2>&1
  rc=$?; note "bench_launch rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -20 "$OUT/logs/bench_launch.log"; status=1; }
fi

if asked quality; then
  # QUALITY_DATA: a text file (bytes are the tokens; QUALITY_VAL validates) or a token directory of
  # examples/prepare_data.py (its tokenizer; carry it). QUALITY_PARALLEL=1: one process per recipe, recipe i on
  # GPU i mod (GPU count) (with more recipes than GPUs, recipe i waits for recipe i - GPU count); they share the
  # --runs directory, and one --report-only run makes the table of all of them at the end.
  runs=${QUALITY_RUNS:-runs/bq_${QUALITY_SIZE:-gpt2}}
  data=${QUALITY_DATA:-runs/data/realtext_train.txt}
  if [ -d "$data" ]; then dargs=(--data "$data"); else dargs=(--data "$data" --val-data "${QUALITY_VAL:-runs/data/realtext_val.txt}"); fi
  quality_run() {  # recipes, log name
    local t0; t0=$(date +%s)
    timeout ${QUALITY_TIMEOUT:-560} $PY benchmarks/bench_quality.py --size ${QUALITY_SIZE:-gpt2} --tokens ${QUALITY_TOKENS:-100e6} \
      "${dargs[@]}" --runs "$runs" --recipes "$1" --out "$OUT/results" --tag "${QUALITY_TAG:-quality_gpu}" \
      --seed ${QUALITY_SEED:-0} ${QUALITY_FLAGS:+--flags "$QUALITY_FLAGS"} > "$OUT/logs/$2.log" 2>&1
    rc=$?; note "bench_quality[$1] rc=$rc in $(( $(date +%s) - t0 )) s"
    [ $rc -eq 0 ] || { tail -20 "$OUT/logs/$2.log"; return 1; }
  }
  if [ "${QUALITY_PARALLEL:-0}" = 1 ]; then
    ngpu=$($PY -c "import jax; print(jax.device_count())" 2>/dev/null || echo 1)
    IFS=, read -r -a recs <<< "${QUALITY_RECIPES:-dense,srste}"; pids=(); i=0
    for r in "${recs[@]}"; do
      g=$(( i % ngpu )); [ -n "${pids[$g]:-}" ] && { wait "${pids[$g]}" || status=1; }
      CUDA_VISIBLE_DEVICES=$g quality_run "$r" "bench_quality_${r//[^A-Za-z0-9_-]/_}" & pids[$g]=$!; i=$(( i + 1 ))
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    $PY benchmarks/bench_quality.py --report-only --runs "$runs" --out "$OUT/results" --tag "${QUALITY_TAG:-quality_gpu}" \
      > "$OUT/logs/bench_quality_report.log" 2>&1 || { note "bench_quality --report-only failed"; tail -5 "$OUT/logs/bench_quality_report.log"; status=1; }
  else
    quality_run "${QUALITY_RECIPES:-dense,srste}" bench_quality || status=1
  fi
  tar -C "$(dirname "$runs")" -czf "$OUT/quality_runs.tgz" "$(basename "$runs")" 2>/dev/null
fi

if asked loader; then
  # the example's loader against a fixed batch in the same train step (benchmarks/bench_loader.py; LOADER_DATA: a
  # carried token directory of prepare_data.py, LOADER_SIZE (gpt2), LOADER_ARGS)
  t0=$(date +%s)
  timeout ${LOADER_TIMEOUT:-240} $PY benchmarks/bench_loader.py --data ${LOADER_DATA:-runs/data/realtext_bpe32k} \
    --size ${LOADER_SIZE:-gpt2} --out "$OUT" --tag "${GPU_TAG}_${LOADER_SIZE:-gpt2}" ${LOADER_ARGS:-} \
    > "$OUT/logs/bench_loader.log" 2>&1
  rc=$?; note "bench_loader rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E '^\| (loader|fixed)' "$OUT/logs/bench_loader.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || { tail -20 "$OUT/logs/bench_loader.log"; status=1; }
fi

if asked example; then
  # the README's GPU command: examples/train.py --compare dense,srste on a carried token directory of prepare_data.py
  # (EXAMPLE_DATA; the README's is the bundled text at vocabulary 32000), EXAMPLE_ARGS (size flags, default
  # "--size llama-7b --n-layer 4", the README's), EXAMPLE_STEPS (300); summary.json and loss.png come back as example_train_<gpu>_<EXAMPLE_TAG>.*
  t0=$(date +%s); etag=${EXAMPLE_TAG:-llama-7b_l4}
  timeout ${EXAMPLE_TIMEOUT:-540} $PY examples/train.py --data ${EXAMPLE_DATA:-runs/data/realtext_small_bpe32k} \
    ${EXAMPLE_ARGS:---size llama-7b --n-layer 4} --steps ${EXAMPLE_STEPS:-300} --compare dense,srste --out runs/example_$etag --overwrite \
    --ckpt-every 0 \
    > "$OUT/logs/example_$etag.log" 2>&1
  rc=$?; note "example $etag rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E '^\| (dense|srste) ' "$OUT/logs/example_$etag.log" | tr '\n' ' ')"
  if [ $rc -eq 0 ]; then cp runs/example_$etag/summary.json "$OUT/example_train_${GPU_TAG}_$etag.json"
    cp runs/example_$etag/loss.png "$OUT/example_train_${GPU_TAG}_$etag.png" 2>/dev/null
  else tail -20 "$OUT/logs/example_$etag.log"; status=1; fi
fi

if asked rematcheck; then
  # a kept 2:4 GEMM output is not computed twice: scripts/probe_remat_hlo.py compiles the example's step under
  # --remat none / dots / full (one device, and fsdp over every visible GPU when there are several) and fails when
  # dots runs more 2:4 GEMM calls than none (REMATCHECK_ARGS: more flags, e.g. "--recipe srste+fp8")
  t0=$(date +%s); ngpu=$($PY -c "import jax; print(jax.device_count())" 2>/dev/null || echo 1)
  timeout ${REMATCHECK_TIMEOUT:-300} $PY scripts/probe_remat_hlo.py --size llama-7b --n-layer 2 --batch-size $(( 4 * ngpu )) \
    $([ "$ngpu" -gt 1 ] && echo "--mesh fsdp=$ngpu") ${REMATCHECK_ARGS:-} > "$OUT/logs/rematcheck.log" 2>&1
  rc=$?; note "rematcheck rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] || { tail -8 "$OUT/logs/rematcheck.log"; status=1; }
fi

if asked maskcheck; then
  # the device-side mask check's cost in a step (benchmarks/bench_mask_check.py)
  t0=$(date +%s)
  timeout ${MASKCHECK_TIMEOUT:-240} $PY benchmarks/bench_mask_check.py --out "$OUT" > "$OUT/logs/mask_check.log" 2>&1
  rc=$?; note "bench_mask_check rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E '^(gpt2|llama)' "$OUT/logs/mask_check.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || { tail -20 "$OUT/logs/mask_check.log"; status=1; }
fi

if asked node; then
  # Full-depth LLaMA on the visible GPUs (bench_train_gpt.py --mesh, vocabulary 32000, the other
  # variants' states parked in host memory): NODE_SPECS="size:layers:mesh:global_batch[:remat] ..."; NODE_RECIPES
  # (default dense,srste), NODE_ROUNDS x NODE_ITERS, NODE_ARGS (more flags); tags
  # <gpu>x<ngpu>_<size>_l<layers>_<mesh>
  ngpu=$($PY -c "import jax; print(jax.device_count())" 2>/dev/null || echo 0)
  for spec in ${NODE_SPECS:-llama-1b:16:fsdp=$ngpu:$((4 * ngpu))}; do
    IFS=: read -r size layers mesh batch remat <<< "$spec"
    tag="${GPU_TAG}x${ngpu}_${size}_l${layers}_${mesh//[=,]/}${NODE_TAG_SUFFIX:-}"; t0=$(date +%s)
    timeout ${NODE_TIMEOUT:-540} $PY benchmarks/bench_train_gpt.py --out "$OUT" --tag "$tag" --size "$size" \
      --n-layer "$layers" --mesh "$mesh" --batch-size "$batch" --vocab-size ${NODE_VOCAB:-32000} --quality-steps 0 \
      --rounds ${NODE_ROUNDS:-3} --iters ${NODE_ITERS:-5} --warmup 2 --compile-workers 1 --park ${NODE_PARK:-host} \
      --recipes ${NODE_RECIPES:-dense,srste} ${remat:+--remat $remat} ${NODE_ARGS:-} > "$OUT/logs/node_$tag.log" 2>&1
    rc=$?; note "node $spec rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'compiled|tokens/s' "$OUT/logs/node_$tag.log" | tr '\n' ' ' | cut -c1-600)"
    [ $rc -eq 0 ] || { tail -25 "$OUT/logs/node_$tag.log"; status=1; }
  done
fi

if asked scaling; then
  # Weak scaling: the same model and tokens per GPU on 1, 2, 4 ... of the visible GPUs (FSDP over them; one
  # GPU: no mesh), dense vs the recipes in one run per GPU count: SCALING_SPEC="size:layers:batch_per_gpu[:remat]"
  # (default llama-1b:16:4:dots; without remat one H100 runs out of memory), SCALING_GPUS (default "1 2 4" up to the visible count), SCALING_RECIPES
  # (default dense,srste); tags <gpu>x<n>_<size>_l<layers>_scaling
  ngpu=$($PY -c "import jax; print(jax.device_count())" 2>/dev/null || echo 0)
  IFS=: read -r size layers per remat <<< "${SCALING_SPEC:-llama-1b:16:4:dots}"
  for n in ${SCALING_GPUS:-1 2 4}; do
    [ "$n" -le "$ngpu" ] || continue
    tag="${GPU_TAG}x${n}_${size}_l${layers}_scaling"; t0=$(date +%s)
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( n - 1 ))) timeout ${SCALING_TIMEOUT:-300} $PY benchmarks/bench_train_gpt.py \
      --out "$OUT" --tag "$tag" --size "$size" --n-layer "$layers" $([ "$n" -gt 1 ] && echo --mesh "fsdp=$n") \
      --batch-size $(( per * n )) --vocab-size ${NODE_VOCAB:-32000} --quality-steps 0 --rounds ${NODE_ROUNDS:-3} \
      --iters ${NODE_ITERS:-5} --warmup 2 --compile-workers 1 --park none --recipes ${SCALING_RECIPES:-dense,srste} \
      ${remat:+--remat $remat} > "$OUT/logs/scaling_$tag.log" 2>&1
    rc=$?; note "scaling $n GPU(s) rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'tokens/s' "$OUT/logs/scaling_$tag.log" | tr '\n' ' ' | cut -c1-400)"
    [ $rc -eq 0 ] || { tail -25 "$OUT/logs/scaling_$tag.log"; status=1; }
  done
  # one table of every GPU count: weak_scaling_<gpu>_<size>_l<layers>.json/.md (efficiency per variant)
  files=$(ls "$OUT"/train_gpt_${GPU_TAG}x*_${size}_l${layers}_scaling.json 2>/dev/null)
  if [ -n "$files" ]; then
    $PY benchmarks/weak_scaling.py $files --out "$OUT" --tag "${GPU_TAG}_${size}_l${layers}" > "$OUT/logs/weak_scaling.log" 2>&1 \
      || { note "weak_scaling.py failed"; tail -5 "$OUT/logs/weak_scaling.log"; status=1; }
  fi
fi

if asked distckpt; then
  # One process per GPU (examples/launch.py + train_gpt.py --distributed) on every visible GPU, FSDP,
  # sharded checkpoints: an uninterrupted DISTCKPT_STEPS-step run, then the same run resumed from its
  # half-way checkpoint by half as many processes (resharded); the losses after the resume must match.
  ngpu=$($PY -c "import jax; print(jax.device_count())" 2>/dev/null || echo 0)
  half=$(( ngpu / 2 )); steps=${DISTCKPT_STEPS:-8}; run="$OUT/distckpt_run"; rm -rf "$run"
  common="--size ${DISTCKPT_SIZE:-llama-1b} --n-layer ${DISTCKPT_LAYERS:-4} --recipe srste --steps $steps --ckpt-every $(( steps / 2 ))
    --eval-every $(( steps / 2 )) --eval-batches 2 --log-every 1 --batch-size ${DISTCKPT_BATCH:-$(( 2 * ngpu ))} --seq-len 1024 --quiet
    --final-eval-tokens 0 ${DISTCKPT_ARGS:-}"
  t0=$(date +%s)
  timeout ${DISTCKPT_TIMEOUT:-300} $PY examples/launch.py --nproc "$ngpu" --log-dir "$OUT/logs/distckpt_a" -- \
    benchmarks/harness/train_gpt.py $common --distributed --mesh "fsdp=$ngpu" --out "$run" > "$OUT/logs/distckpt_a.log" 2>&1
  rc=$?; note "distckpt: $ngpu processes, fsdp=$ngpu, $steps steps rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || { tail -30 "$OUT/logs/distckpt_a.log"; status=1; }
  cp "$run/metrics.jsonl" "$OUT/logs/distckpt_a_metrics.jsonl" 2>/dev/null
  t0=$(date +%s)
  timeout ${DISTCKPT_TIMEOUT:-300} $PY examples/launch.py --nproc "$half" --log-dir "$OUT/logs/distckpt_b" -- \
    benchmarks/harness/train_gpt.py $common --distributed --mesh "fsdp=$half" --resume-from $(( steps / 2 )) --out "$run" \
    > "$OUT/logs/distckpt_b.log" 2>&1
  rc=$?; note "distckpt: resumed at step $(( steps / 2 )) on $half processes rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || { tail -30 "$OUT/logs/distckpt_b.log"; status=1; }
  $PY - "$OUT/logs/distckpt_a_metrics.jsonl" "$run/metrics.jsonl" $(( steps / 2 )) "$ngpu" "$half" \
    "$OUT/distributed_resume_${GPU_TAG}x${ngpu}" "$common" <<'PYEOF' 2>&1 | tee -a "$OUT/logs/summary.txt"
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, open(p))) if "loss" in r}
a, b, half, n, n2, out, common = losses(sys.argv[1]), losses(sys.argv[2]), *map(int, sys.argv[3:6]), *sys.argv[6:8]
after = sorted(s for s in a if s > half)
rel = max(abs(b[s] - a[s]) / abs(a[s]) for s in after) if after and all(s in b for s in after) else float("nan")
ok = rel <= 5e-3
print(f"== distckpt: losses after the resume vs uninterrupted, steps {after}: max relative difference {rel:.2e}",
      "OK" if ok else "MISMATCH", {s: (a[s], b.get(s)) for s in after})
res = dict(processes=n, resumed_on=n2, checkpoint_step=half, args=" ".join(common.split()), ok=ok,
           max_rel_diff=rel, losses={s: [a[s], b.get(s)] for s in after})
json.dump(res, open(out + ".json", "w"), indent=1)
rows = "\n".join(f"| {s} | {a[s]:.6f} | {b[s]:.6f} | {abs(b[s] - a[s]) / abs(a[s]):.1e} |" for s in after if s in b)
open(out + ".md", "w").write(
    f"# One process per GPU, sharded checkpoint, resumed on fewer processes\n\n"
    f"`bash scripts/gpu_check.sh distckpt`: `examples/launch.py --nproc {n} -- benchmarks/harness/train_gpt.py --distributed "
    f"--mesh fsdp={n} {res['args']}`, then the same run resumed from its step-{half} checkpoint by "
    f"`--nproc {n2} ... --mesh fsdp={n2} --resume-from {half}` (restored into the new mesh's shardings, "
    f"no array gathered on one device).\n\n| step | loss, {n} processes | loss, resumed on {n2} | relative difference |\n"
    f"|---|---|---|---|\n{rows}\n\nMax relative difference {rel:.1e} (bfloat16 GEMMs; another mesh sums in "
    f"another order): {'OK' if ok else 'MISMATCH'} (limit 5e-3).\n")
PYEOF
  rm -rf "$run"
fi

if want multigpu; then
  # Sharded training with the CUDA kernels on every visible GPU (a functional check, not a
  # benchmark): the GPT example under a data-parallel and a tensor-parallel mesh, each sparse
  # backend forced (auto runs dense GEMMs at these shapes), prepared weights (--grad-accum 2).
  ngpu=$($PY -c "import jax; print(sum(d.platform == 'gpu' for d in jax.devices()))" 2>/dev/null || echo 0)
  if [ "${ngpu:-0}" -lt 2 ]; then
    note "multigpu skipped: $ngpu GPU(s) visible"
  else
    # backend[:fp8 flags]: the 16-bit sparse GEMMs of each backend, then (MULTIGPU_FP8=1, default) the
    # partitioned fp8 GEMMs (CUTLASS) with current and with delayed scaling
    variants=${MULTIGPU_BACKENDS:-cutlass cusparselt}
    [ "${MULTIGPU_FP8:-1}" = 1 ] && variants="$variants cutlass:--fp8 cutlass:--fp8,--fp8-scaling,delayed"
    for mesh in "data=$ngpu,model=1" "data=1,model=$ngpu"; do
      for variant in $variants; do
        backend=${variant%%:*}; flags=; [[ $variant == *:* ]] && flags=${variant#*:}
        t0=$(date +%s); tag="train_${mesh//[=,]/_}_$backend${flags:+_fp8}"; [[ $flags == *delayed* ]] && tag+=_delayed
        timeout ${MULTIGPU_TIMEOUT:-180} $PY benchmarks/harness/train_gpt.py --recipe srste --size gpt2 --steps 30 \
          --grad-accum 2 --mesh "$mesh" --sparse-backend "$backend" ${flags//,/ } --out "/tmp/$tag" --overwrite --quiet \
          --eval-every 15 --log-every 10 > "$OUT/logs/$tag.log" 2>&1
        rc=$?; note "multigpu[$mesh $backend ${flags//,/ }] rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E 'final val loss|Error' "$OUT/logs/$tag.log" | tail -1 | cut -c1-300)"
        [ $rc -eq 0 ] || status=1
      done
    done
  fi
fi

echo; cat "$OUT/logs/summary.txt"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
# The device tool returns at most 8 files from $OUT: past 7 besides logs.tgz, pack the plain files
# into results.tgz (unpack with `tar -xzf results.tgz -C benchmarks/results`; folders stay as they are).
files=$(cd "$OUT" && find . -maxdepth 1 -type f ! -name logs.tgz ! -name results.tgz -printf '%f\n' | sort)
if [ "$(echo "$files" | grep -c .)" -gt 7 ]; then
  (cd "$OUT" && tar -czf results.tgz $files && rm -f $files) && echo "== packed $(echo "$files" | wc -l) files into results.tgz"
fi
exit $status
