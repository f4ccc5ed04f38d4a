"""Bandwidth of the element-wise 2:4 CUDA kernels vs the jitted reference on the same GPU.

Effective bandwidth = (bytes the op must read + bytes it must write, each once) / time:
  mask24        N*s + N          (x in, bool mask out)
  soft24        2*N*s + N        (x in, y + mask out)
  transposable  N*s + N
  mvue24        2*N*s            (g in, out out; the key is negligible)
  copy (-x)     2*N*s            XLA's own elementwise kernel: the practical HBM ceiling of this run
with N elements of s bytes.

Method (device tool METHOD.md): K distinct input sets, each larger than L2 (50 MB), P passes over
them inside ONE jitted call (an optimization barrier per call keeps XLA from merging repeated
calls), so a timed call runs K*P (>= --calls) kernels back to back with one dispatch; time =
wall / (K*P) after block_until_ready (the one dispatch per timed call is included: a few %).
Warm-up first, then `--reps` timed calls per op, kernel and reference interleaved; the median is
reported (min in the JSON). Inputs are random normal (never zeros).

Usage (on the GPU machine, after `pip install -e .` with the CUDA extension):
  python benchmarks/bench_mask_kernels.py [--out benchmarks/results] [--reps 15] [--calls 24] [--quick]
Writes <out>/mask_kernels.json and <out>/mask_kernels.md and prints the table last.
"""

from __future__ import annotations

import argparse
import datetime as _dt
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
from jax import lax

from jax_sparse24._src import ffi
from jax_sparse24._src import reference_ops as reference

L2_BYTES = 50 * 2**20


def _shapes(quick: bool):
    if quick:
        return [((4096, 4096), jnp.bfloat16), ((4096, 1536), jnp.float32)]
    return [((8192, 8192), jnp.bfloat16), ((16384, 4096), jnp.bfloat16), ((8192, 3072), jnp.float32)]


def _ops():
    """name -> (kernel_fn(key, x), reference_fn(key, x), bytes_fn(n, s))."""
    from jax_sparse24._src import cuda_mask_ops as cm

    ops = {}
    for axis in (-1, 0):
        tag = "rows" if axis == -1 else "cols"  # groups along the last axis / along axis 0
        ops[f"mask24[{tag}]"] = (
            lambda k, x, a=axis: cm.mask24_cuda(x, a),
            lambda k, x, a=axis: reference.mask24(x, a),
            lambda n, s: n * s + n,
        )
        ops[f"soft_threshold24[{tag}]"] = (
            lambda k, x, a=axis: cm.soft_threshold24_cuda(x, a),
            lambda k, x, a=axis: reference.soft_threshold24(x, a),
            lambda n, s: 2 * n * s + n,
        )
        ops[f"mvue24[{tag}]"] = (
            lambda k, x, a=axis: cm.mvue24_cuda(k, x, a),
            lambda k, x, a=axis: reference.mvue24(k, x, a),
            lambda n, s: 2 * n * s,
        )
    ops["transposable_mask24"] = (
        lambda k, x: cm.transposable_mask24_cuda(x),
        lambda k, x: reference.transposable_mask24(x),
        lambda n, s: n * s + n,
    )
    return ops


def _multi(fn, passes: int):
    """jit of fn over every input set, `passes` times; barriers keep the calls distinct."""

    def run(keys, xs):
        outs = []
        for p in range(passes):
            for i, x in enumerate(xs):
                x = lax.optimization_barrier(x)
                outs.append(fn(keys[p * len(xs) + i], x))
        return outs

    return jax.jit(run)


def _time_once(f, keys, xs) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(f(keys, xs))
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--reps", type=int, default=15, help="timed calls per op (median reported)")
    ap.add_argument(
        "--calls", type=int, default=24, help="op calls per timed jitted call (passes over the input sets)"
    )
    ap.add_argument("--quick", action="store_true", help="smaller shapes (smoke test)")
    ap.add_argument("--only", default="", help="comma-separated substrings of op names to run")
    args = ap.parse_args(argv)

    if not ffi.cuda_kernels_available():
        sys.exit(f"bench_mask_kernels: CUDA kernels unavailable: {ffi.extension_error() or 'no GPU visible'}")
    dev = jax.devices("gpu")[0]
    ops = _ops()
    if args.only:
        keep = [s.strip() for s in args.only.split(",") if s.strip()]
        ops = {k: v for k, v in ops.items() if any(s in k for s in keep)}

    rows = []
    for shape, dtype in _shapes(args.quick):
        n = math.prod(shape)
        s = jnp.dtype(dtype).itemsize
        nsets = max(2, min(8, math.ceil(4 * L2_BYTES / (n * s))))
        rng = np.random.default_rng(1234)
        xs = [jax.device_put(jnp.asarray(rng.standard_normal(shape, np.float32), dtype), dev) for _ in range(nsets)]
        passes = max(1, math.ceil(args.calls / nsets))
        calls = nsets * passes
        key = [jax.device_put(k, dev) for k in jax.random.split(jax.random.key(0), calls)]  # one per call
        # Control: XLA's elementwise negate (read + write once) = this run's bandwidth ceiling.
        all_ops = {"copy (-x)": (lambda k, x: -x, None, lambda n, s: 2 * n * s)}
        all_ops.update(ops)
        for name, (kern, ref, nbytes) in all_ops.items():
            fk = _multi(kern, passes)
            fr = _multi(ref, passes) if ref is not None else None
            for f in (fk, fr):  # compile + warm up
                if f is not None:
                    for _ in range(2):
                        _time_once(f, key, xs)
            tk, tr = [], []
            for _ in range(args.reps):  # interleaved
                tk.append(_time_once(fk, key, xs) / calls)
                if fr is not None:
                    tr.append(_time_once(fr, key, xs) / calls)
            b = nbytes(n, s)
            row = {
                "op": name,
                "shape": list(shape),
                "dtype": jnp.dtype(dtype).name,
                "bytes": b,
                "input_sets": nsets,
                "calls_per_timing": calls,
                "kernel_us_median": statistics.median(tk) * 1e6,
                "kernel_us_min": min(tk) * 1e6,
                "kernel_GBps": b / statistics.median(tk) / 1e9,
            }
            if tr:
                row.update(
                    reference_us_median=statistics.median(tr) * 1e6,
                    reference_us_min=min(tr) * 1e6,
                    reference_GBps=b / statistics.median(tr) / 1e9,
                    speedup=statistics.median(tr) / statistics.median(tk),
                )
            rows.append(row)
            print(
                f"{name:26s} {str(shape):14s} {row['dtype']:9s} kernel {row['kernel_us_median']:9.1f} us "
                f"{row['kernel_GBps']:7.0f} GB/s"
                + (f" | reference {row['reference_us_median']:9.1f} us {row['reference_GBps']:7.0f} GB/s"
                   f" | x{row['speedup']:.1f}" if tr else ""),
                flush=True,
            )
        del xs

    meta = {
        "device": dev.device_kind,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "reps": args.reps,
        "calls_per_timing": args.calls,
        "method": "median of timed jitted calls, each running (input sets x passes) calls on distinct "
        "buffers larger than L2; effective bytes = read + write once",
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mask_kernels.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    lines = [
        f"# 2:4 mask kernels: effective bandwidth ({meta['device']}, jax {meta['jax']}, {meta['date']})",
        "",
        "Effective GB/s = (bytes read + written once) / median time. `copy (-x)` is XLA's own elementwise "
        "kernel on the same bytes: the practical bandwidth ceiling of this run. `[rows]`: groups along the "
        "last axis (contiguous); `[cols]`: groups along axis 0 (strided).",
        "",
        "| op | shape | dtype | kernel µs | kernel GB/s | reference µs | reference GB/s | speedup |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ref = (
            f"{r['reference_us_median']:.1f} | {r['reference_GBps']:.0f} | {r['speedup']:.1f}×"
            if "speedup" in r
            else "– | – | –"
        )
        lines.append(
            f"| {r['op']} | {'×'.join(map(str, r['shape']))} | {r['dtype']} | {r['kernel_us_median']:.1f} | "
            f"{r['kernel_GBps']:.0f} | {ref} |"
        )
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "mask_kernels.md"), "w") as f:
        f.write(table)
    print()
    print(table)


if __name__ == "__main__":
    main()
