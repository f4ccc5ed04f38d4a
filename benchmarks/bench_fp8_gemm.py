#!/usr/bin/env python
"""Benchmark: fp8 2:4 GEMMs against bf16 dense and XLA's fp8 dense, and whole fp8 layers (fwd+bwd).

For each shape (T, I, O) — y (T, O) = x (T, I) · W (I, O), default the LLaMA-style FFN and square
shapes of issue 21 — all in one interleaved measurement per section:

1. ``gemm`` (forward GEMM only):
   * ``bf16 dense`` — ``jnp.dot`` of bfloat16 operands (the reference of every ratio), and
     ``bf16 dense (control)``, a second compilation of the same function (the noise floor);
   * ``fp8 dense e4m3 dot`` — ``lax.dot(q(x), q(W), preferred_element_type=bfloat16)``;
   * ``fp8 dense scaled`` — the dequantize-multiply-dot pattern XLA rewrites to a cuBLASLt fp8
     GEMM with scales (``dot(q(x)·s_x, q(W)·s_w)`` in bfloat16);
   * ``fp8 2:4 gemm`` — our sparse fp8 GEMM on a pre-compressed ``q(W̃)ᵀ`` (GEMM only);
   * ``fp8 2:4 + compress`` — the same plus the per-call fused quantize + mask + compress of W
     (scales given) — what a forward with a per-call weight does;
   * ``bf16 2:4 gemm`` — the 16-bit CUTLASS sparse GEMM on a pre-compressed W̃ᵀ, for reference.
2. ``layer``: ``value_and_grad`` w.r.t. (x, W) of ``mean(y²)`` (a loss that uses the output, so XLA
   keeps the forward GEMM) for ``bf16 dense`` (+ control), ``fp8 dense`` (our current scaling:
   ``jax_sparse24.fp8.fp8_dense_linear``), ``fp8 dense flax`` (``nn.Dense`` with Flax's
   ``Fp8DirectDotGeneralOp``: delayed scaling, its amax histories and scales in the
   ``_overwrite_with_gradient`` collection, differentiated and passed along as Flax's train state
   does), ``bf16 2:4`` (``sparse24_linear``, auto) and ``fp8 2:4`` (``sparse24_linear(fp8=True)``).

Ratios are ``bf16 dense`` time / variant time (> 1: faster), TFLOP/s count 2·T·I·O per GEMM (6·T·I·O
per layer fwd+bwd; a 2:4 GEMM counted as dense). Method as ``bench_spmm.py``: R input sets per call
(random normal, never zero, together over the L2), variants interleaved in rotating order per
trial, medians over trials after a warm-up. Variants that need the fp8 kernels are left out where
they are not built (a CPU).

    python benchmarks/bench_fp8_gemm.py                  # H100: the five shapes (a few minutes)
    python benchmarks/bench_fp8_gemm.py --smoke          # CPU: a tiny shape, 2 trials (the test)

Writes DIR/fp8_gemm.json and DIR/fp8_gemm.md (--out DIR, default benchmarks/results; --name).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from bench_spmm import measure, write_json, write_results  # noqa: E402  (interleaved medians, same method)

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24._src import fp8_math as f8  # noqa: E402

SHAPES = [(8192, 4096, 11008), (16384, 4096, 11008), (8192, 8192, 8192), (16384, 4096, 4096), (8192, 2048, 5632)]
SMOKE_SHAPES = [(64, 64, 32)]
L2_BYTES = 50 * 2**20
BASE = "bf16 dense"


def _fp8_kernels() -> bool:
    from jax_sparse24._src import cuda_fp8_ops as cf

    return s24.cuda_kernels_available() and cf.fp8_kernels_built()


def _bf16_kernels(m, n, k) -> bool:
    from jax_sparse24._src import cuda_spmm_ops as cs

    return s24.cuda_kernels_available() and cs.cutlass_supports(m, n, k, jnp.bfloat16)


def input_sets(t, i, o, r, seed=0):
    """R sets of (x bf16 (T, I), W bf16 (I, O), transposable mask, fp8 operands and scales)."""
    sets = []
    for j in range(r):
        kx, kw = jax.random.split(jax.random.key(seed + j))
        x = jax.random.normal(kx, (t, i), jnp.float32).astype(jnp.bfloat16)
        w = (jax.random.normal(kw, (i, o), jnp.float32) * 0.02).astype(jnp.bfloat16)
        w = jnp.where(w == 0, jnp.bfloat16(0.01), w)  # never zero
        mask = s24.transposable_mask24(w)
        s_x, s_w = f8.current_scale(x), f8.current_scale(jnp.where(mask, w, 0))
        sw_dense = f8.current_scale(w)
        sets.append(dict(x=x, w=w, mask=mask, s_x=s_x, s_w=s_w, qx=f8.quantize(x, s_x), qw=f8.quantize(w, sw_dense),
                         sw_dense=sw_dense))
    return sets


def _many(fn):
    """jit of ``fn`` applied to each of the R input sets (one call = R ops)."""
    return jax.jit(lambda *cols: tuple(fn(*a) for a in zip(*cols)))


def gemm_variants(t, i, o, sets):
    col = lambda key: tuple(s[key] for s in sets)  # noqa: E731
    dense = lambda x, w: jnp.dot(x, w)  # noqa: E731
    v = {BASE: (_many(dense), (col("x"), col("w"))),
         f"{BASE} (control)": (_many(lambda x, w: jnp.dot(x, w)), (col("x"), col("w"))),
         "fp8 dense e4m3 dot": (_many(lambda qx, qw: jax.lax.dot(qx, qw, preferred_element_type=jnp.bfloat16)),
                                (col("qx"), col("qw"))),
         "fp8 dense scaled": (_many(lambda qx, qw, sx, sw: jnp.dot(qx.astype(jnp.bfloat16) * sx.astype(jnp.bfloat16),
                                                                    qw.astype(jnp.bfloat16) * sw.astype(jnp.bfloat16))),
                              (col("qx"), col("qw"), col("s_x"), col("sw_dense")))}
    if _fp8_kernels() and s24.linear_plan(t, i, o, fp8=True, backend="auto")["forward"] == "cutlass (fp8)":
        from jax_sparse24._src import cuda_fp8_ops as cf

        comp = [jax.jit(lambda w, m, s: cf.fp8_masked_compress(w, m, s, transposed=True))(s["w"], s["mask"], s["s_w"])
                for s in sets]
        vals, metas = tuple(c[0] for c in comp), tuple(c[1] for c in comp)
        alphas = tuple(s["s_x"] * s["s_w"] for s in sets)
        qxs = tuple(f8.quantize(s["x"], s["s_x"]) for s in sets)
        v["fp8 2:4 gemm"] = (_many(lambda va, me, qx, a: cf.cutlass_spmm_fp8(va, me, qx, a, m=o, k=i)),
                             (vals, metas, qxs, alphas))

        def with_compress(w, m, qx, sw, a):
            va, me = cf.fp8_masked_compress(w, m, sw, transposed=True)
            return cf.cutlass_spmm_fp8(va, me, qx, a, m=o, k=i)

        v["fp8 2:4 + compress"] = (_many(with_compress), (col("w"), col("mask"), qxs, col("s_w"), alphas))
    if _bf16_kernels(o, t, i):
        from jax_sparse24._src import cuda_spmm_ops as cs

        comp = [jax.jit(lambda w, m: cs.cutlass_compress(jnp.where(m, w, 0).T))(s["w"], s["mask"]) for s in sets]
        v["bf16 2:4 gemm"] = (_many(lambda va, me, x: cs.cutlass_spmm(va, me, x, m=o, k=i)),
                              (tuple(c[0] for c in comp), tuple(c[1] for c in comp), col("x")))
    return v


def _flax_fp8_dense(o):
    """value_and_grad of the loss through ``nn.Dense(dot_general_cls=Fp8DirectDotGeneralOp)``: the
    fp8 state (``_overwrite_with_gradient``) is differentiated; its "gradient" is the new state."""
    from flax import linen as nn
    from flax.linen import fp8_ops

    model = nn.Dense(o, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                     dot_general_cls=fp8_ops.Fp8DirectDotGeneralOp)

    def init(x):
        return model.init(jax.random.key(0), x)

    def step(x, variables):
        def loss(x, variables):
            return jnp.mean(model.apply(variables, x).astype(jnp.float32) ** 2)

        return jax.value_and_grad(loss, argnums=(0, 1))(x, variables)

    return init, step


def layer_variants(t, i, o, sets):
    col = lambda key: tuple(s[key] for s in sets)  # noqa: E731

    def vg(f):
        def run(x, w, m):
            return jax.value_and_grad(lambda x, w: jnp.mean(f(x, w, m).astype(jnp.float32) ** 2), argnums=(0, 1))(x, w)
        return _many(run)

    args = (col("x"), col("w"), col("mask"))
    v = {BASE: (vg(lambda x, w, m: x @ w), args),
         f"{BASE} (control)": (vg(lambda x, w, m: x @ w), args),
         "fp8 dense": (vg(lambda x, w, m: s24.fp8.fp8_dense_linear(x, w)), args),
         "bf16 2:4": (vg(lambda x, w, m: s24.sparse24_linear(x, w, m, transposable=True, check_mask=False)), args),
         "fp8 2:4": (vg(lambda x, w, m: s24.sparse24_linear(x, w, m, transposable=True, fp8=True,
                                                            check_mask=False)), args)}  # GEMMs only: masks made here
    init, step = _flax_fp8_dense(o)
    fvars = []
    for s in sets:
        variables = init(s["x"])
        variables = {**variables, "params": {"kernel": s["w"]}}
        fvars.append(variables)
    v["fp8 dense flax"] = (_many(step), (col("x"), tuple(fvars)))
    return v


def run_shape(t, i, o, r, trials, sections, log):
    sets = input_sets(t, i, o, r)
    rec = dict(T=t, I=i, O=o, r=r, trials=trials)
    for section in sections:
        variants = (gemm_variants if section == "gemm" else layer_variants)(t, i, o, sets)
        med, samples = measure(variants, r, trials)
        flops = (2 if section == "gemm" else 6) * t * i * o
        rec[section] = {name: dict(seconds=sec, tflops=flops / sec / 1e12, vs_bf16_dense=med[BASE] / sec,
                                   samples=samples[name]) for name, sec in med.items()}
        log(f"  {section}: " + ", ".join(f"{n} {med[BASE] / s_:.2f}x" for n, s_ in med.items()))
    return rec


def to_markdown(meta, records, sections):
    lines = [f"# fp8 2:4 GEMMs vs bf16 / fp8 dense ({meta['device']}, jax {meta['jax']})", "",
             f"Command: `{meta['command']}`; fp8 kernels: {meta['fp8_kernels']}. Ratio = bf16 dense time / variant "
             "time (> 1 faster); TFLOP/s count a 2:4 GEMM as dense (2·T·I·O; 6·T·I·O per layer fwd+bwd). Medians of "
             f"interleaved trials; `{BASE} (control)` is a second compilation of the baseline (the noise floor).", ""]
    for section in sections:
        names = []
        for r in records:
            names += [n for n in r[section] if n not in names]
        title = "Forward GEMM" if section == "gemm" else "Layer value_and_grad (x, W) of mean(y²)"
        lines += [f"## {title}", "", "| T, I, O | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for r in records:
            cells = []
            for n in names:
                e = r[section].get(n)
                cells.append("-" if e is None else f"{e['vs_bf16_dense']:.2f}x ({e['tflops']:.3g})")
            lines.append(f"| {r['T']}, {r['I']}, {r['O']} | " + " | ".join(cells) + " |")
        lines += ["", "Cells: ratio vs bf16 dense (TFLOP/s).", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=None, help="T,I,O;T,I,O;... (default: the five of issue 21)")
    ap.add_argument("--sections", nargs="+", choices=("gemm", "layer"), default=["gemm", "layer"])
    ap.add_argument("--trials", type=int, default=None, help="interleaved trials (default 7; smoke 2)")
    ap.add_argument("--smoke", action="store_true", help="a tiny shape, 2 trials (runs on a CPU; for the test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="fp8_gemm", help="result file name (without extension)")
    a = ap.parse_args(argv)
    if a.shapes:
        try:
            shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";") if s]
            assert shapes and all(len(s) == 3 and min(s) > 0 for s in shapes)
        except (ValueError, AssertionError):
            print(f"bench_fp8_gemm.py: error: --shapes must be T,I,O;T,I,O;... positive ints, got {a.shapes!r}",
                  file=sys.stderr)
            return 2
    else:
        shapes = SMOKE_SHAPES if a.smoke else SHAPES
    bad = [s for s in shapes if s[1] % 4 or s[2] % 4]
    if bad:
        print(f"bench_fp8_gemm.py: error: I and O must be multiples of 4 (2:4, transposable masks), got {bad}",
              file=sys.stderr)
        return 2
    trials = a.trials or (2 if a.smoke else 7)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    meta = dict(device=f"{jax.default_backend()}: {jax.devices()[0].device_kind}", jax=jax.__version__,
                host=platform.node(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                fp8_kernels=bool(_fp8_kernels()), cuda_kernels=bool(s24.cuda_kernels_available()),
                command="python benchmarks/bench_fp8_gemm.py " + " ".join(sys.argv[1:] if argv is None else argv),
                sections=a.sections, trials=trials)
    records = []
    for t, i, o in shapes:
        r = 1 if a.smoke else max(2, min(4, math.ceil(L2_BYTES / (2 * (t * i + i * o + t * o)))))
        log(f"T={t} I={i} O={o}: {r} input sets")
        records.append(run_shape(t, i, o, r, trials, a.sections, log))
        write_json(a.out, a.name, meta, records)  # after every shape: a run cut short keeps what it measured
    write_results(a.out, a.name, meta, records, to_markdown(meta, records, a.sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
