"""The three GEMMs of a 2:4 linear layer, per backend.

``forward``      y  = x · (W ⊙ M)          (T, I) · (I, O)
``input_grad``   ∇x = ∇y · (W ⊙ M)ᵀ        (T, O) · (O, I)
``weight_grad``  ∇W = xᵀ · G               (I, T) · (T, O), G = ∇y or MVUE(∇y)

Backends:

* ``reference`` — plain ``jnp.dot`` on the masked weight, every platform;
* ``dense``     — the same dense GEMM on the masked weight (the math of the sparse kernel);
* ``cutlass``   — the SM90 sparse tensor-core GEMM on a GPU (the reference on a CPU); raises if the
  extension is missing or the shape/dtype is unsupported;
* ``auto``      — ``cutlass`` where the measured table (``spmm_autotune.json``) says the sparse kernel,
  compression included, beats XLA's dense GEMM for the shape, else ``dense``.

Sparse formulation (DESIGN.md "Consequences" 6): the 2:4 operand is CUTLASS's A (K-major);
``y (T, O) = x (T, I) · W̃``  is  D(O×T) = W̃ᵀ(O×I) · xᵀ  with x and y used in place, and
``∇x (T, I) = ∇y · W̃ᵀ`` is D(I×T) = W̃(I×O) · ∇yᵀ (needs W̃ 2:4 along O: a transposable mask).
"""

from __future__ import annotations

import functools
import json
import math
import os

import jax.numpy as jnp

from jax_sparse24._src import ffi

__all__ = ["BACKENDS", "forward", "input_grad", "weight_grad", "masked_weight", "choose", "lookup"]

BACKENDS = ("auto", "cutlass", "dense", "reference")

#: Measured per-shape table (``spmm_autotune.json``, made from ``benchmarks/results/spmm.json`` by
#: ``benchmarks/make_autotune_table.py``): the fastest configuration per (M, N, K, dtype) and its
#: speedup over the faster XLA dense GEMM with the per-call compression counted.
_TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spmm_autotune.json")


@functools.lru_cache(maxsize=None)
def _table():
    try:
        with open(_TABLE_PATH) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"entries": [], "configs": []}


def lookup(m: int, n: int, k: int, dtype):
    """Nearest measured shape (log distance, same dtype): ``(speedup_with_compress, config_id)`` or None."""
    name = jnp.dtype(dtype).name
    entries = [e for e in _table()["entries"] if e["dtype"] == name]
    if not entries:
        return None
    e = min(entries, key=lambda e: sum(abs(math.log(a / b)) for a, b in zip((e["m"], e["n"], e["k"]), (m, n, k))))
    return e["speedup_with_compress"], _config_id(e["config"])


def _config_id(name: str) -> int:
    """Id of a configuration in *this* build (-1: the build's default table if not compiled)."""
    from jax_sparse24._src import cuda_spmm_ops

    names = cuda_spmm_ops.cutlass_configs()
    return names.index(name) if name in names else -1


def masked_weight(w, mask):
    return jnp.where(mask, w, jnp.zeros((), w.dtype))


def _dot(a, b, precision):
    return jnp.dot(a, b, precision=precision)


def _cutlass_ok(m: int, n: int, k: int, dtype) -> bool:
    if ffi.extension() is None:
        return False
    from jax_sparse24._src import cuda_spmm_ops

    return cuda_spmm_ops.cutlass_supports(m, n, k, dtype)


def _table_says_sparse(m: int, n: int, k: int, dtype) -> bool:
    hit = lookup(m, n, k, dtype)
    return hit is not None and hit[0] > 1.0


def _config(m: int, n: int, k: int, dtype) -> int:
    hit = lookup(m, n, k, dtype)
    return -1 if hit is None else hit[1]


def choose(backend: str, m: int, n: int, k: int, dtype) -> str:
    """Resolve ``backend`` for D(m×n) = A(m×k, 2:4)·B(k×n): ``"cutlass"`` or ``"dense"``/``"reference"``."""
    if backend in ("dense", "reference"):
        return backend
    ok = _cutlass_ok(m, n, k, dtype)
    if backend == "cutlass":
        if not ok:
            reason = ffi.extension_error() or (
                f"the CUTLASS sparse GEMM does not support m={m}, n={n}, k={k}, dtype={jnp.dtype(dtype)} "
                "(bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())")
            raise RuntimeError(f"backend='cutlass': {reason}")
        return "cutlass"
    # auto
    if ok and ffi.cuda_kernels_available() and _table_says_sparse(m, n, k, dtype):
        return "cutlass"
    return "dense"


def forward(x2, w, mask, *, backend: str, precision=None):
    dtype = jnp.result_type(x2, w)
    wm = masked_weight(w, mask).astype(dtype)
    x2 = x2.astype(dtype)
    t, i = x2.shape
    o = w.shape[1]
    dense = lambda x2, wm: _dot(x2, wm, precision)  # noqa: E731
    if choose(backend, o, t, i, dtype) != "cutlass":
        return dense(x2, wm)
    from jax_sparse24._src import cuda_spmm_ops as cs

    def sparse(x2, wm):
        values, meta = cs.cutlass_compress(wm.T)  # W̃ᵀ (O, I), 2:4 along I
        return cs.cutlass_spmm(values, meta, x2, m=o, k=i, config=_config(o, t, i, dtype))  # (T, O)

    return ffi.per_platform(dense, sparse, x2, wm)


def input_grad(g2, w, mask, *, transposable: bool, backend: str, precision=None):
    dtype = jnp.result_type(g2, w)
    wm = masked_weight(w, mask).astype(dtype)
    g2 = g2.astype(dtype)
    t, o = g2.shape
    i = w.shape[0]
    dense = lambda g2, wm: _dot(g2, wm.T, precision)  # noqa: E731
    if not transposable:
        if backend == "cutlass":
            pass  # ∇x needs W̃ 2:4 along `out`; without a transposable mask it stays dense.
        return dense(g2, wm)
    if choose(backend, i, t, o, dtype) != "cutlass":
        return dense(g2, wm)
    from jax_sparse24._src import cuda_spmm_ops as cs

    def sparse(g2, wm):
        values, meta = cs.cutlass_compress(wm)  # W̃ (I, O), 2:4 along O
        return cs.cutlass_spmm(values, meta, g2, m=i, k=o, config=_config(i, t, o, dtype))  # (T, I)

    return ffi.per_platform(dense, sparse, g2, wm)


def weight_grad(x2, g2, *, backend: str, precision=None):
    # Dense GEMM (xᵀ·G): the sparse weight-gradient GEMM needs a fused MVUE+compress kernel.
    dtype = jnp.result_type(x2, g2)
    return _dot(x2.astype(dtype).T, g2.astype(dtype), precision)


# --- Sharding (issue 6) -----------------------------------------------------------------------
# Each GEMM above runs as one custom-partitioned op (rules: _src/sharding.py, gemm_rule): under
# jit + NamedSharding it is called on the local shards (local shapes, so the backend choice and any
# compression are per shard) with a psum over a sharded contraction axis, instead of having its
# operands all-gathered. Keep these lines last: they wrap the final definitions.
from jax_sparse24._src import sharding as _sharding  # noqa: E402

forward = _sharding.partitioned_gemm("forward")(forward)
input_grad = _sharding.partitioned_gemm("input_grad")(input_grad)
weight_grad = _sharding.partitioned_gemm("weight_grad")(weight_grad)
