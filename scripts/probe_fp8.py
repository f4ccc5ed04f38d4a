"""Probe of the fp8 2:4 kernels on a Hopper GPU, through their thin wrappers (cuda_fp8_ops,
cuda_spmm_ops.cutlass_compress) and the reference quantization (_src/fp8_math.py): correctness of the fused quantize+compress against CUTLASS's compressor applied
to the quantized operand (bit for bit), of the fp8 sparse GEMM against an f32 reference, and
timings (GEMM only, in one jitted program per variant, interleaved rounds) against bf16 dense and
XLA's fp8 dense dot at training shapes.

    python scripts/probe_fp8.py [--out DIR] [--quick] [--speed-only] [--configs default]
                                [--shapes T,I,O;... | --step llama-7b]

``fp8 dense (qdq)`` is the pattern Flax's
fp8 layer lowers to: quantize, dequantize in bfloat16, dot — which XLA may rewrite into cuBLASLt's
scaled fp8 GEMM (the line ``qdq lowers to custom calls`` lists what it compiled to).

``--step SIZE`` times every fp8 configuration on the three GEMMs of each linear layer of the example's
SIZE at 16384 tokens, written as forward GEMMs (T, I, O) = (tokens, in, out): the forward
(16384, in, out), the input gradient (16384, out, in) and the MVUE weight gradient (in, 16384, out) —
the data for choosing the default configuration per shape (``CutlassDefaultConfigFp8``).

Prints one line per check; writes probe_fp8.json to --out. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24._src import cuda_fp8_ops as cf  # noqa: E402
from jax_sparse24._src import cuda_spmm_ops as cs  # noqa: E402
from jax_sparse24._src import ffi  # noqa: E402
from jax_sparse24._src.fp8_math import quantize  # noqa: E402

FAIL = []


def check(ok: bool, what: str):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAIL.append(what)


def fused(x, mask, scale, transposed):
    return cf.fp8_masked_compress(x, mask, scale, transposed=transposed)


def spmm_fp8(values, meta, b, alpha, m, k, config=-1):
    return cf.cutlass_spmm_fp8(values, meta, b, alpha, m=m, k=k, config=config)


def mask24_along(w, axis):
    """Top-2 |w| of each 4 along ``axis`` (the library's mask24), as numpy bool."""
    return np.asarray(s24.mask24(jnp.asarray(w), axis=axis))


def correctness(rng, quick):
    cases = [(128, 256), (200, 384), (96, 160), (1024, 768), (4096, 1024)] if quick else \
        [(128, 256), (200, 384), (96, 160), (1024, 768), (768, 3072), (4096, 1024), (136, 4128)]
    for r, c in cases:
        for transposed in (False, True):
            m, k = (c, r) if transposed else (r, c)
            if m % 8 or k % 32:
                continue
            for dt in (jnp.bfloat16, jnp.float32):
                x = jnp.asarray(rng.standard_normal((r, c)).astype(np.float32) * 3.0).astype(dt)
                mk = jnp.asarray(mask24_along(np.asarray(x, np.float32), 0 if transposed else 1))
                scale = jnp.max(jnp.abs(jnp.where(mk, x, 0).astype(jnp.float32))) / 448.0
                got = jax.jit(fused, static_argnums=3)(x, mk, scale, transposed)
                # the reference quantization on XLA's CPU backend: its GPU lowering of the same op is not
                # bit-exact (scripts/check_xla_quantize.py; the GPU tests use the CPU reference too)
                cpu_dev = jax.devices("cpu")[0]
                qc = np.asarray(jax.jit(quantize)(jax.device_put(jnp.where(mk, x, 0), cpu_dev),
                                                  jax.device_put(scale, cpu_dev)))
                want = jax.jit(cs.cutlass_compress)(jnp.asarray(qc.T if transposed else qc))
                vs_ok = np.array_equal(np.asarray(got[0]).view(np.uint8), np.asarray(want[0]).view(np.uint8))
                me_ok = np.array_equal(np.asarray(got[1]), np.asarray(want[1]))
                detail = ""
                if not vs_ok:
                    gv, wv = np.asarray(got[0]).view(np.uint8), np.asarray(want[0]).view(np.uint8)
                    bad = np.argwhere(gv != wv)
                    detail = (f"; {len(bad)} value bytes differ; first {bad[:3].tolist()} kernel "
                              f"{gv[tuple(bad[0])]:#x} reference {wv[tuple(bad[0])]:#x}")
                check(vs_ok and me_ok, f"fused fp8 compress == cutlass_compress(quantize): x {r}x{c} {jnp.dtype(dt).name} "
                      f"transposed={transposed} (values {vs_ok}, meta {me_ok}){detail}")
    # GEMM against the f32 reference (every compiled configuration).
    names = cf.cutlass_configs_fp8()
    for (n, k, m) in ([(256, 256, 128), (512, 768, 3072)] if quick else
                      [(256, 256, 128), (512, 768, 3072), (1024, 4096, 1024), (2048, 1024, 4096), (304, 512, 136)]):
        if m % 8 or n % 16 or k % 32:
            continue
        w = rng.standard_normal((k, m)).astype(np.float32)   # (I, O): A = W~^T (m, k)
        mk = mask24_along(w, 0)
        x = rng.standard_normal((n, k)).astype(np.float32)
        sw = np.float32(np.abs(w * mk).max() / 448.0)
        sx = np.float32(np.abs(x).max() / 448.0)
        vals, meta = fused(jnp.asarray(w, jnp.bfloat16), jnp.asarray(mk), jnp.float32(sw), True)
        xq = quantize(jnp.asarray(x, jnp.bfloat16), jnp.float32(sx))
        alpha = jnp.float32(sx) * jnp.float32(sw)
        wq = quantize(jnp.asarray(w * mk, jnp.bfloat16), jnp.float32(sw)).astype(jnp.float32)
        ref = np.asarray(jnp.dot(xq.astype(jnp.float32), wq, precision="highest") * alpha)
        for cfg, name in enumerate(names):
            y = np.asarray(jax.jit(spmm_fp8, static_argnums=(4, 5, 6))(vals, meta, xq, alpha, m, k, cfg), np.float32)
            err = np.abs(y - ref).max() / (np.abs(ref).max() + 1e-12)
            check(err < 2e-2, f"fp8 spmm {name}: (n, k, m) = ({n}, {k}, {m}) max rel err {err:.2e}")


def timed(fns, args_list, rounds, iters):
    """Median seconds per call of each fn (interleaved rounds)."""
    jitted = [jax.jit(f) for f in fns]
    for f, a in zip(jitted, args_list):
        jax.block_until_ready(f(*a))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, (f, a) in enumerate(zip(jitted, args_list)):
            jax.block_until_ready(f(*a))
            t0 = time.perf_counter()
            for _ in range(iters):
                out = f(*a)
            jax.block_until_ready(out)
            times[i].append((time.perf_counter() - t0) / iters)
    return [statistics.median(t) for t in times]


DEFAULT_SHAPES = [(8192, 4096, 11008), (16384, 4096, 11008), (8192, 8192, 8192), (16384, 11008, 4096),
                  (8192, 2048, 5632), (16384, 768, 3072)]


def step_shapes(size: str, tokens: int = 16384):
    """The forward-form (T, I, O) of the forward, input-gradient and weight-gradient GEMMs of each
    distinct linear layer (in x out) of the example's model ``size``."""
    sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p) for p in ("benchmarks/harness", "examples")]
    from model import SIZES, GPTConfig  # noqa: E402

    if size not in SIZES:
        raise SystemExit(f"--step: unknown size {size!r} (one of {sorted(SIZES)})")
    cfg = GPTConfig(**{k: v for k, v in SIZES[size].items() if k in GPTConfig.__dataclass_fields__})
    d, f = cfg.n_embd, cfg.ffn_hidden
    layers = [(d, 3 * d), (d, d), (d, 2 * f if cfg.ffn == "swiglu" else f), (f, d)]  # qkv, proj, fc (gated), down
    out = []
    for i, o in layers:
        for shape in ((tokens, i, o), (tokens, o, i), (i, tokens, o)):
            if shape not in out:
                out.append(shape)
    return out


def parse_shapes(text: str):
    try:
        shapes = [tuple(int(v) for v in part.split(",")) for part in text.split(";") if part.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"--shapes wants T,I,O;T,I,O;... (positive ints), got {text!r}")
    return shapes


def qdq_dot(xq, wq, sx, sw):
    """Flax's fp8 pattern: dequantize both operands in bfloat16, then dot (XLA: cuBLASLt's scaled fp8 GEMM)."""
    return jnp.dot(xq.astype(jnp.bfloat16) * sx.astype(jnp.bfloat16), wq.astype(jnp.bfloat16) * sw.astype(jnp.bfloat16),
                   preferred_element_type=jnp.bfloat16)


def speed(rng, quick, results, shapes=None, on_row=None, configs="all"):
    shp = list(shapes or DEFAULT_SHAPES)
    if quick:
        shp = shp[:2]
    names = cf.cutlass_configs_fp8()
    printed_qdq = False
    for (t, i, o) in shp:
        x = jnp.asarray(rng.standard_normal((t, i)), jnp.bfloat16)
        w = rng.standard_normal((i, o)).astype(np.float32)
        mk = mask24_along(w, 0)
        wb = jnp.asarray(w, jnp.bfloat16)
        mkj = jnp.asarray(mk)
        sw = jnp.max(jnp.abs(jnp.where(mkj, wb, 0).astype(jnp.float32))) / 448.0
        sx = jnp.max(jnp.abs(x.astype(jnp.float32))) / 448.0
        xq = quantize(x, sx)
        wq = quantize(wb, sw)
        vals, meta = jax.jit(fused, static_argnums=3)(wb, mkj, sw, True)
        alpha = sx * sw
        dense = lambda x, w: jnp.dot(x, w)  # noqa: E731
        fp8_dense = lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.bfloat16)  # noqa: E731
        fns = [dense, dense, fp8_dense, qdq_dot]
        args = [(x, wb), (x, wb), (xq, wq), (xq, wq, sx, sw)]
        labels = ["bf16 dense", "bf16 dense (control)", "fp8 dense (XLA)", "fp8 dense (qdq)"]
        if not printed_qdq:
            hlo = jax.jit(qdq_dot).lower(xq, wq, sx, sw).compile().as_text()
            import re

            print("qdq lowers to custom calls:", sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo))),
                  "; fusions:", len(re.findall(r"^\s*\S+ = \S+ fusion\(", hlo, re.M)), flush=True)
            printed_qdq = True
        cfgs = list(enumerate(names)) if configs == "all" else [(-1, "default")]
        for cfg, name in cfgs:
            fns.append(lambda v, me, b, a, cfg=cfg: spmm_fp8(v, me, b, a, o, i, cfg))
            args.append((vals, meta, xq, alpha))
            labels.append(f"fp8 2:4 {name}")
        fns.append(lambda wb, mk, s: fused(wb, mk, s, True))
        args.append((wb, mkj, sw))
        labels.append("fused quantize+compress (weight)")
        ts = timed(fns, args, rounds=3 if quick else 5, iters=10)
        base = ts[0]
        flops = 2.0 * t * i * o
        row = {"shape": [t, i, o]}
        for lab, tt in zip(labels, ts):
            row[lab] = {"ms": tt * 1e3, "vs_bf16_dense": base / tt, "tflops": flops / tt / 1e12}
        nbytes = i * o * 2 + i * o + i * o // 8 + i * o // 2
        row["fused quantize+compress (weight)"]["gbps"] = nbytes / ts[-1] / 1e9
        results.append(row)
        if on_row is not None:
            on_row(results)
        print(f"({t}, {i}, {o}): " + ", ".join(f"{lab} {tt*1e3:.3f} ms ({base/tt:.2f}x)" for lab, tt in zip(labels, ts)),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--correctness-only", action="store_true")
    ap.add_argument("--speed-only", action="store_true", help="skip the correctness checks")
    ap.add_argument("--configs", choices=("all", "default"), default="all",
                    help="time every compiled CUTLASS fp8 configuration, or only the planner's default")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--shapes", type=parse_shapes, default=None, help="T,I,O;... forward-form GEMM shapes to time")
    which.add_argument("--step", default=None, metavar="SIZE",
                       help="the three GEMMs of each linear layer of the example's SIZE (e.g. llama-7b) at 16384 "
                            "tokens (attention projections included, 2:4 or not in that size's default)")
    args = ap.parse_args()
    shapes = step_shapes(args.step) if args.step else args.shapes
    if not ffi.cuda_kernels_available():
        print("no CUDA kernels:", ffi.extension_error())
        return 2
    print("fp8 configurations:", cf.cutlass_configs_fp8())
    rng = np.random.default_rng(0)
    os.makedirs(args.out, exist_ok=True)

    def save(results):  # after every shape too: a run cut off by a time limit keeps what it measured
        with open(os.path.join(args.out, "probe_fp8.json"), "w") as f:
            json.dump({"device": str(jax.devices()[0].device_kind), "failures": FAIL, "speed": results}, f, indent=1)

    results = []
    if not args.speed_only:
        correctness(rng, args.quick)
    if not args.correctness_only:
        speed(rng, args.quick, results, shapes, on_row=save, configs=args.configs)
    save(results)
    print(f"{len(FAIL)} failures")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
