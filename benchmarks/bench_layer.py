"""Benchmark: fused 2:4 compressors, the three GEMMs of a layer per backend, and a Sparse24Dense FFN
(forward + backward) per backend and recipe against nn.Dense — all ratios measured in the same run.

Sections (FFN shapes of GPT-2-like models, T = 8192 tokens, d in --dims, default 768 1024 1280):

1. ``compress``: effective GB/s (bytes of dense input read + compressed output written) of the fused
   one-pass compressors — prune+compress, masked compress of W̃ᵀ, of W̃ᵀ and W̃ together, MVUE of
   ∇y (T, O) + compress of MVUE(∇y)ᵀ, S-STE soft threshold × β + compress — next to CUTLASS's generic
   compressor and cuSPARSELt's ``cusparseLtSpMMACompress`` of the same operand.
2. ``gemm``: for the up (d→4d) and down (4d→d) layers, the forward ``y = x·W̃``, input gradient
   ``∇x = ∇y·W̃ᵀ`` and MVUE weight gradient ``∇W = xᵀ·MVUE(∇y)``: XLA dense (the faster of
   ``x@w`` and ``x@(w*mask)``), CUTLASS and cuSPARSELt (its operand written by our fused compressors
   in its layout, as ``backend="cusparselt"`` runs), GEMM only (operand pre-compressed) and with
   the per-call compression (what ``sparse24_linear`` runs: weights per call, MVUE(∇y) always).
3. ``layer``: FFN ``down(gelu(up(x)))`` value-and-grad w.r.t. params and x, bf16 compute / f32 params:
   ``nn.Dense`` vs ``Sparse24Dense(method=recipe, backend=backend)`` for recipes srste / ste / soft,
   backends dense / cutlass / cusparselt (MVUE weight gradient on), plus a separately compiled
   ``nn.Dense`` control (noise floor). speedup = nn.Dense time / variant time.
4. ``prepare``: the weight work of a whole GPT-2 small per optimizer step (12 layers × attention qkv
   768×2304 and projection 768×768, FFN 768×3072 and 3072×768: 48 weights, transposable masks),
   one launch per layer vs all layers batched (``masked_compress_many``): the compressors alone
   (both operands, CUTLASS's and cuSPARSELt's layouts; W̃ᵀ only) and ``nn.prepare`` of the model
   (``backend="cutlass"`` layers, f32 params, bf16 compute; ``batch=False`` vs ``batch=True``), in µs
   per preparation. Not part of the default sections.

Method (device tool METHOD.md): every timed call runs its op once on each of R input sets (together
over the 50 MB L2), calls are enqueued back to back then synchronised, variants interleaved within
each trial, medians over trials after a warm-up; inputs random normal, never zeros.

    python benchmarks/bench_layer.py                 # everything (several minutes on an H100)
    python benchmarks/bench_layer.py --quick         # d = 1280 only, fewer variants and trials
    python benchmarks/bench_layer.py --sections compress gemm
    python benchmarks/bench_layer.py --sections prepare --name prepare_gpt2   # batched vs per-layer prepare

Writes DIR/layer.json and DIR/layer.md (--out DIR, default benchmarks/results) and prints the tables.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(HERE).parent
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from bench_spmm import measure, write_json, write_results  # noqa: E402  (interleaved medians, same method)

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24._src import cuda_compress_ops as cc  # noqa: E402
from jax_sparse24._src import cuda_cusparselt_ops as lt  # noqa: E402
from jax_sparse24._src import cuda_mask_ops as cm  # noqa: E402
from jax_sparse24._src import cuda_spmm_ops as cs  # noqa: E402
from jax_sparse24._src import ffi as _ffi  # noqa: E402

L2_BYTES = 50 * 2**20
TOKENS = 8192
DTYPE = jnp.bfloat16


def n_sets(bytes_per_set: int) -> int:
    return int(min(8, max(3, math.ceil(4 * L2_BYTES / max(bytes_per_set, 1)))))


def _nbytes(*arrays) -> int:
    return int(sum(a.size * jnp.dtype(a.dtype).itemsize for a in jax.tree_util.tree_leaves(arrays)))


def _rand(key, shape, scale=1.0):
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(DTYPE)


#: ``--shapes I:O ...``: the layers the compress and gemm sections measure instead of the FFNs of
#: ``--dims`` (e.g. a LLaMA block's fused gate+up, down, fused qkv and output projections).
SHAPES = None


def _ffn_layers(d):
    """(name, I, O) of the FFN's two GEMMs."""
    return [("up", d, 4 * d), ("down", 4 * d, d)]


def _layers(dims):
    """(d, name, I, O) of the layers the compress and gemm sections measure."""
    if SHAPES:
        return [(i, f"{i}x{o}", i, o) for i, o in SHAPES]
    return [(d, lname, i, o) for d in dims for lname, i, o in _ffn_layers(d)]


def parse_shape(text: str) -> tuple[int, int]:
    """``"I:O"`` -> (I, O), both positive multiples of 4."""
    try:
        i, o = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is I:O (e.g. 4096:11008), got {text!r}") from None
    if i < 4 or o < 4 or i % 4 or o % 4:
        raise argparse.ArgumentTypeError(f"I and O must be positive multiples of 4, got {text!r}")
    return i, o


# ------------------------------------------------------------------------------------------------
# 1. compressors


def bench_compress(dims, trials):
    for d, lname, i, o in _layers(dims):
        key = jax.random.PRNGKey(i * 7 + o)
        r = n_sets(i * o * 2 * 3)
        ws, masks, gs = [], [], []
        for j in range(r):
            k1, k2, key = jax.random.split(key, 3)
            w = _rand(k1, (i, o), 1 / math.sqrt(i))
            ws.append(w)
            masks.append(cm.transposable_mask24_cuda(w))
            gs.append(_rand(k2, (TOKENS, o)))
        ws, masks, gs = tuple(ws), tuple(masks), tuple(gs)
        wms = tuple(jnp.where(m, w, jnp.zeros((), DTYPE)) for w, m in zip(ws, masks))
        wmts = tuple(wm.T for wm in wms)
        mkey = jax.random.key(0)
        jax.block_until_ready((ws, masks, gs, wmts))
        comp_w = cc.masked_compress(ws[0], masks[0], transposed=True)
        comp_g = cc.mvue24_compress(mkey, gs[0], transposed=True)
        cw = _nbytes(comp_w)
        cg = _nbytes(comp_g)
        wb, mb, gb = _nbytes(ws[0]), masks[0].size, _nbytes(gs[0])
        variants = {
            "masked_compress (W, M -> W~^T)": (
                jax.jit(lambda ws, ms: tuple(cc.masked_compress(w, m, transposed=True) for w, m in zip(ws, ms))),
                (ws, masks), wb + mb + cw),
            "masked_compress_both (W, M -> W~^T, W~)": (
                jax.jit(lambda ws, ms: tuple(cc.masked_compress_both(w, m) for w, m in zip(ws, ms))),
                (ws, masks), wb + mb + 2 * cw),
            "mvue24_compress (dy -> MVUE(dy)^T)": (
                jax.jit(lambda gs: tuple(cc.mvue24_compress(mkey, g, transposed=True) for g in gs)), (gs,),
                gb + cg),
            "cutlass_compress (generic, W~^T given)": (
                jax.jit(lambda a: tuple(cs.cutlass_compress(x) for x in a)), (wmts,), wb + cw),
            "mvue24_cuda (dense MVUE only)": (
                jax.jit(lambda gs: tuple(cm.mvue24_cuda(mkey, g, axis=0) for g in gs)), (gs,), 2 * gb),
        }
        if lt.cusparselt_available():
            variants["mvue24_compress, cuSPARSELt layout"] = (
                jax.jit(lambda gs: tuple(cc.mvue24_compress(mkey, g, transposed=True, layout="cusparselt")
                                         for g in gs)), (gs,), gb + cg)
            variants["masked_compress, cuSPARSELt layout"] = (
                jax.jit(lambda ws, ms: tuple(cc.masked_compress(w, m, transposed=True, layout="cusparselt")
                                             for w, m in zip(ws, ms))), (ws, masks), wb + mb + cw)
        if lt.cusparselt_supports(o, TOKENS, i, DTYPE):
            kw = dict(m=o, n=TOKENS, k=i, a_layout=lt.A_KM, b_layout=lt.B_NK)
            lt_bytes = lt.cusparselt_compressed_size(o, TOKENS, i, DTYPE, lt.A_KM, lt.B_NK)
            variants["cusparseLtSpMMACompress (W~ given)"] = (
                jax.jit(lambda a: tuple(lt.cusparselt_compress(x, **kw) for x in a)), (wms,), wb + lt_bytes)
        fns = {n: (f, a) for n, (f, a, _) in variants.items()}
        med, _ = measure(fns, r, trials)
        # the GPU's own time per call (the r calls of one traced program), without the host's
        # dispatch of the program that the wall-clock column spreads over its r calls
        device = _device_times({n: fns[n] for n in med}, repeats=1)
        for name, (_, _, nbytes) in variants.items():
            if name not in med:
                continue
            dev = device[name]
            rec = dict(section="compress", d=d, layer=lname, I=i, O=o, T=TOKENS, op=name,
                       ms=med[name] * 1e3, gbs=nbytes / med[name] / 1e9, bytes=nbytes, calls_per_program=r,
                       kernel_us=dev["kernel_us"] / r, span_us=dev["span_us"] / r,
                       kernel_gbs=nbytes / (dev["kernel_us"] / r) / 1e3 if dev["kernel_us"] else None)
            yield rec
            print(f"compress d={d} {lname} {name}: {rec['ms']:.4f} ms, {rec['gbs']:.0f} GB/s; kernel "
                  f"{rec['kernel_us']:.1f} us per call", flush=True)


# ------------------------------------------------------------------------------------------------
# 2. the three GEMMs


def bench_gemm(dims, trials, backends):
    t = TOKENS
    for d, lname, i, o in _layers(dims):
        key = jax.random.PRNGKey(1000 + i + o)
        r = n_sets((t * i + t * o + i * o) * 2)
        sets = []
        for j in range(r):
            k1, k2, k3, key = jax.random.split(key, 4)
            w = _rand(k1, (i, o), 1 / math.sqrt(i))
            m = cm.transposable_mask24_cuda(w)
            sets.append(dict(x=_rand(k2, (t, i)), g=_rand(k3, (t, o)), w=w, m=m,
                             wm=jnp.where(m, w, jnp.zeros((), DTYPE))))
        jax.block_until_ready(sets)
        X = tuple(s["x"] for s in sets)
        G = tuple(s["g"] for s in sets)
        W = tuple(s["w"] for s in sets)
        M = tuple(s["m"] for s in sets)
        WM = tuple(s["wm"] for s in sets)
        mkey = jax.random.key(7)
        tp = t + (-t) % 16
        v = {}
        # dense (XLA)
        v["fwd dense x@w"] = (jax.jit(lambda X, W: tuple(x @ w for x, w in zip(X, W))), (X, W))
        v["fwd dense x@(w*m)"] = (jax.jit(lambda X, W, M: tuple(x @ jnp.where(m, w, 0) for x, w, m in zip(X, W, M))),
                                  (X, W, M))
        v["fwd dense control"] = (jax.jit(lambda X, W: tuple(jnp.matmul(x, w) for x, w in zip(X, W))), (X, W))
        v["dx dense g@w.T"] = (jax.jit(lambda G, W: tuple(g @ w.T for g, w in zip(G, W))), (G, W))
        v["dw dense x.T@g"] = (jax.jit(lambda X, G: tuple(x.T @ g for x, g in zip(X, G))), (X, G))
        v["dw mvue24 + dense"] = (jax.jit(lambda X, G: tuple(
            x.T @ cm.mvue24_cuda(mkey, g, axis=0) for x, g in zip(X, G))), (X, G))
        if "cutlass" in backends and cs.cutlass_supports(o, t, i, DTYPE):
            ct = tuple(cc.masked_compress(w, m, transposed=True) for w, m in zip(W, M))
            cd = tuple(cc.masked_compress(w, m, transposed=False) for w, m in zip(W, M))
            v["fwd cutlass gemm"] = (jax.jit(lambda C, X: tuple(
                cs.cutlass_spmm(c[0], c[1], x, m=o, k=i) for c, x in zip(C, X))), (ct, X))
            v["fwd cutlass + fused compress"] = (jax.jit(lambda W, M, X: tuple(
                cs.cutlass_spmm(*cc.masked_compress(w, m, transposed=True), x, m=o, k=i)
                for w, m, x in zip(W, M, X))), (W, M, X))
            v["dx cutlass gemm"] = (jax.jit(lambda C, G: tuple(
                cs.cutlass_spmm(c[0], c[1], g, m=i, k=o) for c, g in zip(C, G))), (cd, G))
            v["dx cutlass + fused compress"] = (jax.jit(lambda W, M, G: tuple(
                cs.cutlass_spmm(*cc.masked_compress(w, m, transposed=False), g, m=i, k=o)
                for w, m, g in zip(W, M, G))), (W, M, G))
            if cs.cutlass_supports_kn(o, i, tp, DTYPE):
                cg = tuple(cc.mvue24_compress(mkey, g, transposed=True) for g in G)
                v["dw cutlass kn gemm"] = (jax.jit(lambda C, X: tuple(
                    cs.cutlass_spmm_kn(c[0], c[1], x, m=o, k=t) for c, x in zip(C, X))), (cg, X))
                for c, cname in enumerate(cs.cutlass_configs_kn()):  # sweep, for the auto table
                    v[f"dw cutlass kn gemm [{cname}]"] = (jax.jit(functools.partial(lambda C, X, c: tuple(
                        cs.cutlass_spmm_kn(a[0], a[1], x, m=o, k=t, config=c) for a, x in zip(C, X)), c=c)),
                        (cg, X))
                v["dw cutlass + fused mvue compress"] = (jax.jit(lambda X, G: tuple(
                    cs.cutlass_spmm_kn(*cc.mvue24_compress(mkey, g, transposed=True), x, m=o, k=t)
                    for x, g in zip(X, G))), (X, G))
        if ("cusparselt" in backends and lt.cusparselt_supports(o, t, i, DTYPE)
                and lt.fused_compress_ok(o, t, i, DTYPE) and lt.fused_compress_ok(i, t, o, DTYPE)
                and lt.fused_compress_ok(o, i, t, DTYPE, lt.B_KN)):
            # what backend='cusparselt' runs: our fused compressors write cuSPARSELt's operand
            # (A stored (m, k)), the library multiplies
            kf = dict(m=o, n=t, k=i, a_layout=lt.A_MK, b_layout=lt.B_NK)
            kd = dict(m=i, n=t, k=o, a_layout=lt.A_MK, b_layout=lt.B_NK)
            kw = dict(m=o, n=i, k=t, a_layout=lt.A_MK, b_layout=lt.B_KN)
            lay = dict(layout="cusparselt")
            lf = tuple(cc.masked_compress(w, m, transposed=True, **lay) for w, m in zip(W, M))
            ld = tuple(cc.masked_compress(w, m, transposed=False, **lay) for w, m in zip(W, M))
            lg = tuple(cc.mvue24_compress(mkey, g, transposed=True, **lay) for g in G)
            v["fwd cusparselt gemm"] = (jax.jit(lambda C, X: tuple(
                lt.cusparselt_spmm(c, x, **kf) for c, x in zip(C, X))), (lf, X))
            v["fwd cusparselt + fused compress"] = (jax.jit(lambda W, M, X: tuple(
                lt.cusparselt_spmm(cc.masked_compress(w, m, transposed=True, **lay), x, **kf)
                for w, m, x in zip(W, M, X))), (W, M, X))
            v["dx cusparselt gemm"] = (jax.jit(lambda C, G: tuple(
                lt.cusparselt_spmm(c, g, **kd) for c, g in zip(C, G))), (ld, G))
            v["dx cusparselt + fused compress"] = (jax.jit(lambda W, M, G: tuple(
                lt.cusparselt_spmm(cc.masked_compress(w, m, transposed=False, **lay), g, **kd)
                for w, m, g in zip(W, M, G))), (W, M, G))
            v["dw cusparselt gemm"] = (jax.jit(lambda C, X: tuple(
                lt.cusparselt_spmm(c, x, **kw) for c, x in zip(C, X))), (lg, X))
            v["dw cusparselt + fused mvue compress"] = (jax.jit(lambda X, G: tuple(
                lt.cusparselt_spmm(cc.mvue24_compress(mkey, g, transposed=True, **lay), x, **kw)
                for x, g in zip(X, G))), (X, G))
        med, _ = measure(v, r, trials)
        ms = {k: val * 1e3 for k, val in med.items()}
        fwd_base = min(ms.get("fwd dense x@w", math.inf), ms.get("fwd dense x@(w*m)", math.inf))
        base = {"fwd": fwd_base, "dx": ms.get("dx dense g@w.T", math.inf), "dw": ms.get("dw dense x.T@g", math.inf)}
        kn = {k[len("dw cutlass kn gemm ["):-1]: val for k, val in ms.items() if k.startswith("dw cutlass kn gemm [")}
        rec = dict(section="gemm", d=d, layer=lname, I=i, O=o, T=t, ms=ms,
                   kn_best_config=min(kn, key=kn.get) if kn else None,
                   speedup={k: base[k.split()[0]] / val for k, val in ms.items()},
                   control=ms.get("fwd dense x@w", math.nan) / ms.get("fwd dense control", math.nan))
        yield rec
        print(f"gemm d={d} {lname}: " + ", ".join(f"{k} {val:.3f} ms ({rec['speedup'][k]:.2f}x)"
                                                     for k, val in ms.items()), flush=True)
        del sets, v


# ------------------------------------------------------------------------------------------------
# 3. the layer (FFN) forward + backward


def _ffn(d, make):
    from flax import linen as nn

    class FFN(nn.Module):
        @nn.compact
        def __call__(self, x):
            return make(d, "down")(nn.gelu(make(4 * d, "up")(x)))

    return FFN()


def bench_layer(dims, trials, backends, recipes):
    from flax import linen as nn

    t = TOKENS
    for d in dims:
        key = jax.random.PRNGKey(d)
        r = n_sets(t * d * 2 * 2 + 8 * d * d * 4)
        xs = []
        for j in range(r):
            k1, key = jax.random.split(key)
            xs.append(_rand(k1, (t, d)))
        xs = tuple(xs)
        mrng = jax.random.key(11)

        def dense_make(features, name):
            return nn.Dense(features, dtype=DTYPE, param_dtype=jnp.float32, name=name)

        def make_variant(model, variables, with_rng):
            def loss(params, x):
                v = dict(variables, params=params)
                kw = {"rngs": {"mvue": mrng}} if with_rng else {}
                return (model.apply(v, x, **kw).astype(jnp.float32) ** 2).mean()

            g = jax.value_and_grad(loss, argnums=(0, 1))

            def step(params, xs):
                return tuple(g(params, x) for x in xs)

            return jax.jit(step), (variables["params"], xs)

        variants = {}
        outputs = {}
        dense_model = _ffn(d, dense_make)
        dvars = dense_model.init(jax.random.PRNGKey(0), xs[0][:16])
        variants["nn.Dense"] = make_variant(dense_model, dvars, False)
        variants["nn.Dense control"] = make_variant(dense_model, dvars, False)
        for recipe in recipes:
            for backend in backends:
                def sparse_make(features, name, recipe=recipe, backend=backend):
                    return s24.nn.Sparse24Dense(features, dtype=DTYPE, param_dtype=jnp.float32, method=recipe,
                                                backend=backend, name=name)

                model = _ffn(d, sparse_make)
                try:
                    svars = model.init(jax.random.PRNGKey(0), xs[0][:16])
                    # same initial kernels as the dense model (so outputs are comparable)
                    svars = dict(svars, params=dvars["params"])
                    name = f"{recipe}/{backend}"
                    variants[name] = make_variant(model, svars, True)
                    outputs[name] = (model, svars)
                except Exception as e:
                    print(f"  layer d={d} {recipe}/{backend} left out: {type(e).__name__}: {str(e)[:200]}",
                          flush=True)
        med, samples = measure(variants, r, trials)
        ms = {k: val * 1e3 for k, val in med.items()}
        base = ms["nn.Dense"]
        # agreement of each sparse backend with the dense backend of the same recipe (loss values)
        agree = {}
        for name, (model, svars) in outputs.items():
            recipe, backend = name.split("/")
            ref = f"{recipe}/dense"
            if ref in outputs and name != ref and name in ms:
                y = model.apply(svars, xs[0], rngs={"mvue": mrng}).astype(jnp.float32)
                yr = outputs[ref][0].apply(outputs[ref][1], xs[0], rngs={"mvue": mrng}).astype(jnp.float32)
                agree[name] = float(jnp.linalg.norm(y - yr) / jnp.linalg.norm(yr))
        rec = dict(section="layer", d=d, T=t, ms=ms, speedup={k: base / val for k, val in ms.items()},
                   control=base / ms.get("nn.Dense control", math.nan), fwd_rel_err_vs_dense_backend=agree)
        yield rec
        print(f"layer d={d}: " + ", ".join(f"{k} {val:.3f} ms ({rec['speedup'][k]:.2f}x)" for k, val in ms.items()),
              flush=True)


# ------------------------------------------------------------------------------------------------
# 4. the weight work of a whole model per step, per layer vs batched


#: (name, I, O) of one GPT-2 small block's weights: attention qkv and output projection, FFN up and down.
GPT2_BLOCK = (("attn.qkv", 768, 2304), ("attn.proj", 768, 768), ("mlp.fc", 768, 3072), ("mlp.proj", 3072, 768))


def _gpt2_weights(layers: int):
    """The (w, transposable mask) pairs of ``layers`` GPT-2 blocks, bf16."""
    key = jax.random.PRNGKey(20)
    ws, ms = [], []
    for _ in range(layers):
        for _, i, o in GPT2_BLOCK:
            k, key = jax.random.split(key)
            w = _rand(k, (i, o), 1 / math.sqrt(i))
            ws.append(w)
            ms.append(cm.transposable_mask24_cuda(w) if _ffi.cuda_kernels_available() else s24.transposable_mask24(w))
    return tuple(ws), tuple(ms)


def _gpt2_model(layers: int, backend: str):
    """GPT-2's weight shapes (the attention itself left out: the prepare pass only reads the weights)."""
    from flax import linen as nn

    (_, _, qkv), (_, _, d), (_, _, f), _ = GPT2_BLOCK

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            def dense(n, name):
                return s24.nn.Sparse24Dense(n, dtype=DTYPE, backend=backend, name=name)

            x = x + dense(d, "proj")(dense(qkv, "qkv")(x)[..., :d])
            return x + dense(d, "down")(nn.gelu(dense(f, "fc")(x)))

    class GPT2(nn.Module):
        @nn.compact
        def __call__(self, x):
            for j in range(layers):
                x = Block(name=f"h_{j}")(x)
            return x

    return GPT2()


def _same_bits(a, b) -> bool:
    def bits(t):
        return [np.asarray(x).view(np.uint8) for x in jax.tree.leaves(t)]

    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(p, q) for p, q in zip(bits(a), bits(b)))


def _device_times(variants, repeats: int = 3) -> dict:
    """Per variant, the median over ``repeats`` traced calls of (kernel µs summed, device span µs from
    the call's first kernel to its last): what the preparation costs inside a jitted step, without
    the host's dispatch of ~100 arrays per call that the wall-clock column includes."""
    from bench_step_breakdown import kernel_times

    out = {}
    for name, (fn, args) in variants.items():
        kern, span = [], []
        for _ in range(repeats):
            jax.block_until_ready(fn(*args))
            with tempfile.TemporaryDirectory() as tdir:
                with jax.profiler.trace(tdir):
                    jax.block_until_ready(fn(*args))
                kt = kernel_times(tdir)
            kern.append(kt.total_us)
            span.append(kt.span_us)
        out[name] = {"kernel_us": statistics.median(kern), "span_us": statistics.median(span)}
    return out


def _per_layer_label(batched: str, labels):
    """The per-layer row of a ``"...: batched"`` row among ``labels`` (the same prefix), or None."""
    if not batched.endswith("batched"):
        return None
    prefix = batched[: -len("batched")]
    return next((b for b in labels if b.startswith(prefix) and b != batched), None)


def bench_prepare(trials, layers=12, smoke=False):
    """``smoke``: a CPU run of the nn.prepare rows only (backend "auto": dense, W̃ per layer)."""
    ws, ms = _gpt2_weights(layers)
    jax.block_until_ready((ws, ms))
    n = len(ws)
    v = {}
    if not smoke:
        for layout in ("cutlass", "cusparselt"):
            tag = "" if layout == "cutlass" else ", cuSPARSELt layout"
            v[f"compress both{tag}: per layer ({n} launches)"] = (jax.jit(lambda ws, ms, lay=layout: tuple(
                cc.masked_compress_both(w, m, layout=lay) for w, m in zip(ws, ms))), (ws, ms))
            v[f"compress both{tag}: batched"] = (jax.jit(lambda ws, ms, lay=layout: tuple(cc.masked_compress_many(
                ws, ms, direction="both", layout=lay))), (ws, ms))
        v[f"compress W~^T: per layer ({n} launches)"] = (jax.jit(lambda ws, ms: tuple(
            cc.masked_compress(w, m, transposed=True) for w, m in zip(ws, ms))), (ws, ms))
        v["compress W~^T: batched"] = (jax.jit(lambda ws, ms: tuple(cc.masked_compress_many(
            ws, ms, direction="transposed"))), (ws, ms))
        for name in [k for k in v if k.endswith("batched")]:
            base = _per_layer_label(name, v)
            # a list per pair from masked_compress_many, made a tuple above: the same tree as per layer
            assert _same_bits(v[name][0](ws, ms), v[base][0](ws, ms)), f"{name}: not the per-layer bits"
    # nn.prepare of the model: f32 params (these weights), bf16 compute, their masks
    model = _gpt2_model(layers, "auto" if smoke else "cutlass")
    x = jnp.zeros((8, TOKENS // 8, GPT2_BLOCK[0][1]), DTYPE)
    variables = model.init(jax.random.PRNGKey(0), x[:1, :16])
    params, sparsity = variables["params"], variables["sparsity"]
    it = iter(zip(ws, ms))
    for j in range(layers):
        for name in ("qkv", "proj", "fc", "down"):
            w, m = next(it)
            params[f"h_{j}"][name]["kernel"] = w.astype(jnp.float32)
            sparsity[f"h_{j}"][name]["transposable_mask"] = m
    variables = {"params": params, "sparsity": sparsity}
    prep = {}
    for batch in (False, True):
        label = f"nn.prepare GPT-2 ({layers} layers): " + ("batched" if batch else f"per layer ({n} weights)")
        v[label] = (jax.jit(lambda v, x, b=batch: s24.preparation.prepare(model, v, x, batch=b)), (variables, x))
        prep[batch] = v[label][0](variables, x)
    same = _same_bits(prep[False], prep[True])
    med, _ = measure(v, 1, trials)
    us = {k: val * 1e6 for k, val in med.items()}
    speedup = {k: us[b] / us[k] for k in us if (b := _per_layer_label(k, us)) is not None}
    device = {} if smoke else _device_times(v)
    rec = dict(section="prepare", layers=layers, weights=n, shapes=[list(w.shape) for w in ws[:4]],
               tokens=TOKENS, us=us, speedup=speedup, batched_equals_per_layer=same, device_us=device)
    yield rec
    print("prepare: " + ", ".join(f"{k} {val:.1f} us" + (f" ({speedup[k]:.2f}x)" if k in speedup else "")
                                  for k, val in us.items()) + f"; batched == per layer: {same}", flush=True)


# ------------------------------------------------------------------------------------------------


def markdown(meta, records):
    lines = [f"# 2:4 layer benchmark — {meta['device']}, jax {meta['jax']}, {meta['date']}", "",
             f"T = {TOKENS} tokens, bfloat16 compute; "
             + ("layers I×O " + ", ".join(f"{i}×{o}" for i, o in meta["shapes"]) if meta.get("shapes")
                else "FFN layers up (d→4d) and down (4d→d)") + ". Speedup = the dense "
             "baseline of the same run / the variant; control = dense / separately compiled dense (noise floor).", ""]
    comp = [r for r in records if r["section"] == "compress"]
    if comp:
        lines += ["## Fused compressors (effective GB/s = dense bytes read + compressed bytes written)", "",
                  "`ms`, `GB/s`: wall clock per call of a program of back-to-back calls on different inputs "
                  "(the program's dispatch spread over its calls); `kernel µs`: the kernels' time per call in "
                  "a traced run of that program, `device span µs`: its first kernel's start to its last "
                  "kernel's end per call (launch gaps included; what the calls cost inside a jitted step).", "",
                  "| d | layer (I×O) | op | ms | GB/s | kernel µs | kernel GB/s | device span µs |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in comp:
            kern = (f"{r['kernel_us']:.1f} | {r['kernel_gbs']:.0f} | {r['span_us']:.1f}"
                    if r.get("kernel_gbs") else "– | – | –")
            lines.append(f"| {r['d']} | {r['layer']} ({r['I']}×{r['O']}) | {r['op']} | {r['ms']:.4f} | "
                         f"{r['gbs']:.0f} | {kern} |")
        lines.append("")
    gem = [r for r in records if r["section"] == "gemm"]
    if gem:
        lines += ["## The three GEMMs (ms, speedup vs XLA dense: fwd vs min(x@w, x@(w*m)), dx vs g@wᵀ, "
                  "dw vs xᵀ@g)", ""]
        names = []
        for r in gem:
            names += [k for k in r["ms"] if k not in names]
        lines.append("| d | layer | control | " + " | ".join(names) + " |")
        lines.append("|---|---|---|" + "---|" * len(names))
        for r in gem:
            cells = [f"{r['ms'][n]:.3f} ({r['speedup'][n]:.2f}×)" if n in r["ms"] else "—" for n in names]
            lines.append(f"| {r['d']} | {r['layer']} | {r['control']:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
    lay = [r for r in records if r["section"] == "layer"]
    if lay:
        lines += ["## Sparse24Dense FFN forward + backward vs nn.Dense (ms, speedup)", ""]
        names = []
        for r in lay:
            names += [k for k in r["ms"] if k not in names]
        lines.append("| d | " + " | ".join(names) + " |")
        lines.append("|---|" + "---|" * len(names))
        for r in lay:
            cells = [f"{r['ms'][n]:.3f} (**{r['speedup'][n]:.2f}×**)" if n in r["ms"] else "—" for n in names]
            lines.append(f"| {r['d']} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Forward agreement with the same recipe on backend='dense' (relative error of the output): " +
                     "; ".join(f"d={r['d']}: " + ", ".join(f"{k} {v:.1e}" for k, v in
                                                           r["fwd_rel_err_vs_dense_backend"].items()) for r in lay))
    for r in (r for r in records if r["section"] == "prepare"):
        lines += ["", f"## Weight preparation of a GPT-2 small per step: {r['weights']} weights "
                  f"({r['layers']} layers × {', '.join('×'.join(map(str, s)) for s in r['shapes'])}), "
                  "per layer vs batched", "",
                  f"`wall µs`: median per preparation timed on the host (includes the dispatch of ~100 arrays per "
                  "call); `device span µs`: first to last kernel of one traced call (median of 3; what the "
                  "preparation costs inside a jitted step, launch gaps included); `kernel µs`: the kernels' sum. "
                  "Speedups = per layer / batched. Batched == per layer bit for bit: "
                  f"{r['batched_equals_per_layer']}.", "",
                  "| variant | wall µs | speedup | device span µs | speedup | kernel µs |", "|---|---:|---:|---:|---:|---:|"]
        dev = r.get("device_us") or {}

        def dev_speedup(k):
            base = _per_layer_label(k, dev)
            return "" if base is None or k not in dev else f"**{dev[base]['span_us'] / dev[k]['span_us']:.2f}×**"

        for k, val in r["us"].items():
            d = dev.get(k)
            lines.append(f"| {k} | {val:.1f} | " + (f"{r['speedup'][k]:.2f}×" if k in r["speedup"] else "") + " | "
                         + ("– | | –" if d is None else f"{d['span_us']:.1f} | {dev_speedup(k)} | {d['kernel_us']:.1f}")
                         + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--quick", action="store_true", help="d = 1280 only, srste only, 3 trials")
    p.add_argument("--dims", type=int, nargs="+", default=None)
    p.add_argument("--sections", nargs="+", default=["compress", "gemm", "layer"],
                   choices=["compress", "gemm", "layer", "prepare"])
    p.add_argument("--prepare-layers", type=int, default=12, help="GPT-2 blocks of the prepare section")
    p.add_argument("--backends", nargs="+", default=["dense", "cutlass", "cusparselt"])
    p.add_argument("--recipes", nargs="+", default=None)
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--tokens", type=int, default=8192, help="rows T of x (default %(default)s)")
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=None, metavar="I:O",
                   help="layers (in:out) for the compress and gemm sections instead of the FFNs of --dims")
    p.add_argument("--name", default="layer", help="results file name: NAME.json / NAME.md (default %(default)s)")
    p.add_argument("--smoke-cpu", action="store_true", help=argparse.SUPPRESS)  # script test without a GPU
    args = p.parse_args(argv)
    if not _ffi.cuda_kernels_available() and not args.smoke_cpu:
        raise SystemExit(f"needs a CUDA GPU and the built extension: {_ffi.extension_error() or 'no GPU'}")
    dims = args.dims or ([1280] if args.quick else [768, 1024, 1280])
    recipes = args.recipes or (["srste"] if args.quick else ["srste", "ste", "soft"])
    trials = args.trials or (3 if args.quick else 7)
    global TOKENS, SHAPES
    TOKENS = 64 if args.smoke_cpu else args.tokens
    SHAPES = args.shapes
    backends = [b for b in args.backends if b != "cusparselt" or lt.cusparselt_available()]
    if "cusparselt" in args.backends and "cusparselt" not in backends:
        print(f"cusparselt left out: {lt.cusparselt_error()}", flush=True)
    meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, python=platform.python_version(),
                date=datetime.datetime.now().isoformat(timespec="seconds"), dims=dims, shapes=SHAPES, tokens=TOKENS, dtype="bfloat16",
                backends=backends, recipes=recipes, trials=trials, quick=bool(args.quick),
                cutlass_configs=list(cs.cutlass_configs()) if _ffi.extension() else [],
                cutlass_configs_kn=list(cs.cutlass_configs_kn()) if _ffi.extension() else [])
    print(f"# {meta['device']}, jax {meta['jax']}, dims {dims}, backends {backends}, recipes {recipes}", flush=True)
    records = []

    def keep(rec):  # the JSON is rewritten after every record: a run cut short keeps what it measured
        records.append(rec)
        write_json(args.out, args.name, dict(meta, partial=True), records)

    if "compress" in args.sections:
        for rec in bench_compress(dims, trials):
            keep(rec)
    if "gemm" in args.sections:
        for rec in bench_gemm(dims, trials, backends):
            keep(rec)
    if "layer" in args.sections:
        for rec in bench_layer(dims, trials, backends, recipes):
            keep(rec)
    if "prepare" in args.sections:
        for rec in bench_prepare(trials, args.prepare_layers, smoke=args.smoke_cpu):
            keep(rec)
    if "cusparselt" in backends:
        meta["cusparselt_plans"] = [list(p) for p in lt.cusparselt_plans()]
        meta["cusparselt_version"] = lt.cusparselt_version()  # the autotune table is keyed on it
    write_results(args.out, args.name, meta, records, markdown(meta, records))


if __name__ == "__main__":
    main()
