"""Probe cuSPARSELt on the GPU: (1) its compressed bytes next to CUTLASS's layout for the same 2:4
operand, (2) which GEMM kernels it and XLA pick at the FFN layer shapes (run under Nsight Compute).

    python scripts/probe_cusparselt.py format --out DIR      # writes DIR/cusparselt_format.npz
    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python scripts/probe_cusparselt.py kernels           # kernel names + durations

Used to decide whether our fused compressors can write cuSPARSELt's operand directly.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import cuda_spmm_ops as sp


def random_24(rng, m, k):
    """(m, k) with exactly two nonzero small integers (exact in bf16) per group of 4 along k."""
    vals = rng.integers(1, 120, size=(m, k)) * rng.choice([-1, 1], size=(m, k))
    keep = np.zeros((m, k // 4, 4), bool)
    order = np.argsort(rng.random((m, k // 4, 4)), axis=-1)[..., :2]
    np.put_along_axis(keep, order, True, axis=-1)
    return (vals * keep.reshape(m, k)).astype(np.float32)


def probe_format(out):
    rng = np.random.default_rng(0)
    saved = {}
    for m, k in [(128, 128), (256, 512), (1024, 1024)]:
        for a_layout in (lt.A_MK, lt.A_KM):
            for dtype in (jnp.bfloat16, jnp.float16):
                a_mk = random_24(rng, m, k)
                # structured probes: value = row + 1, value = (col // 4) + 1 (both exact for < 256)
                a_row = np.where(a_mk != 0, (np.arange(m)[:, None] % 240) + 1, 0).astype(np.float32)
                a_col = np.where(a_mk != 0, ((np.arange(k)[None, :] // 4) % 240) + 1, 0).astype(np.float32)
                tag = f"m{m}_k{k}_a{a_layout}_{jnp.dtype(dtype).name}"
                for name, a in (("rand", a_mk), ("row", a_row), ("col", a_col)):
                    stored = a if a_layout == lt.A_MK else a.T
                    x = jnp.asarray(stored, dtype)
                    c = np.asarray(lt.cusparselt_compress(x, m=m, n=256, k=k, a_layout=a_layout))
                    saved[f"{tag}_{name}_dense"] = a
                    saved[f"{tag}_{name}_lt"] = c
                    if a_layout == lt.A_MK:
                        v, e = sp.cutlass_compress(jnp.asarray(a, dtype))
                        saved[f"{tag}_{name}_cutv"] = np.asarray(v.astype(jnp.float32))
                        saved[f"{tag}_{name}_cute"] = np.asarray(e)
                print(tag, "compressed bytes", saved[f"{tag}_rand_lt"].size, "dense values bytes", m * k, flush=True)
    saved["plans"] = np.array([str(p) for p in lt.cusparselt_plans()])
    np.savez_compressed(os.path.join(out, "cusparselt_format.npz"), **saved)
    print("wrote", os.path.join(out, "cusparselt_format.npz"))


def _cudart():
    for pat in ("/usr/local/cuda*/lib64/libcudart.so*",):
        for p in glob.glob(pat):
            try:
                return ctypes.CDLL(p)
            except OSError:
                pass
    import nvidia  # noqa: PLC0415
    for base in nvidia.__path__:
        for p in glob.glob(os.path.join(base, "**", "libcudart.so*"), recursive=True):
            return ctypes.CDLL(p)
    raise RuntimeError("libcudart not found")


def probe_kernels():
    cudart = _cudart()
    T = 8192
    calls = []
    key = jax.random.key(0)
    for d in (768, 1024, 1280):
        for I, O in ((d, 4 * d), (4 * d, d)):
            x = jax.random.normal(key, (T, I), jnp.bfloat16)
            g = jax.random.normal(key, (T, O), jnp.bfloat16)
            w = jax.random.normal(key, (I, O), jnp.bfloat16)
            # the 2:4 operands as the layer stores them: forward A = W~ (I, O) = (k, m), 2:4 along I;
            # input gradient A = W~ (I, O) = (m, k), 2:4 along O; weight gradient A = dy (T, O) = (k, m)
            w24 = w * (jnp.arange(I)[:, None] % 4 < 2)
            wT24 = w * (jnp.arange(O)[None, :] % 4 < 2)
            g24 = g * (jnp.arange(T)[:, None] % 4 < 2)
            specs = [
                (f"d{d} {I}x{O} fwd", dict(m=O, n=T, k=I, a_layout=lt.A_KM, b_layout=lt.B_NK), w24, x,
                 lambda p, q: p @ q, (x, w)),
                (f"d{d} {I}x{O} dx", dict(m=I, n=T, k=O, a_layout=lt.A_MK, b_layout=lt.B_NK), wT24, g,
                 lambda p, q: p @ q.T, (g, w)),
                (f"d{d} {I}x{O} dw", dict(m=O, n=I, k=T, a_layout=lt.A_KM, b_layout=lt.B_KN), g24, x,
                 lambda p, q: p.T @ q, (x, g)),
            ]
            for name, kw, a, b, dense, dargs in specs:
                c = jax.block_until_ready(lt.cusparselt_compress(a, **kw))
                f = jax.jit(lambda c, b, kw=kw: lt.cusparselt_spmm(c, b, **kw))
                jax.block_until_ready(f(c, b))  # plan + search outside the profiled range
                jd = jax.jit(dense)
                jax.block_until_ready(jd(*dargs))
                calls.append((name, f, (c, b), jd, dargs))
    cudart.cudaProfilerStart()
    for name, f, args, jd, dargs in calls:
        print("CALL", name, flush=True)
        jax.block_until_ready(f(*args))
        jax.block_until_ready(jd(*dargs))
    cudart.cudaProfilerStop()
    for p in lt.cusparselt_plans():
        print("PLAN", p)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["format", "kernels"])
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    probe_format(a.out) if a.what == "format" else probe_kernels()


if __name__ == "__main__":
    sys.exit(main())
