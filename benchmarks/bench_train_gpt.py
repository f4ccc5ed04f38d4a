#!/usr/bin/env python
"""End-to-end GPT train-step throughput, dense vs every 2:4 recipe, plus a short quality run.

Part 1 — throughput. For each ``--size`` every recipe's training program (the jitted step of
``benchmarks/harness/train_gpt.py``: forward, backward, optimizer, mask refresh; sparse recipes in their
sparse phase — ``srste`` before its dense fine-tune, ``step`` with the optimizer state in phase 1)
is compiled, warmed up and timed in interleaved rounds (the order rotates every round) on four
distinct batches of the bundled corpus; the median step time gives tokens/s. A second,
independent dense state timed in the same rounds (``dense (control)``) gives the noise floor.

``RECIPE+fp8`` variants (``--recipes dense,dense+fp8,srste,srste+fp8``) run the example's ``--fp8``:
``srste+fp8`` the fp8 2:4 GEMMs, ``dense+fp8`` the fp8 dense baseline (the same layers as XLA's
fp8 dense GEMMs, same current scaling, 16-bit weight gradient); ``RECIPE+fp8-delayed`` the same with
delayed scaling; ``dense+fp8-flax`` the dense model with Flax's own ``nn.Dense(dot_general_cls=
Fp8DirectDotGeneralOp)`` (delayed scaling, every GEMM fp8, e5m2 gradients): the fp8 dense baseline a
Flax user writes.

``RECIPE/prepared`` runs the example's ``--prepare-weights always`` (the 2:4 weights masked and
compressed once per step, batched across layers, before the forward/backward, also at
``--grad-accum 1``), ``RECIPE/per-call`` its ``off`` (each GEMM call prepares its weight, also per
micro-batch): ``--recipes dense,srste,srste/prepared`` times srste's step with the weights prepared
in its GEMM calls and once per step, without accumulation.

Part 2 — quality at a fixed token budget (``--quality-size``, default the first size): every
recipe trains ``--quality-steps`` steps from the same init on the same batches (the training
loop of ``train_gpt.py``: srste's dense fine-tune, STEP's switch), then the final val loss.

The programs of a size are compiled concurrently (``--compile-workers``; XLA's GEMM autotuning
then shares the GPU between compilations — use ``--compile-workers 1`` for a careful run).

Writes ``benchmarks/results/train_gpt_<tag>.json`` / ``.md`` / ``_quality.png`` and prints the
table last. Default tag: the backend (``gpu``/``cpu``), plus ``_quick`` with ``--quick``.

    python benchmarks/bench_train_gpt.py                        # H100: gpt2 + gpt2-medium
    python benchmarks/bench_train_gpt.py --quick                 # half batch, fewer steps
    python benchmarks/bench_train_gpt.py --size tiny --quick     # CPU smoke test
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import cProfile
import gc
import gzip
import io
import json
import os
import pstats
import re
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import train_gpt  # noqa: E402  (also puts the repo root on sys.path if needed)
import gpt_report  # noqa: E402
import model  # noqa: E402
from gpu_clock import ClockSampler  # noqa: E402
from result_files import write_result  # noqa: E402
from jax_sparse24 import optim as s24optim  # noqa: E402
from partition_profile import partition_callback_stats, profile_partition_callbacks  # noqa: E402  (instruments on import)
from jax_sparse24.sharding import weight_gather  # noqa: E402

ALL = ["dense", "srste", "sste", "step", "ste"]


def _force_step_phase(opt_state, phase: int = 1):
    """The optimizer state with STEP switched to ``phase`` (v frozen at its current value)."""
    is_step = lambda x: isinstance(x, s24optim.AdamWStepState)  # noqa: E731

    def fix(x):
        if not is_step(x):
            return x
        return x._replace(phase=jnp.full_like(x.phase, phase),
                          switch_step=jnp.maximum(x.count, 1).astype(jnp.int32))

    return jax.tree.map(fix, opt_state, is_leaf=is_step)


#: Suffix of a ``--recipes`` entry that runs the recipe with ``--prepare-weights off`` (with
#: ``--grad-accum`` > 1: every micro-batch masks and compresses the weights again), e.g. ``srste/per-call``.
PER_CALL = "/per-call"
#: Suffix that runs the recipe with ``--prepare-weights always``: the 2:4 weights prepared once per step,
#: batched across layers, also at ``--grad-accum 1`` (e.g. ``srste/prepared`` against ``srste``, whose
#: GEMM calls mask and compress their weights). The program is the recipe's own where nothing is
#: prepared (dense, ``+fp8``) and at ``--grad-accum`` > 1 (``on`` prepares there already).
PREPARED = "/prepared"
#: ``--prepare-weights`` of each suffix (at most one per label; without one ``on``, the example's default
#: at most sizes — passed explicitly, so a label means the same program at every size).
PREPARE_SUFFIXES = {PER_CALL: "off", PREPARED: "always"}


#: ``RECIPE@BACKEND`` runs RECIPE with ``--sparse-backend BACKEND`` (e.g. ``srste@cutlass``, and
#: ``srste@cutlass/per-call``): two backends side by side in one run.
AT_BACKEND = "@"
#: ``RECIPE+fp8`` runs RECIPE with the example's ``--fp8`` (e.g. ``srste+fp8``: the 2:4 layers' forward
#: and input-gradient GEMMs in fp8; ``dense+fp8``: the same layers as XLA's fp8 dense GEMMs with the
#: same current scaling — the fp8 dense baseline), e.g. ``--recipes dense,dense+fp8,srste,srste+fp8``.
FP8 = "+fp8"
#: ``RECIPE+fp8-delayed``: the same with ``--fp8-scaling delayed`` (Flax's amax-history scaling).
FP8_DELAYED = "+fp8-delayed"
#: ``dense+fp8-flax``: the dense model with Flax's own fp8 layer (``--fp8 --fp8-scaling delayed
#: --fp8-dense flax``: ``nn.Dense(dot_general_cls=Fp8DirectDotGeneralOp)``, all three GEMMs fp8) — the
#: fp8 dense baseline a Flax user writes. Dense recipe only.
FP8_FLAX = "+fp8-flax"
#: Last suffix of a ``--recipes`` entry: the recipe's 2:4 GEMMs gather FSDP-sharded weights the way XLA
#: does without the library's packed gather (weight and bool mask, 1.5x the bf16 weight's bytes instead of
#: 0.5625x; ``jax_sparse24.sharding.weight_gather("dense")``), e.g. ``srste,srste/dense-gather``.
DENSE_GATHER = "/dense-gather"
#: The form of a ``--recipes`` entry.
LABEL_FORM = f"RECIPE[{AT_BACKEND}BACKEND][{FP8}|{FP8_DELAYED}|{FP8_FLAX}][{PER_CALL}|{PREPARED}][{DENSE_GATHER}]"


class Label(NamedTuple):
    recipe: str
    backend: str | None  # --sparse-backend (None: the example's default)
    fp8: bool
    prepare_weights: str | None  # --prepare-weights (None: on)
    fp8_scaling: str = "current"  # --fp8-scaling
    fp8_dense: str = "sparse24"  # --fp8-dense
    weight_gather: str = "packed"  # jax_sparse24.sharding.weight_gather while tracing


def weight_gather_of(label: str) -> str:
    """The ``jax_sparse24.sharding.weight_gather`` mode of a ``--recipes`` entry (also of the labels other
    harnesses build on this one's, e.g. bench_step_breakdown's ``RECIPE@ATTENTION``)."""
    return "dense" if label.endswith(DENSE_GATHER) else "packed"


def split_label(label: str) -> Label:
    """``RECIPE[@BACKEND][+fp8|+fp8-delayed|+fp8-flax][/per-call|/prepared][/dense-gather]`` -> :class:`Label`;
    ``ValueError`` saying what is wrong for an unknown recipe or backend, or both prepare suffixes."""
    gather = weight_gather_of(label)
    label = label.removesuffix(DENSE_GATHER)
    found = [suffix for suffix in PREPARE_SUFFIXES if suffix in label]
    if len(found) > 1:
        raise ValueError(f"{label!r}: {' and '.join(found)} exclude each other (each sets --prepare-weights)")
    name, prepare = label, None
    if found and label.endswith(found[0]):
        name, prepare = label[: -len(found[0])], PREPARE_SUFFIXES[found[0]]
    # (suffix, --fp8-scaling, --fp8-dense) of the fp8 variants
    variants = ((FP8_FLAX, "delayed", "flax"), (FP8_DELAYED, "delayed", "sparse24"), (FP8, "current", "sparse24"))
    suffix, scaling, fp8_dense = next((v for v in variants if name.endswith(v[0])), ("", "current", "sparse24"))
    fp8 = bool(suffix)
    recipe, _, backend = (name[: -len(suffix)] if fp8 else name).partition(AT_BACKEND)
    if recipe not in train_gpt.RECIPES:
        raise ValueError(f"{label!r}: unknown recipe {recipe!r} (expected {LABEL_FORM}, RECIPE one of "
                         f"{sorted(train_gpt.RECIPES)})")
    if backend and backend not in train_gpt.s24.BACKENDS:
        raise ValueError(f"{label!r}: unknown backend {backend!r} (one of {list(train_gpt.s24.BACKENDS)})")
    if fp8_dense == "flax" and recipe != "dense":
        raise ValueError(f"{label!r}: {FP8_FLAX} is Flax's fp8 dense layer, for the dense recipe only")
    return Label(recipe, backend or None, fp8, prepare, scaling, fp8_dense, gather)


def label_errors(labels) -> list[str]:
    """What :func:`split_label` says about each label it refuses."""
    errors = []
    for label in labels:
        try:
            split_label(label)
        except ValueError as e:
            errors.append(str(e))
    return errors


def experiment(size, label, batch, seq, steps, extra, vocab_size=None):
    lb = split_label(label)
    if lb.fp8:
        extra = [*extra, "--fp8", "--fp8-scaling", lb.fp8_scaling, "--fp8-dense", lb.fp8_dense]
    extra = [*extra, "--prepare-weights", lb.prepare_weights or "on"]
    if lb.backend:
        extra = [*extra, "--sparse-backend", lb.backend]
    recipe = lb.recipe
    args = train_gpt.build_parser().parse_args(
        ["--size", size, "--recipe", recipe, "--steps", str(steps), "--batch-size", str(batch),
         "--seq-len", str(seq), "--warmup", str(max(1, steps // 10)), *extra])
    hp = train_gpt.resolve_flags(args, recipe)
    hp["data_sha256"] = "bench"
    if vocab_size:  # a real vocabulary's embedding and head (the byte tokens index its first 256 rows)
        hp["vocab_size"] = vocab_size
    return train_gpt.build_experiment(hp)


def _programs(exp, quality: bool):
    """(kind, sparse) pairs a recipe needs: its timed train program, plus the quality run's."""
    method = exp.cfg.method
    timed = None if method == "dense" else True
    need = {("train", timed)}
    if quality:
        if exp.recipe.get("finetune") or exp.recipe.get("step"):
            need |= {("train", False), ("eval", True), ("eval", False)}
        else:
            need.add(("eval", timed))
    return sorted(need, key=str)


def hlo_text(exe) -> str | None:
    """A compiled program's optimized HLO, or None where the backend cannot print its executable."""
    try:
        return exe.as_text()
    except Exception:  # noqa: BLE001
        return None


def hlo_counts(text: str | None) -> dict:
    """Instructions of an optimized HLO text by kind (what a compile time scales with)."""
    if text is None:
        return {}
    kinds = {"fusion": r" fusion\(", "custom-call": r"custom-call\(", "all-gather": r"all-gather(-start)?\(",
             "reduce-scatter": r"reduce-scatter\(", "all-reduce": r"all-reduce(-start)?\(", "while": r" while\("}
    return {k: len(re.findall(pat, text)) for k, pat in kinds.items()}


def callbacks_since(before: dict, after: dict) -> tuple[int, float, dict]:
    """Partitioner callbacks between two :func:`partition_callback_stats` readings:
    (calls, seconds, {rule: (calls, seconds)} of the rules that were called)."""
    by_rule = {r: (n - before.get(r, (0, 0.0))[0], round(sec - before.get(r, (0, 0.0))[1], 3))
               for r, (n, sec) in after.items() if n > before.get(r, (0, 0.0))[0]}
    return sum(n for n, _ in by_rule.values()), sum(sec for _, sec in by_rule.values()), by_rule


#: ``--xla-preset``: named sets of XLA flags. ``fsdp``: collective scheduling for FSDP on one node (the
#: latency-hiding scheduler; all-gathers, reduce-scatters and all-reduces combined up to 512 MiB and pipelined
#: across the scanned layers, the loop double-buffered, collectives on a high-priority stream), the set
#: JAX-Toolbox and MaxText run their GPU LLM recipes with; docs/multi_gpu.md gives it as XLA_FLAGS. They go to
#: XLA_FLAGS, not to the compiler options: jax 0.11.2 refuses some of them as compile options ("No such compile
#: option") while XLA_FLAGS accepts them.
XLA_PRESETS = {
    "none": (),
    "fsdp": ("--xla_gpu_enable_latency_hiding_scheduler=true", "--xla_gpu_enable_highest_priority_async_stream=true",
             "--xla_gpu_all_reduce_combine_threshold_bytes=536870912",
             "--xla_gpu_all_gather_combine_threshold_bytes=536870912",
             "--xla_gpu_reduce_scatter_combine_threshold_bytes=536870912",
             "--xla_gpu_enable_pipelined_all_gather=true", "--xla_gpu_enable_pipelined_reduce_scatter=true",
             "--xla_gpu_enable_pipelined_all_reduce=true", "--xla_gpu_enable_while_loop_double_buffering=true"),
}


def apply_xla_preset(preset: str) -> None:
    """Append ``XLA_PRESETS[preset]`` to ``XLA_FLAGS``; XLA reads them once, when JAX starts its backends, so
    this must run before the first computation (an error says so if a backend is already up)."""
    if preset not in XLA_PRESETS:
        raise SystemExit(f"--xla-preset must be one of {sorted(XLA_PRESETS)}, got {preset!r}")
    if not XLA_PRESETS[preset]:
        return
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
        raise RuntimeError("--xla-preset: JAX's backends are already initialized, so XLA_FLAGS would be ignored")
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *XLA_PRESETS[preset]]).strip()


def compile_options(pairs) -> dict:
    """``["k=v", ...]`` → XLA compiler options (ints and booleans parsed)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--compile-option wants KEY=VALUE, got {pair!r}")
        low = value.lower()
        out[key] = True if low == "true" else False if low == "false" else int(value) if value.lstrip("-").isdigit() else value
    return out


def compile_all(rts: dict, quality: bool, workers: int, log, options: dict | None = None,
                dump_hlo: str | None = None, profile: bool = False) -> dict:
    """Lower every needed program serially, compile them concurrently; {(recipe, kind, sparse): exe}.

    ``options``: XLA compiler options for every compile (``--compile-option``). Each recipe's timed
    train program records its compile time, the part of it spent in the 2:4 ops' partitioner
    callbacks (exact with one worker) and its optimized HLO's instruction counts."""
    lowered, lower_s = {}, {}
    for recipe, rt in rts.items():
        lowered[(recipe, "init", None)] = rt.init.lower()  # compiled with the rest, not serially later
        st, tok = rt.abstract_args()
        for kind, sparse in _programs(rt.exp, quality):
            fn = rt.train_step(sparse) if kind == "train" else rt.eval_step(sparse)
            t = time.perf_counter()
            with weight_gather(weight_gather_of(recipe)):  # read while tracing
                lowered[(recipe, kind, sparse)] = fn.lower(st, tok)
            lower_s[(recipe, kind, sparse)] = time.perf_counter() - t
    t0 = time.perf_counter()
    seconds, callbacks = {}, {}

    def timed_compile(k, lw):
        cb0 = partition_callback_stats()
        prof = cProfile.Profile() if profile and k[1] == "train" else None
        profile_partition_callbacks(prof)
        t = time.perf_counter()
        try:
            exe = lw.compile(compiler_options=options) if options else lw.compile()
        finally:
            profile_partition_callbacks(None)
        seconds[k] = time.perf_counter() - t
        if prof is not None and prof.getstats():
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
            log(f"  Python profile of the partitioner callbacks while compiling {k[0]}'s train program:\n"
                + buf.getvalue())
        callbacks[k] = callbacks_since(cb0, partition_callback_stats())
        return exe

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futs = {k: pool.submit(timed_compile, k, lw) for k, lw in lowered.items()}
        exes = {k: f.result() for k, f in futs.items()}
    for recipe, rt in rts.items():
        rt.init = exes.pop((recipe, "init", None))
        # the timed train program's compile time (alone only with --compile-workers 1)
        sparse = None if rt.exp.cfg.method == "dense" else True
        k = (recipe, "train", sparse)
        rt.compile_s = seconds.get(k)
        rt.compile_detail = None
        if k in seconds:
            calls, cb_s, by_rule = callbacks[k]
            text = hlo_text(exes[k])
            rt.compile_detail = {"lower_s": round(lower_s[k], 2), "compile_s": round(seconds[k], 2),
                                 "partition_callbacks": calls, "partition_callback_s": round(cb_s, 2),
                                 "partition_callbacks_by_rule": by_rule, "hlo": hlo_counts(text)}
            if dump_hlo and text is not None:
                Path(dump_hlo).mkdir(parents=True, exist_ok=True)
                with gzip.open(Path(dump_hlo) / f"{recipe.replace('/', '_')}_train.hlo.txt.gz", "wt") as f:
                    f.write(text)
            log(f"  {recipe} train program: lowered in {lower_s[k]:.1f}s, compiled in {seconds[k]:.1f}s "
                f"({calls} partitioner callbacks, {cb_s:.1f}s{'' if workers == 1 else ', shared with concurrent compiles'}); "
                f"optimized HLO {rt.compile_detail['hlo']}; callbacks by rule (calls, s): {by_rule}")
    log(f"  compiled {len(exes)} programs in {time.perf_counter() - t0:.1f}s ({workers} workers): "
        + ", ".join(f"{r} {rt.compile_s:.1f}s" for r, rt in rts.items() if rt.compile_s is not None)
        + (f"; compiler options {options}" if options else ""))
    return exes


def warmed_up(rt, exes, recipe, data, warmup):
    """A recipe's timed train program and its state after ``warmup`` steps (STEP forced into its
    sparse phase) on the four timing batches: (exe, state, batches, metrics of the last step).
    Steps run as the example runs them (``Runtime.run_step``: srste's mask refresh every
    ``--mask-every`` steps, the ste/soft flip rate on logging steps, each its own program, compiled
    here)."""
    sparse = None if rt.exp.cfg.method == "dense" else True
    exe = exes[(recipe, "train", sparse)]
    state = rt.init()
    if rt.exp.needs_phase():
        state = dict(state, opt_state=_force_step_phase(state["opt_state"]))
    rt.warm_host_programs(state)
    batches = [rt.put(data.batch(10_000 + i)) for i in range(4)]
    for i in range(warmup):
        state, m = rt.run_step(state, batches[i % 4], i, sparse, train=exe)
    jax.block_until_ready(state)
    return exe, state, batches, m


@contextlib.contextmanager
def collector(mode: str):
    """Python's garbage collector while timing; yields the list of (generation, seconds) of every
    collection inside the block. ``mode="freeze"``: collect, then move every live object (the
    compiled and lowered programs, jaxprs, ...) out of its reach (``gc.freeze``), so a full
    collection scans only what the steps allocate; ``"on"``: leave it as it is. Undone on exit."""
    pauses, started = [], {}

    def on_gc(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            pauses.append((info["generation"], time.perf_counter() - started.pop("t")))

    if mode == "freeze":
        gc.collect()
        gc.freeze()
    gc.callbacks.append(on_gc)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(on_gc)
        if mode == "freeze":
            gc.unfreeze()


def timed_steps(rt, exe, state, batches, iters: int, step0: int):
    """``iters`` steps (``rt.run_step`` with ``exe``, updates ``step0, step0 + 1, ...``) from ``state``
    over ``batches`` (cycled), then one sync: ``(state, seconds per step)``."""
    t0 = time.perf_counter()
    for i in range(iters):
        state, _ = rt.run_step(state, batches[i % len(batches)], step0 + i, None, train=exe)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - t0) / iters


def park(r: dict) -> None:
    """Move a variant's train state to host memory (its device buffers are freed)."""
    r["state"] = jax.device_get(r["state"])


def unpark(r: dict) -> None:
    """Put a parked variant's state back on the device, with the runtime's shardings."""
    if not isinstance(jax.tree.leaves(r["state"])[0], jax.Array):
        r["state"] = jax.device_put(r["state"], r["rt"].state_shardings)
        jax.block_until_ready(r["state"])


def throughput(rts, exes, data_by_recipe, iters, rounds, warmup, log, gc_mode="freeze", park_idle=False,
               control="separate") -> dict:
    """Interleaved timing rounds, with Python's collector as :func:`collector` ``(gc_mode)`` sets it.
    ``park_idle``: only the timed variant's state is on the device during its round; the others wait
    in host memory (moved outside the timed steps). ``control``: ``"separate"``: the control is a second
    dense state; ``"shared"``: it steps the dense variant's own state in a round of its own (one train
    state less on the device, for models whose states do not fit three times)."""
    runs = {}
    variants = [(r, r) for r in rts] + ([("dense (control)", "dense")] if "dense" in rts else [])
    for label, recipe in variants:
        if control == "shared" and label == "dense (control)":
            runs[label] = {k: v for k, v in runs["dense"].items() if k not in ("state", "step", "times")}
            runs[label].update(times=[], shares="dense")  # steps the dense run's state (and its step count)
            continue
        exe, state, batches, m = warmed_up(rts[recipe], exes, recipe, data_by_recipe, warmup)
        runs[label] = dict(rt=rts[recipe], exe=exe, state=state, batches=batches, times=[], step=warmup,
                           sparse=bool(m["sparse"]),
                           n_params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state["params"])))
        if park_idle:
            park(runs[label])
    labels = list(runs)
    with collector(gc_mode) as pauses, ClockSampler() as clock:
        for rnd in range(rounds):
            for label in labels[rnd % len(labels):] + labels[: rnd % len(labels)]:
                r = runs[label]
                owner = runs[r.get("shares", label)]  # whose train state this round steps
                if park_idle:
                    unpark(owner)
                t0 = time.perf_counter()
                owner["state"], t = timed_steps(r["rt"], r["exe"], owner["state"], r["batches"], iters, owner["step"])
                clock.window(label, t0, time.perf_counter())
                r["times"].append(t)
                owner["step"] += iters
                if park_idle:
                    park(owner)
    gc_pauses = {f"gen{g}": {"count": sum(1 for q, _ in pauses if q == g),
                             "total_s": sum(t for q, t in pauses if q == g),
                             "max_s": max((t for q, t in pauses if q == g), default=0.0)} for g in range(3)}
    log(f"  gc during the rounds ({gc_mode}): " + ", ".join(
        f"{k} {v['count']}x max {1e3 * v['max_s']:.1f} ms" for k, v in gc_pauses.items()))
    hp = next(iter(rts.values())).exp.hp
    tokens = hp["batch_size"] * hp["seq_len"]
    clocks = clock.summary()
    dense_t = statistics.median(runs["dense"]["times"]) if "dense" in runs else None
    dense_mean = statistics.fmean(runs["dense"]["times"]) if "dense" in runs else None
    rows = []
    for label in labels:
        r = runs.pop(label)
        t, t_mean = statistics.median(r["times"]), statistics.fmean(r["times"])
        rows.append({"variant": label, "sparse_phase": r["sparse"], "median_step_s": t, "tokens_per_s": tokens / t,
                     "vs_dense": (dense_t / t) if dense_t else None,
                     # The mean keeps the slow rounds the median drops (what a long run pays for them).
                     "mean_step_s": t_mean, "vs_dense_mean": (dense_mean / t_mean) if dense_mean else None,
                     "spread": (max(r["times"]) - min(r["times"])) / t, "step_times_s": r["times"],
                     "n_params": r["n_params"], "gpu_clock": clocks.get(label),
                     "compile_s": getattr(r["rt"], "compile_s", None),
                     "compile_detail": getattr(r["rt"], "compile_detail", None)})
        log(f"  {label:<16s} {1e3 * t:8.2f} ms/step  {tokens / t:12,.0f} tokens/s")
    return {"batch_size": hp["batch_size"], "seq_len": hp["seq_len"], "tokens_per_step": tokens,
            "peak_gib_per_device": _peak_gib(),
            "iters": iters, "rounds": rounds, "gc": gc_mode, "park_idle": park_idle, "control": control, "gc_pauses": gc_pauses, "n_params": rows[0]["n_params"], "rows": rows}


def _peak_gib():
    """The largest peak of device memory in use over the devices (GiB), where the backend reports it."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    peaks = [p for p in peaks if p]
    return max(peaks) / 2**30 if peaks else None


#: dense bf16 peak of one card (TFLOP/s): H100 SXM and H200 alike (NVIDIA's spec sheets, no sparsity)
PEAK_TFLOPS = 989.4


def model_flops_per_token(cfg) -> float:
    """Training FLOPs per token of the dense model (6·N for the matmul weights, embeddings' lookup
    excluded, head included, + 12·L·d·T for attention's scores and values, PaLM's MFU convention)."""
    d, L, T = cfg.n_embd, cfg.n_layer, cfg.block_size
    f = cfg.ffn_hidden
    n_ffn = (3 if cfg.ffn == "swiglu" else 2) * d * f
    n = L * (4 * d * d + n_ffn) + d * cfg.vocab_size
    return 6.0 * n + 12.0 * L * d * T


def auto_plan(rts) -> dict:
    """The example's :func:`train_gpt.kernel_plan` of the first sparse recipe (single device)."""
    return next((p for p in map(train_gpt.kernel_plan, rts.values()) if p), {})


def quality(rts, exes, data, steps, log) -> dict:
    """Train every recipe ``steps`` steps on identical batches; histories in train_gpt's format."""
    out = {}
    for recipe, rt in rts.items():
        exp = rt.exp
        state = rt.init()
        phase = train_gpt.step_phase(state) if exp.needs_phase() else 0
        hist = []

        def evaluate(step):
            exe = exes[(recipe, "eval", exp.sparse_at(step, phase))]
            return float(np.mean(jax.device_get([exe(state, rt.put(b)) for b in data.val_batches])))

        hist.append({"step": 0, "val_loss": evaluate(0)})
        t_train, t0 = 0.0, time.perf_counter()
        losses = []
        rt.warm_host_programs(state)
        for step in range(steps):
            sparse = exp.sparse_at(step, phase)
            state, m = rt.run_step(state, rt.put(data.batch(step)), step, sparse,
                                   train=exes[(recipe, "train", sparse)])
            losses.append(m)
            if exp.needs_phase() and not phase:
                phase = train_gpt.step_phase(state)
            if (step + 1) % max(1, steps // 5) == 0 or step + 1 == steps:
                got = jax.device_get(losses)
                t_train += time.perf_counter() - t0
                for i, g in enumerate(got):
                    hist.append({"step": step + 2 - len(got) + i, "loss": float(g["loss"]),
                                 "flip": gpt_report.nan_to_none(g["flip"]), "sparse": bool(g["sparse"])})
                losses = []
                hist.append({"step": step + 1, "val_loss": evaluate(step + 1)})
                t0 = time.perf_counter()
        switched = [r["step"] for r in hist if "loss" in r and r["sparse"] != hist[1]["sparse"]]
        out[recipe] = {"history": hist, "final_val_loss": hist[-1]["val_loss"],
                       "final_train_loss": next(r["loss"] for r in reversed(hist) if "loss" in r),
                       "phase_switch_step": switched[0] if switched else None, "train_time_s": t_train}
        log(f"  {recipe:<6s} final val loss {hist[-1]['val_loss']:.4f}")
    return out


def to_markdown(res: dict) -> str:
    lines = [f"# GPT train step: dense vs 2:4 recipes ({res['device']}, jax {res['jax']})", "",
             f"Command: `{res['command']}` (kernels built: {res['cuda_kernels']})", ""]
    for tp in res["throughput"]:
        shape = f"d={tp['n_embd']}, {tp['n_layer']} layers, " if "n_embd" in tp else ""
        if tp.get("grad_accum", 1) > 1:
            shape += f"{tp['grad_accum']} micro-batches, "
        clocked = any(r.get("gpu_clock") for r in tp["rows"])
        lines += [f"## Throughput: {tp['size']} ({shape}{tp['n_params'] / 1e6:.0f}M params, batch {tp['batch_size']} x "
                  f"{tp['seq_len']} tokens, {tp.get('attention', 'xla')} attention, median of {tp['rounds']} interleaved "
                  f"rounds x {tp['iters']} steps" + (", Python gc frozen" if tp.get("gc") == "freeze" else "")
                  + (", the other variants' states in host memory during a round" if tp.get("park_idle") else "")
                  + ")", "",
                  "| variant | step (ms) | tokens/s | vs dense | spread | vs dense (mean of rounds) | TFLOP/s per GPU "
                  "(model) | MFU | compile (s) |" + (" SM MHz / W |" if clocked else ""),
                  "|---|---|---|---|---|---|---|---|---|" + ("---|" if clocked else "")]
        for r in tp["rows"]:
            vs = "-" if r["vs_dense"] is None else f"{r['vs_dense']:.3f}x"
            vs_mean = "-" if r.get("vs_dense_mean") is None else f"{r['vs_dense_mean']:.3f}x"
            clk = r.get("gpu_clock")
            clk = "" if not clocked else (" – |" if not clk else f" {clk['sm_mhz']:.0f} / {clk['power_w']:.0f} |")
            tf = r.get("model_tflops_per_gpu")
            comp = r.get("compile_s")
            lines.append(f"| {r['variant']} | {1e3 * r['median_step_s']:.2f} | {r['tokens_per_s']:,.0f} | {vs} | "
                         f"{100 * r['spread']:.1f}% | {vs_mean} | {'-' if tf is None else f'{tf:.0f}'} | "
                         f"{'-' if tf is None else f'{100 * tf / PEAK_TFLOPS:.1f}%'} | "
                         f"{'-' if comp is None else f'{comp:.1f}'} |" + clk)
        if tp.get("mesh"):
            lines += ["", f"Mesh `{tp['mesh']}` over {tp['n_devices']} devices, vocabulary {tp.get('vocab_size')}, "
                      f"peak device memory {tp['peak_gib_per_device']:.1f} GiB per device"
                      if tp.get("peak_gib_per_device") else f"Mesh `{tp['mesh']}` over {tp['n_devices']} devices"]
        if tp.get("auto_plan"):
            lines += ["", "`backend=\"auto\"` per sparse layer of the first sparse recipe (in x out): "
                      + train_gpt.format_plan(tp["auto_plan"])]
        lines.append("")
    q = res.get("quality")
    if q:
        dense = q["recipes"].get("dense")
        lines += [f"## Quality: {q['size']}, {q['steps']} steps x {q['batch_size']} x {q['seq_len']} = "
                  f"{q['tokens']:,} tokens per recipe", "",
                  "| recipe | final val loss | vs dense | final train loss | phase switch |", "|---|---|---|---|---|"]
        for name, r in q["recipes"].items():
            vs = "-" if not dense else f"{100 * (r['final_val_loss'] / dense['final_val_loss'] - 1):+.2f}%"
            sw = "-" if r["phase_switch_step"] is None else str(r["phase_switch_step"])
            lines.append(f"| {name} | {r['final_val_loss']:.4f} | {vs} | {r['final_train_loss']:.4f} | {sw} |")
        lines.append("")
    for f in res.get("failed", []):
        lines += [f"## Not timed: {f['size']}" + (f", mesh `{f['mesh']}`" if f.get("mesh") else "") + f" ({f['stage']} "
                  f"failed: `{f['error']}`)", "", "| variant | compile (s) | of it, partitioner callbacks (s) |",
                  "|---|---|---|"]
        for r, c in f["compiled"].items():
            d = c.get("compile_detail") or {}
            cs = "-" if c.get("compile_s") is None else f"{c['compile_s']:.1f}"
            lines.append(f"| {r} | {cs} | {d.get('partition_callback_s', '-')} |")
        lines.append("")
    shared = any(tp.get("control") == "shared" for tp in res.get("throughput") or [])
    lines.append("`spread` = (max − min) / median of the per-round step times; `dense (control)` is "
                 + ("the dense variant's own state stepped again in a round of its own (`--control shared`)" if shared
                    else "a second dense state") + " timed in the same rounds (its ratio to dense is the noise floor). `vs dense` compares "
                 "medians; `vs dense (mean of rounds)` compares means, which keep the slow rounds (a large spread) "
                 "that the median drops. `SM MHz / W` (where nvidia-smi ran): the GPU's mean SM clock and power "
                 "draw over the variant's timed rounds (samples every 0.2 s) — on a power-capped card a variant's "
                 "clock depends on its kernels as well as on the card's temperature.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="gpt2,gpt2-medium", help="comma-separated sizes")
    ap.add_argument("--recipes", default=",".join(ALL),
                    help=f"comma-separated recipes, each {LABEL_FORM}: RECIPE{PER_CALL} runs RECIPE with "
                         "--prepare-weights off (with --grad-accum > 1: weights masked and compressed per "
                         f"micro-batch), RECIPE{PREPARED} with --prepare-weights always (weights prepared once "
                         "per step, batched, also without --grad-accum; no change for dense and +fp8), "
                         f"RECIPE{AT_BACKEND}BACKEND with --sparse-backend BACKEND (e.g. srste@cutlass), RECIPE{FP8} "
                         "with the example's --fp8 (dense+fp8: the fp8 dense baseline, XLA's fp8 GEMMs with the "
                         f"same current scaling), RECIPE{DENSE_GATHER}: FSDP-sharded 2:4 weights gathered with their "
                         "bool masks by XLA instead of packed by the library (jax_sparse24.sharding.weight_gather)")
    ap.add_argument("--quick", action="store_true", help="half batch, at most 512 tokens, fewer rounds and steps")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the size's (halved with --quick)")
    ap.add_argument("--seq-len", type=int, default=None, help="default: the size's (<= 512 with --quick)")
    ap.add_argument("--iters", type=int, default=None, help="steps per timed round (default 20; quick 3). Each round ends in a sync whose "
                         "dispatch latency is spread over its steps: 5-step rounds on the H100 cost "
                         "recipes with larger optimizer states 2-3%% more than dense (same code, gpt2-medium)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5; quick 3)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps after compilation (>= 1)")
    ap.add_argument("--gc", choices=("freeze", "on"), default="freeze",
                    help="Python's garbage collector during the timed rounds: 'freeze' (default) collects and "
                         "freezes the live objects first (the compiled programs of every variant), so a "
                         "collection in a round does not scan them; 'on' leaves it as it is")
    ap.add_argument("--park", choices=("none", "host"), default="none",
                    help="where the variants not being timed keep their train states between rounds: 'none' "
                         "(default): all on the device at once; 'host': in host memory, so each round runs with "
                         "only its own state on the GPU, as a training process has (the transfers are outside "
                         "the timed steps). On the H200 'host' made every variant's GPT-2 124M --sparse-attn step 3-5%% faster "
                         "(train_gpt_h200_gpt2_l12_sparse-attn{,_park2,_nopark,_nopark2}.md) but a LLaMA-1B-shaped "
                         "one slower and erratic (train_gpt_h200_llama-1b_l4_nokernels_*.md): compare like with like")
    ap.add_argument("--control", choices=("separate", "shared"), default="separate",
                    help="the dense (control) variant: 'separate' (default): a second dense train state; 'shared': "
                         "the dense variant's own state stepped in a round of its own (one state less on the device, "
                         "e.g. LLaMA-7B under --remat dots on 4 x H200: dense, srste, srste+fp8 and a separate "
                         "control ran out of memory)")
    ap.add_argument("--quality-size", default=None, help="size of the quality run (default: the first size)")
    ap.add_argument("--quality-steps", type=int, default=None, help="steps of the quality run (0: skip; default 150; quick 30)")
    ap.add_argument("--compile-workers", type=int, default=8, help="concurrent XLA compilations")
    ap.add_argument("--compile-option", action="append", default=[], metavar="KEY=VALUE",
                    help="XLA compiler option for every program (repeatable), e.g. xla_gpu_autotune_level=0 "
                         "to see how much of a compile time is GEMM autotuning")
    ap.add_argument("--xla-preset", choices=sorted(XLA_PRESETS), default="none",
                    help="a named set of XLA flags (XLA_PRESETS; 'fsdp': collective scheduling for FSDP), added to "
                         "XLA_FLAGS before JAX starts")
    ap.add_argument("--profile-compile", action="store_true",
                    help="cProfile each train program's compile (run with --compile-workers 1): where the Python "
                         "time of the partitioner callbacks goes")
    ap.add_argument("--dump-hlo", default=None, metavar="DIR",
                    help="write each recipe's optimized train-step HLO to DIR/<recipe>_train.hlo.txt.gz")
    ap.add_argument("--ffn", choices=("gelu", "swiglu"), default=None, help="default: per size (the example's)")
    ap.add_argument("--sparse-attn", action=argparse.BooleanOptionalAction, default=None,
                    help="2:4 attention projections (default: per size, the example's)")
    ap.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto",
                    help="attention kernel of every recipe (dense included)")
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (the example's --grad-accum)")
    for flag in ("n-layer", "n-head", "n-embd"):
        ap.add_argument(f"--{flag}", type=int, default=None, help=f"override every size's {flag} (width sweeps)")
    ap.add_argument("--mesh", default=None, help="the example's --mesh over every visible device (e.g. "
                    "'fsdp=4', 'data=2,model=2'); --batch-size is then the global batch")
    ap.add_argument("--remat", choices=("none", "dots", "full"), default=None, help="the example's --remat (default its own)")
    ap.add_argument("--layers", choices=("scan", "unroll"), default=None, help="the example's --layers (default its own)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="the model's vocabulary (default the byte data's 256; e.g. 32000 for LLaMA's embedding and head)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default=None, help="results file name: train_gpt_<tag>.json/.md")
    a = ap.parse_args(argv)
    apply_xla_preset(a.xla_preset)

    sizes = [s for s in a.size.split(",") if s]
    recipes = [r for r in a.recipes.split(",") if r]
    qsize = a.quality_size or sizes[0]
    errors = [f"--size/--quality-size {s!r}: not one of {list(train_gpt.SIZES)}"
              for s in dict.fromkeys(sizes + [qsize]) if s not in train_gpt.SIZES]
    errors += [f"--recipes {e}" for e in label_errors(recipes)]
    if not sizes or not recipes or a.warmup < 1:
        errors.append("--size and --recipes need an entry, --warmup must be >= 1")
    if a.control == "shared" and "dense" not in recipes:
        errors.append("--control shared steps the dense recipe's state: put dense in --recipes")
    if errors:
        print("bench_train_gpt.py: error: " + "; ".join(errors), file=sys.stderr)
        return 2
    backend = jax.default_backend()
    iters = a.iters or (3 if a.quick else 20)
    rounds = a.rounds or (3 if a.quick else 5)
    qsteps = a.quality_steps if a.quality_steps is not None else (30 if a.quick else 150)
    tag = a.tag or (backend + ("_quick" if a.quick else ""))
    extra = ["--attention", a.attention] + (["--ffn", a.ffn] if a.ffn else [])
    if a.sparse_attn is not None:
        extra.append("--sparse-attn" if a.sparse_attn else "--no-sparse-attn")
    extra += ["--grad-accum", str(a.grad_accum)]
    extra += ["--remat", a.remat] if a.remat else []
    extra += ["--layers", a.layers] if a.layers else []
    for flag in ("n_layer", "n_head", "n_embd"):
        if getattr(a, flag) is not None:
            extra += [f"--{flag.replace('_', '-')}", str(getattr(a, flag))]
    if qsteps and qsize not in sizes:
        sizes.append(qsize)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    import jax_sparse24

    res = {"device": f"{backend}: {jax.devices()[0].device_kind}", "jax": jax.__version__,
           "cuda_kernels": bool(jax_sparse24.cuda_kernels_available()),
           "command": "python benchmarks/bench_train_gpt.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "throughput": [], "quality": None}
    if backend == "gpu" and not res["cuda_kernels"]:
        from jax_sparse24._src import ffi as _ffi

        log("WARNING: the CUDA kernels are not available ("
            f"{_ffi.extension_error() or 'extension not built'}): every 2:4 layer takes the jnp reference path "
            "(dense GEMMs on masked weights); these numbers are not the kernels'")
    t_start = time.perf_counter()

    def write():  # after every size too, so a run cut short keeps what it measured
        res["total_time_s"] = time.perf_counter() - t_start
        write_result(a.out, f"train_gpt_{tag}", res, to_markdown(res))

    for size in sizes:
        d = train_gpt.SIZE_DEFAULTS[size]
        batch = a.batch_size or (max(1, d["batch_size"] // 2) if a.quick else d["batch_size"])
        seq = a.seq_len or (min(d["seq_len"], 512) if a.quick else d["seq_len"])
        do_quality = bool(qsteps) and size == qsize
        steps = qsteps if do_quality else 10**6  # schedules (lr, srste switch) are baked into the programs
        log(f"{size}: batch {batch} x {seq}" + (f"; quality run {qsteps} steps" if do_quality else ""))
        data = train_gpt.ByteData(train_gpt.DEFAULT_DATA, seq, batch, seed=0, eval_batches=2)
        mesh = train_gpt.parse_mesh(a.mesh) if a.mesh else None
        rts = {r: train_gpt.make_runtime(experiment(size, r, batch, seq, steps, extra, a.vocab_size), mesh)
               for r in recipes}
        exes = compile_all(rts, do_quality, a.compile_workers, log, compile_options(a.compile_option),
                            dump_hlo=a.dump_hlo, profile=a.profile_compile)
        t0 = time.perf_counter()
        try:
            tp = throughput(rts, exes, data, iters, rounds, a.warmup, log, a.gc, a.park == "host", a.control)
        except jax.errors.JaxRuntimeError as e:  # e.g. out of memory with every state resident: keep the compile
            res.setdefault("failed", []).append(
                {"size": size, "mesh": a.mesh, "stage": "timing", "error": (str(e).strip().splitlines() or [type(e).__name__])[0][:400],
                 "compiled": {r: {"compile_s": rt.compile_s, "compile_detail": rt.compile_detail}
                              for r, rt in rts.items()}})
            write()
            log(f"{size}: the timing failed after compiling ({res['failed'][-1]['error'][:200]}); the compile times "
                f"are in {a.out / f'train_gpt_{tag}.json'}")
            return 1
        log(f"  timed in {time.perf_counter() - t0:.1f}s")
        tp["size"] = size
        cfg = next(iter(rts.values())).exp.cfg
        tp["attention"] = model.attention_implementation(cfg.attention, cfg.dtype, cfg.n_embd // cfg.n_head)
        tp.update(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, grad_accum=a.grad_accum,
                  auto_plan=auto_plan(rts), mesh=a.mesh, n_devices=jax.device_count(), vocab_size=cfg.vocab_size,
                  model_flops_per_token=model_flops_per_token(cfg))
        if backend == "gpu":
            for r in tp["rows"]:
                r["model_tflops_per_gpu"] = tp["model_flops_per_token"] * r["tokens_per_s"] / jax.device_count() / 1e12
        res["throughput"].append(tp)
        write()
        if do_quality:
            q = quality(rts, exes, data, qsteps, log)
            res["quality"] = {"size": size, "steps": qsteps, "batch_size": batch, "seq_len": seq,
                              "tokens": qsteps * batch * seq, "recipes": q}
            a.out.mkdir(parents=True, exist_ok=True)
            train_gpt.plot_compare({r: v["history"] for r, v in q.items()}, a.out / f"train_gpt_{tag}_quality.png",
                                   f"{size} (d={cfg.n_embd}, {cfg.n_layer} layers), {qsteps} steps")
        del rts, exes
    write()
    print(to_markdown(res))
    log(f"wrote {a.out / f'train_gpt_{tag}.json'} and .md ({res['total_time_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
