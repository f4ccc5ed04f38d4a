"""Benchmark: CUTLASS SM90 2:4 sparse GEMM (and cuSPARSELt's) vs XLA's dense GEMM, forward y = x @ w̃.

For each (T, I, O) and dtype: our spmm in the forward formulation (M = O, N = T, K = I; the weight
compressed once outside the timed region, as it is once per optimizer step) with the default
configuration AND every compiled configuration (so the table in spmm_cutlass.cu can be re-tuned),
then, for bfloat16 shapes of at least TILE_ORDER_MIN_FLOPS (where operand reuse in the L2 can
matter), the fastest configuration under every tile order of its persistent scheduler (raster
along M / along N x swizzle 1, 2, 4, 8; the configurations above run CUTLASS's heuristic order),
against XLA's ``x @ w`` and ``x @ (w * mask)`` (the baseline is the faster of the two, DESIGN.md
"Measuring"), plus a second, separately compiled ``x @ w`` as a dense-vs-dense control (the noise
floor of the run). Also times ``cutlass_compress`` (effective GB/s: bytes read + written), and,
where libcusparseLt loads, cuSPARSELt's GEMM in the same trials (bfloat16; float16 GEMMs are
refused, see ``cuda_cusparselt_ops.float16_gemm_error``).

Method (device tool METHOD.md): every timed call runs the op once on each of R distinct input sets
(R >= 3 and together well over the 50 MB L2; distinct sets also keep XLA from merging the calls),
several calls are enqueued back to back (JAX dispatch is asynchronous, so host overhead hides
behind device work) and then block_until_ready; perf_counter over that, divided by the op count.
Variants are interleaved within each trial; medians over trials after a warm-up. Inputs are random
normal (never zeros). The spmm result is checked against the masked dense product once per shape.
The compressors are variants of the same interleaved measurement as the GEMMs (timed alone, a
compressor of a GPT-2-sized weight was seen 3x off its fp16 twin in one run).

    python benchmarks/bench_spmm.py            # full run (a few minutes on an H100)
    python benchmarks/bench_spmm.py --quick    # 3 shapes, bfloat16, fewer trials
Writes DIR/spmm.json and DIR/spmm.md (--out DIR, default benchmarks/results) and prints the
markdown tables last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jax_sparse24._src import ffi as _ffi  # noqa: E402
from jax_sparse24._src import cuda_spmm_ops as ops  # noqa: E402

SHAPES = [  # (T, I, O)
    (8192, 768, 3072),
    (8192, 3072, 768),
    (8192, 1280, 5120),
    (8192, 5120, 1280),
    (13008, 1024, 4096),
    (8192, 2048, 8192),  # d = 2048 and d = 4096 FFNs: the widths where a GPT train step gains
    (8192, 8192, 2048),  # (train_gpt_h100_width*.md); measured so `auto`'s table covers them
    (8192, 4096, 16384),
    (8192, 16384, 4096),
    (16384, 4096, 11008),
    (8192, 8192, 8192),
]
QUICK_SHAPES = [(8192, 768, 3072), (8192, 3072, 768), (16384, 4096, 11008)]
L2_BYTES = 50 * 2**20
TARGET_SET_BYTES = 4 * L2_BYTES  # inputs of all R sets together
TARGET_CALL_SECONDS = 0.02  # enqueue calls until about this much device time per measurement
TILE_ORDER_MIN_FLOPS = 2.5e11  # tile-order sweep from the d = 2048 FFN (2 * 8192 * 2048 * 8192) up


def _mask24_along0(w):
    """2:4 top-magnitude mask of w (I, O) along I (the contraction axis): groups of 4 rows."""
    i, o = w.shape
    g = jnp.abs(w.astype(jnp.float32)).T.reshape(o, i // 4, 4)
    _, idx = jax.lax.top_k(g, 2)
    keep = jax.nn.one_hot(idx, 4, dtype=jnp.bool_).any(axis=-2)  # (o, i/4, 4)
    return keep.reshape(o, i).T


def make_sets(t, i, o, dtype, n_sets, seed):
    key = jax.random.PRNGKey(seed)
    sets = []
    for s in range(n_sets):
        kx, kw, key = jax.random.split(key, 3)
        x = jax.random.normal(kx, (t, i), jnp.float32).astype(dtype)
        w = (jax.random.normal(kw, (i, o), jnp.float32) / math.sqrt(i)).astype(dtype)
        mask = _mask24_along0(w)
        a = jnp.where(mask, w, 0).T  # (O, I): the 2:4 operand, K-major
        values, meta = jax.jit(ops.cutlass_compress)(a)
        sets.append(dict(x=x, w=w, mask=mask.astype(dtype), a=a, values=values, meta=meta))
    jax.block_until_ready(sets)
    return sets


def build_variants(t, i, o, sets, configs):
    """name -> (jitted fn, args tuple). Each fn runs its op once on every set."""
    xs = tuple(s["x"] for s in sets)
    ws = tuple(s["w"] for s in sets)
    masks = tuple(s["mask"] for s in sets)
    vals = tuple(s["values"] for s in sets)
    metas = tuple(s["meta"] for s in sets)
    r = len(sets)

    def dense(xs, ws):
        return tuple(xs[j] @ ws[j] for j in range(r))

    def dense_ctrl(xs, ws):  # same math, compiled separately: the noise floor
        return tuple(jnp.matmul(xs[j], ws[j]) for j in range(r))

    def masked(xs, ws, masks):
        return tuple(xs[j] @ (ws[j] * masks[j]) for j in range(r))

    variants = {
        "dense": (jax.jit(dense), (xs, ws)),
        "dense_ctrl": (jax.jit(dense_ctrl), (xs, ws)),
        "masked": (jax.jit(masked), (xs, ws, masks)),
    }
    def make_spmm(c):  # a closure per config (no traced default arguments)
        def spmm(vals, metas, xs):
            return tuple(ops.cutlass_spmm(vals[j], metas[j], xs[j], m=o, k=i, config=c) for j in range(r))

        return spmm

    for c, name in configs:
        variants[f"cfg:{name}"] = (jax.jit(make_spmm(c)), (vals, metas, xs))
    return variants


def tile_order_name(raster: str, swizzle: int) -> str:
    return f"{raster}/{swizzle}"


def build_tile_order_variants(i, o, sets, config):
    """``config`` under every non-default tile order: name "raster/swizzle" -> (jitted fn, args)."""
    xs = tuple(s["x"] for s in sets)
    vals = tuple(s["values"] for s in sets)
    metas = tuple(s["meta"] for s in sets)
    r = len(sets)

    def make(raster, swizzle):
        def spmm(vals, metas, xs):
            return tuple(ops.cutlass_spmm(vals[j], metas[j], xs[j], m=o, k=i, config=config, raster=raster,
                                          swizzle=swizzle) for j in range(r))

        return spmm

    return {tile_order_name(ra, sw): (jax.jit(make(ra, sw)), (vals, metas, xs))
            for ra in ("m", "n") for sw in ops.SWIZZLES}


def time_calls(fn, args, calls):
    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - t0


def measure(variants, r, trials):
    """Median seconds per op for each variant, interleaved across trials."""
    calls = {}
    for name, (fn, args) in variants.items():  # compile + warm up, size the call count
        try:
            jax.block_until_ready(fn(*args))
        except Exception as e:  # a handler error (e.g. can_implement) must not end the whole run
            print(f"  {name} failed, left out: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        dt = time_calls(fn, args, 1)
        calls[name] = max(2, min(50, math.ceil(TARGET_CALL_SECONDS / max(dt, 1e-6))))
    samples = {name: [] for name in calls}
    names = list(calls)
    for trial in range(trials):
        order = names[trial % len(names):] + names[: trial % len(names)]  # rotate the order
        for name in order:
            fn, args = variants[name]
            samples[name].append(time_calls(fn, args, calls[name]) / (calls[name] * r))
    return {name: statistics.median(v) for name, v in samples.items()}, samples


def check_result(t, i, o, s, dtype):
    y = ops.cutlass_spmm(s["values"], s["meta"], s["x"], m=o, k=i)
    ref = jnp.matmul(s["x"].astype(jnp.float32), s["a"].T.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST)
    y = y.astype(jnp.float32)
    rel = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
    finite = bool(jnp.isfinite(y).all())
    return rel if finite else float("nan")


def compress_variants(sets):
    """The compressors as variants of the shape's interleaved measurement (same trials, same clocks
    as the GEMMs they are added to): CUTLASS's generic one of the (O, I) operand, and the fused
    one-pass ``masked_compress`` of W (I, O) + mask into W̃ᵀ (what ``sparse24_linear`` runs)."""
    from jax_sparse24._src import cuda_compress_ops as cc

    a_s = tuple(s["a"] for s in sets)
    ws = tuple(s["w"] for s in sets)
    ms = tuple(s["mask"] != 0 for s in sets)
    return {
        "compress": (jax.jit(lambda a_s: tuple(ops.cutlass_compress(a) for a in a_s)), (a_s,)),
        "fused": (jax.jit(lambda ws, ms: tuple(cc.masked_compress(w, m, transposed=True) for w, m in zip(ws, ms))),
                  (ws, ms)),
    }


def cusparselt_variants(t, i, o, sets, dtype):
    """cuSPARSELt beside CUTLASS in the same interleaved trials (the issue's "benchmarked beside
    CUTLASS"): its GEMM alone on an operand our fused compressor wrote in cuSPARSELt's layout (A
    stored (m, k), compressed once outside the timed region, like a prepared weight), and the GEMM
    with that compressor per call (what ``backend="cusparselt"`` runs). Empty where the library is
    missing, the dtype is refused (float16, ``cuda_cusparselt_ops.float16_gemm_error``) or the
    fused compressor's bytes do not match the library's for this plan."""
    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    if not (lt.cusparselt_supports(o, t, i, dtype) and lt.fused_compress_ok(o, t, i, dtype)):
        return {}
    kw = dict(m=o, n=t, k=i, a_layout=lt.A_MK, b_layout=lt.B_NK)
    xs = tuple(s["x"] for s in sets)
    ws = tuple(s["w"] for s in sets)
    ms = tuple(s["mask"] != 0 for s in sets)
    ops_lt = jax.jit(lambda ws, ms: tuple(cc.masked_compress(w, m, transposed=True, layout="cusparselt")
                                          for w, m in zip(ws, ms)))(ws, ms)
    jax.block_until_ready(ops_lt)
    return {
        "cusparselt": (jax.jit(lambda C, xs: tuple(lt.cusparselt_spmm(c, x, **kw) for c, x in zip(C, xs))),
                       (ops_lt, xs)),
        "cusparselt_fused": (jax.jit(lambda ws, ms, xs: tuple(
            lt.cusparselt_spmm(cc.masked_compress(w, m, transposed=True, layout="cusparselt"), x, **kw)
            for w, m, x in zip(ws, ms, xs))), (ws, ms, xs)),
    }


def check_cusparselt(s, fn):
    """Relative error of the cuSPARSELt forward against the masked dense product (HIGHEST precision)."""
    y = fn((s["w"],), (s["mask"] != 0,), (s["x"],))[0].astype(jnp.float32)
    ref = jnp.matmul(s["x"].astype(jnp.float32), s["a"].T.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    rel = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
    return rel if bool(jnp.isfinite(y).all()) else float("nan")


def compress_bytes(sets):
    """Bytes read + written per call: (generic compressor, fused compressor)."""
    a, w = sets[0]["a"], sets[0]["w"]
    out = sets[0]["values"].size * sets[0]["values"].dtype.itemsize + sets[0]["meta"].size
    return a.size * a.dtype.itemsize + out, w.size * w.dtype.itemsize + w.size + out  # mask: 1 byte/element


def fused_matches_cutlass(sets, fused_fn):
    """The fused compressor's output is bit-identical to CUTLASS's compressor of W * mask."""
    r = len(sets)
    w, m = sets[0]["w"], sets[0]["mask"] != 0
    got = fused_fn((w,) * r, (m,) * r)[0]
    return bool(jnp.array_equal(got[0], sets[0]["values"])) and bool(jnp.array_equal(got[1], sets[0]["meta"]))


def run(args):
    if not _ffi.cuda_kernels_available():
        raise SystemExit(f"needs a CUDA GPU and the built extension: {_ffi.extension_error() or 'no GPU'}")
    names = ops.cutlass_configs()
    dtypes = [jnp.dtype(d) for d in args.dtypes] if args.dtypes else (
        [jnp.bfloat16] if args.quick else [jnp.bfloat16, jnp.float16])
    shapes = QUICK_SHAPES if args.quick else SHAPES
    trials = args.trials or (3 if args.quick else 7)
    dev = jax.devices()[0]
    meta = dict(
        device=dev.device_kind, jax=jax.__version__, python=platform.python_version(),
        date=datetime.datetime.now().isoformat(timespec="seconds"), configs=list(names),
        alignment=list(ops.cutlass_alignment()), trials=trials, quick=bool(args.quick),
        dtypes=[jnp.dtype(d).name for d in dtypes], tile_orders=bool(args.tile_orders),
    )
    from jax_sparse24._src import cuda_cusparselt_ops as _lt

    if _lt.cusparselt_available():
        meta["cusparselt_version"] = _lt.cusparselt_version()  # the autotune table is keyed on it
    print(f"# {meta['device']}, jax {meta['jax']}, configs {list(names)}", flush=True)
    records = []
    for dtype in dtypes:
        dname = jnp.dtype(dtype).name
        if not ops.cutlass_supports(8192, 8192, 8192, dtype):
            print(f"skipping {dname}: not compiled in this build", flush=True)
            continue
        for t, i, o in shapes:
            if not ops.cutlass_supports(o, t, i, dtype):
                print(f"skipping {(t, i, o)} {dname}: unsupported shape", flush=True)
                continue
            set_bytes = (t * i + i * o) * jnp.dtype(dtype).itemsize  # inputs read per op
            r = int(min(16, max(3, math.ceil(TARGET_SET_BYTES / set_bytes))))
            sets = make_sets(t, i, o, dtype, r, seed=hash((t, i, o, dname)) % 2**31)
            default = ops.cutlass_default_config(o, t, i)
            configs = list(enumerate(names))
            variants = build_variants(t, i, o, sets, configs)
            variants.update(compress_variants(sets))
            lt_variants = cusparselt_variants(t, i, o, sets, dtype) if args.cusparselt else {}
            variants.update(lt_variants)
            med, samples = measure(variants, r, trials)
            rel = check_result(t, i, o, sets[0], dtype)
            lt_rec = {}
            if "cusparselt" in med:
                lt_ms = med["cusparselt"] * 1e3
                lt_fused_ms = med.get("cusparselt_fused", math.nan) * 1e3
                lt_rec = dict(cusparselt_ms=lt_ms, cusparselt_fused_ms=lt_fused_ms,
                              cusparselt_rel_err=check_cusparselt(sets[0], lt_variants["cusparselt_fused"][0]))
            c_bytes, f_bytes = compress_bytes(sets)
            c_time = med["compress"]
            c_gbs = c_bytes / c_time / 1e9
            if "fused" in med:
                f_time, f_gbs = med["fused"], f_bytes / med["fused"] / 1e9
                f_same = fused_matches_cutlass(sets, variants["fused"][0])
            else:  # an older build without the fused compressors (measure() printed why)
                f_time, f_gbs, f_same = float("nan"), float("nan"), False
            flops = 2.0 * t * i * o
            baseline = min(med["dense"], med["masked"])
            cfg_ms = {n: med[f"cfg:{n}"] * 1e3 for n in names if f"cfg:{n}" in med}
            if names[default] not in cfg_ms:
                print(f"skipping {(t, i, o)} {dname}: the default configuration failed", flush=True)
                continue
            best = min(cfg_ms, key=cfg_ms.get)
            order_ms = {tile_order_name("heuristic", 1): cfg_ms[best]}
            if args.tile_orders and dtype == jnp.bfloat16 and 2.0 * t * i * o >= TILE_ORDER_MIN_FLOPS:
                # the heuristic order again in the same interleaved trials: the reference of the ratios
                tv = build_tile_order_variants(i, o, sets, names.index(best))
                tv[tile_order_name("heuristic", 1)] = variants[f"cfg:{best}"]
                tmed, _ = measure(tv, r, trials)
                order_ms = {k: v * 1e3 for k, v in tmed.items()}
            best_order = min(order_ms, key=order_ms.get)
            rec = dict(
                T=t, I=i, O=o, dtype=dname, sets=r, rel_err=rel,
                dense_ms=med["dense"] * 1e3, masked_ms=med["masked"] * 1e3,
                dense_ctrl_ms=med["dense_ctrl"] * 1e3, baseline_ms=baseline * 1e3,
                control_ratio=med["dense"] / med["dense_ctrl"],
                default_config=names[default], default_ms=cfg_ms[names[default]],
                default_tflops=flops / (cfg_ms[names[default]] * 1e-3) / 1e12,
                default_speedup=baseline * 1e3 / cfg_ms[names[default]],
                baseline_tflops=flops / baseline / 1e12,
                best_config=best, best_ms=cfg_ms[best], best_speedup=baseline * 1e3 / cfg_ms[best],
                config_ms=cfg_ms,
                config_speedup={n: baseline * 1e3 / v for n, v in cfg_ms.items()},
                # the best config under each tile order ("raster/swizzle"), measured in their own
                # interleaved trials; tile_order_gain = heuristic-order ms / best-order ms of that run
                tile_order_ms=order_ms, best_tile_order=best_order,
                tile_order_gain=order_ms[tile_order_name("heuristic", 1)] / order_ms[best_order],
                compress_ms=c_time * 1e3, compress_gbs=c_gbs,
                fused_compress_ms=f_time * 1e3, fused_compress_gbs=f_gbs, fused_compress_matches_cutlass=f_same,
                samples_ms={k: [s * 1e3 for s in v] for k, v in samples.items()},
            )
            if lt_rec:
                lt_rec.update(cusparselt_speedup=rec["baseline_ms"] / lt_rec["cusparselt_ms"],
                              cusparselt_tflops=flops / (lt_rec["cusparselt_ms"] * 1e-3) / 1e12,
                              cusparselt_speedup_with_compress=rec["baseline_ms"] / lt_rec["cusparselt_fused_ms"])
                rec.update(lt_rec)
            records.append(rec)
            print(
                f"{(t, i, o)} {dname}: dense {rec['dense_ms']:.3f} ms, masked {rec['masked_ms']:.3f} ms, "
                f"ours[{rec['default_config']}] {rec['default_ms']:.3f} ms ({rec['default_speedup']:.2f}x), "
                f"best[{best}] {rec['best_speedup']:.2f}x (tile order {best_order}: "
                f"{rec['tile_order_gain']:.3f}x of heuristic), control {rec['control_ratio']:.3f}, "
                f"compress {c_gbs:.0f} GB/s, fused compress {f_gbs:.0f} GB/s (matches: {f_same}), rel err {rel:.1e}"
                + (f"; cusparselt {rec['cusparselt_ms']:.3f} ms ({rec['cusparselt_speedup']:.2f}x, with fused "
                   f"compress {rec['cusparselt_speedup_with_compress']:.2f}x, rel err {rec['cusparselt_rel_err']:.1e})"
                   if lt_rec else ""),
                flush=True,
            )
            del sets, variants
    return meta, records


def markdown(meta, records):
    lines = [
        f"# 2:4 spmm (CUTLASS; cuSPARSELt where it loads) vs XLA dense — {meta['device']}, jax {meta['jax']}, {meta['date']}",
        "",
        "Forward y = x·w̃ (x: T×I, w̃: I×O), sparse GEMM M = O, N = T, K = I. Baseline = faster of XLA "
        "`x @ w` and `x @ (w * mask)`; speedup = baseline / ours; TFLOP/s count 2·T·I·O (dense "
        "equivalent); control = dense / separately compiled dense (noise floor); compress = "
        "`cutlass_compress` of the (O, I) operand, bytes read + written; fused = the one-pass "
        "`masked_compress(w, mask, transposed=True)` from W (I, O) and its mask (W, mask read, W̃ᵀ "
        "compressed written), as `sparse24_linear` runs it.",
        "",
        "| T, I, O | dtype | dense ms | masked ms | ours ms (default cfg) | ours TFLOP/s | dense TFLOP/s "
        "| speedup | best cfg (speedup) | control | compress GB/s | fused GB/s | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['T']}, {r['I']}, {r['O']} | {r['dtype']} | {r['dense_ms']:.3f} | {r['masked_ms']:.3f} "
            f"| {r['default_ms']:.3f} ({r['default_config']}) | {r['default_tflops']:.0f} "
            f"| {r['baseline_tflops']:.0f} | **{r['default_speedup']:.2f}×** "
            f"| {r['best_config']} ({r['best_speedup']:.2f}×) | {r['control_ratio']:.3f} "
            f"| {r['compress_gbs']:.0f} | {r.get('fused_compress_gbs', float('nan')):.0f} | {r['rel_err']:.1e} |"
        )
    lt = [r for r in records if "cusparselt_ms" in r]
    if lt:
        lines += ["", "cuSPARSELt in the same trials (its GEMM on an operand our fused compressor wrote in its "
                  "layout, compressed once like a prepared weight; and with that compression per call). "
                  "Speedup vs the same baseline; CUTLASS = the best configuration above:", "",
                  "| T, I, O | dtype | cuSPARSELt ms | TFLOP/s | speedup | with fused compress | CUTLASS best "
                  "| rel err |", "|---|---|---|---|---|---|---|---|"]
        for r in lt:
            lines.append(
                f"| {r['T']}, {r['I']}, {r['O']} | {r['dtype']} | {r['cusparselt_ms']:.3f} "
                f"| {r['cusparselt_tflops']:.0f} | **{r['cusparselt_speedup']:.2f}×** "
                f"| {r['cusparselt_speedup_with_compress']:.2f}× | {r['best_speedup']:.2f}× "
                f"| {r['cusparselt_rel_err']:.1e} |")
    names = meta["configs"]
    lines += ["", "Speedup of every compiled configuration (for re-tuning `CutlassDefaultConfig`):", ""]
    lines.append("| T, I, O | dtype | " + " | ".join(names) + " |")
    lines.append("|---|---|" + "---|" * len(names))
    for r in records:
        cells = []
        for n in names:
            if n not in r["config_speedup"]:
                cells.append("failed")
                continue
            cell = f"{r['config_speedup'][n]:.2f}×"
            if n == r["default_config"]:
                cell = f"{cell} (default)"
            if n == r["best_config"]:
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {r['T']}, {r['I']}, {r['O']} | {r['dtype']} | " + " | ".join(cells) + " |")
    orders = [tile_order_name("heuristic", 1)] + [tile_order_name(ra, sw) for ra in ("m", "n") for sw in ops.SWIZZLES]
    if any(len(r.get("tile_order_ms", {})) > 1 for r in records):
        lines += ["", "Tile order of the best configuration (raster/swizzle; time relative to CUTLASS's heuristic "
                  "order in the same trials, < 1 is faster):", ""]
        lines.append("| T, I, O | dtype | config | " + " | ".join(orders) + " |")
        lines.append("|---|---|---|" + "---|" * len(orders))
        for r in records:
            om = r.get("tile_order_ms", {})
            if len(om) <= 1:
                continue
            ref = om[orders[0]]
            cells = []
            for n in orders:
                cell = "–" if n not in om else f"{om[n] / ref:.3f}"
                if n == r["best_tile_order"]:
                    cell = f"**{cell}**"
                cells.append(cell)
            lines.append(f"| {r['T']}, {r['I']}, {r['O']} | {r['dtype']} | {r['best_config']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--quick", action="store_true", help="3 shapes, bfloat16 only, 3 trials")
    p.add_argument("--trials", type=int, default=0, help="trials per variant (default 7, quick 3)")
    p.add_argument("--no-tile-orders", dest="tile_orders", action="store_false",
                   help="skip the sweep of the best configuration's tile orders")
    p.add_argument("--dtypes", nargs="+", choices=["bfloat16", "float16"], default=None,
                   help="default: both (quick: bfloat16)")
    p.add_argument("--no-cusparselt", dest="cusparselt", action="store_false",
                   help="leave out cuSPARSELt (timed beside CUTLASS by default where the library loads)")
    args = p.parse_args(argv)
    meta, records = run(args)
    write_results(args.out, "spmm", meta, records, markdown(meta, records))


def write_json(out_dir: str, name: str, meta: dict, records: list) -> None:
    """``out_dir/<name>.json``: ``{"meta", "records"}``."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)


def write_results(out_dir: str, name: str, meta: dict, records: list, md: str) -> None:
    """``out_dir/<name>.json`` ({"meta", "records"}) and ``<name>.md``; the table is printed too."""
    write_json(out_dir, name, meta, records)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
