"""The three GEMMs of a 2:4 linear layer, per backend.

``forward``      y  = x · (W ⊙ M)          (T, I) · (I, O)
``input_grad``   ∇x = ∇y · (W ⊙ M)ᵀ        (T, O) · (O, I)
``weight_grad``  ∇W = xᵀ · G               (I, T) · (T, O), G = ∇y or MVUE(∇y)

Backends:

* ``reference`` — plain ``jnp.dot`` on the masked weight, every platform;
* ``dense``     — the same dense GEMM on the masked weight (the math of the sparse kernel);
* ``cutlass``   — the SM90 sparse tensor-core GEMM on a GPU (the reference on a CPU); raises if the
  extension is missing or the shape/dtype is unsupported;
* ``cusparselt`` — the cuSPARSELt sparse GEMM (one handle per device, plans cached, algorithm chosen
  once by ``cusparseLtMatmulSearch``); its operands are written by our fused compressors in
  cuSPARSELt's layout where :func:`~jax_sparse24._src.cuda_cusparselt_ops.fused_compress_ok` (m a
  multiple of 64, k of 32, layout checked against the library once per plan), else compressed by
  ``cusparseLtSpMMACompress``; bfloat16 (float16 GEMMs are refused:
  :func:`~jax_sparse24._src.cuda_cusparselt_ops.float16_gemm_error`); raises if the library or a GPU
  is missing or the shape/dtype is unsupported (m, n, k multiples of 16);
* ``auto``      — ``cutlass`` where the measured table (``spmm_autotune.json``) says the sparse kernel,
  compression included, beats XLA's dense GEMM for the shape, ``cusparselt`` where the table
  measured it (operand from our fused compressor) faster still near this shape (bfloat16,
  :data:`CUSPARSELT_RADIUS`; for prepared weights compared amortized over their reuse), else ``dense``.

Sparse formulation (DESIGN.md "Consequences" 6): the 2:4 operand is CUTLASS's A (K-major);
``y (T, O) = x (T, I) · W̃``  is  D(O×T) = W̃ᵀ(O×I) · xᵀ  with x and y used in place, and
``∇x (T, I) = ∇y · W̃ᵀ`` is D(I×T) = W̃(I×O) · ∇yᵀ (needs W̃ 2:4 along O: a transposable mask).
The weight operands are compressed by one fused pass over W and the mask
(:func:`~jax_sparse24._src.cuda_compress_ops.masked_compress`).

``weight_grad_mvue`` (``∇W = xᵀ·MVUE(∇y)``, MVUE groups along tokens) is sparse too:
D(O×I) = MVUE(∇y)ᵀ(O×T) · x(T×I) with the MVUE sample drawn and compressed in one pass over ∇y
(:func:`~jax_sparse24._src.cuda_compress_ops.mvue24_compress`, no transpose materialised) and B = x
read N-major in place (:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_spmm_kn`), so ∇W comes out
as (I, O) — Flax layout.
"""

from __future__ import annotations

import functools
import json
import math
import os

import jax
import jax.numpy as jnp

from jax_sparse24._src import ffi

__all__ = ["BACKENDS", "forward", "input_grad", "weight_grad", "weight_grad_mvue", "masked_weight", "choose",
           "choose_weight_grad", "lookup"]

BACKENDS = ("auto", "cutlass", "cusparselt", "dense", "reference")

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


def _nearest(section: str, m: int, n: int, k: int, dtype):
    """The entry of table ``section`` (``"entries"``, ``"entries_kn"``) nearest to (m, n, k) (log
    distance, same dtype), or None."""
    name = jnp.dtype(dtype).name
    entries = [e for e in _table().get(section, []) if e["dtype"] == name]
    if not entries:
        return None
    return min(entries, key=lambda e: sum(abs(math.log(a / b)) for a, b in zip((e["m"], e["n"], e["k"]), (m, n, k))))


def _nearest_entry(m: int, n: int, k: int, dtype):
    """The forward / input-gradient entry of the nearest measured shape, or None."""
    return _nearest("entries", m, n, k, dtype)


def lookup(m: int, n: int, k: int, dtype):
    """Nearest measured shape (log distance, same dtype): ``(speedup_with_compress, config_id)`` or None."""
    e = _nearest_entry(m, n, k, dtype)
    return None if e is None else (e["speedup_with_compress"], _config_id(e["config"]))


def _amortized(s_g, s_c, reuse: int) -> float:
    """Time per call ``1/s_g + (1/s_c - 1/s_g)/reuse`` (dense GEMM = 1) as a speedup."""
    return 1.0 / (1.0 / s_g + (1.0 / s_c - 1.0 / s_g) / max(int(reuse), 1))


def amortized_speedup(m: int, n: int, k: int, dtype, reuse: int, *, backend: str = "cutlass"):
    """Speedup of the sparse GEMM over XLA's dense one when one compression serves ``reuse`` calls.

    From the nearest measured shape: with ``s_g`` the GEMM-only speedup and ``s_c`` the speedup
    with the compression paid on every call, the time per call is ``1/s_g + (1/s_c - 1/s_g)/reuse``
    (in units of the dense GEMM). ``backend``: ``"cutlass"`` or ``"cusparselt"`` (operand from our
    fused compressor). ``None`` without a table entry (or without a cuSPARSELt measurement).
    """
    e = _nearest_entry(m, n, k, dtype)
    return None if e is None else _entry_amortized(e, reuse, backend)


def _entry_amortized(e, reuse: int, backend: str):
    """:func:`amortized_speedup` from the table entry ``e``."""
    if backend == "cusparselt":
        s_c = e.get("cusparselt_speedup_with_compress")
        if not s_c:
            return None
        return _amortized(e.get("cusparselt_gemm_speedup") or s_c, s_c, reuse)
    s_c = e["speedup_with_compress"]
    s_g = e.get("gemm_speedup") or s_c  # layer-only entries of older tables lack the GEMM-only ratio
    return _amortized(s_g, s_c, reuse)


def _config_id(name: str) -> int:
    """Id of a configuration in *this* build (-1: the build's default table if not compiled)."""
    from jax_sparse24._src import cuda_spmm_ops

    names = cuda_spmm_ops.cutlass_configs()
    return names.index(name) if name in names else -1


def masked_weight(w, mask):
    return jnp.where(mask, w, jnp.zeros((), w.dtype))


def _dot(a, b, precision):
    return jnp.dot(a, b, precision=precision)


def _as_bool(mask):
    mask = jnp.asarray(mask)
    return mask if mask.dtype == jnp.bool_ else mask != 0


def _cutlass_ok(m: int, n: int, k: int, dtype) -> bool:
    if ffi.extension() is None:
        return False
    from jax_sparse24._src import cuda_spmm_ops

    return cuda_spmm_ops.cutlass_supports(m, n, k, dtype)


#: ``auto`` takes a sparse path only where the table's speedup exceeds this: run-to-run noise of a
#: dense GEMM at GPT-2 FFN shapes on the H100 is about ±3% (the "control" column of layer.md).
MIN_GAIN = 1.03


def _config(m: int, n: int, k: int, dtype) -> int:
    hit = lookup(m, n, k, dtype)
    return -1 if hit is None else hit[1]


def _fused_lt_available(m: int, n: int, k: int, dtype, *, b_kn: bool = False) -> bool:
    """cuSPARSELt with our fused compressor writing its operand can run here (bfloat16, the library
    loaded, the table measured this library version, the layout check of
    :func:`~jax_sparse24._src.cuda_cusparselt_ops.fused_compress_ok`)."""
    if jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
        return False
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    if not lt.cusparselt_supports(m, n, k, dtype):  # loadable, shape and dtype
        return False
    # the table's cuSPARSELt measurements hold for the loaded library version (else: warn once, no)
    if not lt.table_version_matches(_table().get("cusparselt_version")):
        return False
    return lt.fused_compress_ok(m, n, k, dtype, lt.B_KN if b_kn else lt.B_NK)


#: ``auto`` takes cuSPARSELt only where the nearest measured shape is within this factor in every
#: dimension: its advantage does not carry to other sizes — at gpt2-medium with 4 micro-batches of
#: 2048 tokens, cuSPARSELt chosen from the 8192-token measurements made every 2:4 recipe 4–5% slower
#: than CUTLASS there (``train_gpt_h100_gpt2-medium_accum4_prepared_lt8192.md`` vs ``..._prepared.md``).
CUSPARSELT_RADIUS = 1.5


def _near(entry, m: int, n: int, k: int, factor: float = CUSPARSELT_RADIUS) -> bool:
    return all(max(a / b, b / a) <= factor for a, b in zip((entry["m"], entry["n"], entry["k"]), (m, n, k)))


def _cusparselt_wins(entry, s_lt, s_cutlass: float, m: int, n: int, k: int, dtype, *, b_kn: bool = False) -> bool:
    """``auto``: cuSPARSELt (operand from our fused compressor) where its speedup ``s_lt`` (from the
    table ``entry``: per call, or amortized over a prepared weight's reuse; ``None`` when not
    measured) beats both CUTLASS's ``s_cutlass`` and the noise floor, the entry was measured near
    this shape (:data:`CUSPARSELT_RADIUS`), and that path is available here."""
    if not s_lt or s_lt <= max(s_cutlass, MIN_GAIN) or not _near(entry, m, n, k):
        return False
    return _fused_lt_available(m, n, k, dtype, b_kn=b_kn)


def _choose_cusparselt(m: int, n: int, k: int, dtype) -> str:
    if ffi.extension() is None:
        raise RuntimeError(f"backend='cusparselt': {ffi.extension_error()}")
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    if not lt.cusparselt_supports(m, n, k, dtype):
        reason = lt.cusparselt_error() or lt.float16_gemm_error(dtype) or (
            f"cuSPARSELt needs bfloat16 and m, n, k multiples of {lt.ALIGN}, got m={m}, n={n}, k={k}, "
            f"dtype={jnp.dtype(dtype)}")
        raise RuntimeError(f"backend='cusparselt': {reason}")
    return "cusparselt"


def choose(backend: str, m: int, n: int, k: int, dtype, *, reuse: int | None = None) -> str:
    """Resolve ``backend`` for D(m×n) = A(m×k, 2:4)·B(k×n): ``"cutlass"`` or ``"dense"``/``"reference"``.

    ``reuse``: the 2:4 operand is compressed once and used by ``reuse`` calls (a prepared weight,
    :func:`prepare`); ``auto`` then weighs the compression by ``1/reuse``
    (:func:`amortized_speedup`, for CUTLASS and cuSPARSELt). ``None``: compressed on every call.
    """
    if backend in ("dense", "reference"):
        return backend
    if backend == "cusparselt":
        return _choose_cusparselt(m, n, k, dtype)
    ok = _cutlass_ok(m, n, k, dtype)
    if backend == "cutlass":
        if not ok:
            reason = ffi.extension_error() or (
                f"the CUTLASS sparse GEMM does not support m={m}, n={n}, k={k}, dtype={jnp.dtype(dtype)} "
                "(bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())")
            raise RuntimeError(f"backend='cutlass': {reason}")
        return "cutlass"
    # auto
    if not (ok and ffi.cuda_kernels_available()):
        return "dense"
    e = _nearest_entry(m, n, k, dtype)
    if e is None:
        return "dense"
    if reuse is None:
        if _cusparselt_wins(e, e.get("cusparselt_speedup_with_compress"), e["speedup_with_compress"], m, n, k, dtype):
            return "cusparselt"
        return "cutlass" if e["speedup_with_compress"] > MIN_GAIN else "dense"
    s_cutlass = _entry_amortized(e, reuse, "cutlass")
    if _cusparselt_wins(e, _entry_amortized(e, reuse, "cusparselt"), s_cutlass, m, n, k, dtype):
        return "cusparselt"
    return "cutlass" if s_cutlass > MIN_GAIN else "dense"


def _weight_gemm(chosen: str, b2, w, mask, dense, *, m: int, n: int, k: int, transposed: bool, dtype):
    """``D (n, m) = b2 (n, k) · Aᵀ`` with the 2:4 operand A made from W ⊙ M in one fused pass:
    ``transposed=True``: A = W̃ᵀ (O, I) (the forward GEMM), False: A = W̃ (I, O) (the input gradient),
    on the ``chosen`` sparse backend (``"cutlass"`` or ``"cusparselt"``); ``dense(b2, W̃)`` off CUDA."""
    from jax_sparse24._src import cuda_compress_ops as cc

    if chosen == "cusparselt":
        from jax_sparse24._src import cuda_cusparselt_ops as lt

        if lt.fused_compress_ok(m, n, k, dtype):
            def sparse(b2, wc, mk):  # our compressor writes cuSPARSELt's operand, A stored (M, K)
                ca = cc.masked_compress(wc, mk, transposed=transposed, layout="cusparselt")
                return lt.cusparselt_spmm(ca, b2, m=m, n=n, k=k, a_layout=lt.A_MK, b_layout=lt.B_NK)
        else:
            # the library's compressor on W̃ as stored (I, O): (K, M) for the forward, (M, K) for ∇x
            a_layout = lt.A_KM if transposed else lt.A_MK

            def sparse(b2, wc, mk):
                ca = lt.cusparselt_compress(masked_weight(wc, mk), m=m, n=n, k=k, a_layout=a_layout,
                                            b_layout=lt.B_NK)
                return lt.cusparselt_spmm(ca, b2, m=m, n=n, k=k, a_layout=a_layout, b_layout=lt.B_NK)
    else:
        from jax_sparse24._src import cuda_spmm_ops as cs

        def sparse(b2, wc, mk):
            values, meta = cc.masked_compress(wc, mk, transposed=transposed)  # one pass over W and M
            return cs.cutlass_spmm(values, meta, b2, m=m, k=k, config=_config(m, n, k, dtype))

    dense3 = lambda b2, wc, mk: dense(b2, masked_weight(wc, mk))  # noqa: E731
    return ffi.per_platform(dense3, sparse, b2, w.astype(dtype), _as_bool(mask))


def forward(x2, w, mask, *, backend: str, precision=None):
    dtype = jnp.result_type(x2, w)
    x2 = x2.astype(dtype)
    t, i = x2.shape
    o = w.shape[1]
    dense = lambda x2, wm: _dot(x2, wm, precision)  # noqa: E731
    chosen = choose(backend, o, t, i, dtype)
    if chosen not in ("cutlass", "cusparselt"):
        return dense(x2, masked_weight(w, mask).astype(dtype))
    # y (T, O) = x · W̃: D (T, O) with A = W̃ᵀ (O, I), 2:4 along I
    return _weight_gemm(chosen, x2, w, mask, dense, m=o, n=t, k=i, transposed=True, dtype=dtype)


def input_grad(g2, w, mask, *, transposable: bool, backend: str, precision=None):
    dtype = jnp.result_type(g2, w)
    g2 = g2.astype(dtype)
    t, o = g2.shape
    i = w.shape[0]
    dense = lambda g2, wm: _dot(g2, wm.T, precision)  # noqa: E731
    # ∇x needs W̃ 2:4 along `out`; without a transposable mask it stays dense.
    chosen = choose(backend, i, t, o, dtype) if transposable else "dense"
    if chosen not in ("cutlass", "cusparselt"):
        return dense(g2, masked_weight(w, mask).astype(dtype))
    # ∇x (T, I) = ∇y · W̃ᵀ: D (T, I) with A = W̃ (I, O), 2:4 along O
    return _weight_gemm(chosen, g2, w, mask, dense, m=i, n=t, k=o, transposed=False, dtype=dtype)


def weight_grad(x2, g2, *, backend: str, precision=None):
    # Dense GEMM (xᵀ·G): the sparse weight-gradient GEMM needs a fused MVUE+compress kernel.
    dtype = jnp.result_type(x2, g2)
    return _dot(x2.astype(dtype).T, g2.astype(dtype), precision)


# --- Sparse weight gradient (issue 4 item 2) ---------------------------------------------------
#: Token padding of the sparse weight-gradient GEMM: its K (= tokens) must be a multiple of 16.
_WGRAD_TOKEN_ALIGN = 16


def _pad_rows(a, multiple: int):
    pad = (-a.shape[0]) % multiple
    if pad:
        a = jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)], axis=0)
    return a


def _nearest_entry_kn(m: int, n: int, k: int, dtype):
    """The ``entries_kn`` entry of the nearest measured weight-gradient shape (same dtype), or None."""
    return _nearest("entries_kn", m, n, k, dtype)


def lookup_weight_grad(m: int, n: int, k: int, dtype):
    """Nearest measured weight-gradient shape (``entries_kn`` of the table): ``(speedup, config_id)`` or None.

    Keyed on the sparse GEMM of the weight gradient (M = O, N = I, K = T); the speedup counts the
    fused MVUE + compress pass against XLA's exact dense ``xᵀ·∇y`` (what ``auto`` runs otherwise).
    """
    e = _nearest_entry_kn(m, n, k, dtype)
    if e is None:
        return None
    from jax_sparse24._src import cuda_spmm_ops

    names = cuda_spmm_ops.cutlass_configs_kn()
    return e["speedup_with_compress"], (names.index(e["config"]) if e["config"] in names else -1)


def choose_weight_grad(backend: str, m: int, n: int, k: int, dtype) -> str:
    """Resolve ``backend`` for the MVUE weight gradient, D(m×n) = MVUE(∇y)ᵀ(m×k)·x(k×n) with m = O,
    n = I, k = padded tokens: ``"cutlass"`` (fused MVUE+compress, sparse GEMM) or ``"dense"``/``"reference"``.

    ``auto`` picks ``cutlass`` only where the table's ``entries_kn`` show the fused MVUE + sparse
    GEMM faster than XLA's exact dense ``xᵀ·∇y``, and ``cusparselt`` where they show the fused MVUE
    (cuSPARSELt's layout) + cuSPARSELt GEMM faster than that and than CUTLASS (bfloat16)."""
    if backend in ("dense", "reference"):
        return backend
    if backend == "cusparselt":
        return _choose_cusparselt(m, n, k, dtype)
    ok = ffi.extension() is not None
    if ok:
        from jax_sparse24._src import cuda_spmm_ops

        if not cuda_spmm_ops.cutlass_configs_kn():
            return "dense"  # a minimal build has no weight-gradient configuration: today's dense path
        ok = cuda_spmm_ops.cutlass_supports_kn(m, n, k, dtype)
    if backend == "cutlass":
        if not ok:
            reason = ffi.extension_error() or (
                f"the sparse weight-gradient GEMM does not support m=O={m}, n=I={n}, k=T={k}, "
                f"dtype={jnp.dtype(dtype)} (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: "
                "jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())")
            raise RuntimeError(f"backend='cutlass': {reason}")
        return "cutlass"
    if not (ok and ffi.cuda_kernels_available()):
        return "dense"
    e = _nearest_entry_kn(m, n, k, dtype)
    if e is None:
        return "dense"
    if _cusparselt_wins(e, e.get("cusparselt_speedup_with_compress"), e["speedup_with_compress"], m, n,
                        k + (-k) % 32, dtype, b_kn=True):
        return "cusparselt"
    return "cutlass" if e["speedup_with_compress"] > MIN_GAIN else "dense"


def weight_grad_path(backend: str, o: int, i: int, t: int, dtype) -> str:
    """How :func:`weight_grad_mvue` computes ``∇W (I, O)`` from ``t`` tokens: ``"cutlass"`` /
    ``"cusparselt"`` (fused MVUE + sparse GEMM), ``"exact"`` (``auto`` where that sparse path is not
    measured faster: MVUE exists to feed it, so XLA's exact ``xᵀ·∇y`` is both faster and noise-free)
    or ``"dense"`` / ``"reference"`` (the MVUE op, then the dense GEMM)."""
    chosen = choose_weight_grad(backend, o, i, t + (-t) % _WGRAD_TOKEN_ALIGN, dtype)
    if chosen not in ("cutlass", "cusparselt") and backend == "auto":
        return "exact"
    return chosen


def _mvue_weight_grad_reference(key, x2, g2, precision):
    """``xᵀ·MVUE(∇y)`` in plain jnp (tokens padded to a multiple of 4 with zero rows)."""
    from jax_sparse24._src import reference

    xp, gp = _pad_rows(x2, 4), _pad_rows(g2, 4)
    return _dot(xp.T, reference.mvue24(key, gp, axis=0), precision)


def weight_grad_mvue(key, x2, g2, *, backend: str, precision=None):
    """``∇W (I, O) = xᵀ·MVUE(∇y)``, MVUE groups of 4 along the token axis.

    ``cutlass`` (or ``auto`` where the measured table says so): one fused pass draws the MVUE sample
    of ``∇y`` and writes it compressed as the sparse GEMM's A operand (``MVUE(∇y)ᵀ``, no transpose
    materialised), then the "kn" sparse GEMM reads ``x`` in place. ``auto`` elsewhere (every CPU,
    and GPU shapes where the sparse path is measured slower than XLA's dense ``xᵀ·∇y``): the exact
    dense gradient, no MVUE. ``dense`` / ``reference``: the MVUE op (``ops.mvue24``) then the dense
    :func:`weight_grad` (the sparse path's math, for tests and quality studies). The CUDA sample is drawn with the
    same generator in both paths on a GPU (the CPU reference draws differently: same distribution).
    Under sharding the op runs on each device's shards (tokens, and O or I under tensor parallelism);
    a shard whose sizes the sparse kernel does not take draws the same sample and multiplies dense.

    Args:
      key: PRNG key of the MVUE sample.
      x2: (T, I) layer input; g2: (T, O) output gradient. Tokens are padded with zero rows (16 for
        the sparse kernel, 4 otherwise), which changes nothing: a zero gradient row stays zero.
    """
    dtype = jnp.result_type(x2, g2)
    t, i = x2.shape
    o = g2.shape[1]
    chosen = weight_grad_path(backend, o, i, t, dtype)
    if chosen not in ("cutlass", "cusparselt"):
        if chosen == "exact":
            return weight_grad(x2, g2, backend="dense", precision=precision)
        from jax_sparse24._src import ops

        gs = ops.mvue24(key, _pad_rows(g2, 4), axis=0)
        return weight_grad(_pad_rows(x2, 4), gs, backend=backend, precision=precision)
    x2, g2 = x2.astype(dtype), g2.astype(dtype)

    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import cuda_spmm_ops as cs
    from jax_sparse24._src import sharding as _sh

    def reference_fn(key, x2, g2):
        return _mvue_weight_grad_reference(key, x2, g2, precision)

    def local(key, x2, g2):
        # On the local shards: the tokens of a data-parallel shard, and O (or I) of a tensor-parallel
        # one — every size below comes from the shards, never from the global (o, i, t) above.
        tl, i = x2.shape
        o = g2.shape[1]
        tlp = tl + (-tl) % _WGRAD_TOKEN_ALIGN
        cfg = lookup_weight_grad(o, i, tlp, dtype)

        def mvue_dense(key, x2, g2):  # a shard the sparse kernel cannot take: the same draws, dense GEMM
            from jax_sparse24._src import cuda_mask_ops

            gs = cuda_mask_ops.mvue24_cuda(key, _pad_rows(g2, _WGRAD_TOKEN_ALIGN), axis=0)
            return _dot(_pad_rows(x2, _WGRAD_TOKEN_ALIGN).T, gs, precision)

        def sparse(key, x2, g2):
            values, meta = cc.mvue24_compress(key, _pad_rows(g2, _WGRAD_TOKEN_ALIGN), transposed=True)
            return cs.cutlass_spmm_kn(values, meta, _pad_rows(x2, _WGRAD_TOKEN_ALIGN), m=o, k=tlp,
                                      config=-1 if cfg is None else cfg[1])  # (I, O)

        def sparse_lt(key, x2, g2):  # MVUE kernel, cuSPARSELt compress, A = MVUE(∇y) (T, O) = (K, M)
            from jax_sparse24._src import cuda_cusparselt_ops as lt
            from jax_sparse24._src import cuda_mask_ops

            tl32 = tl + (-tl) % 32  # the fused compressor's cuSPARSELt layout needs K % 32
            if lt.fused_compress_ok(o, i, tl32, dtype, lt.B_KN):
                # one pass: MVUE(∇y)ᵀ (O, T) = (M, K) drawn and compressed (same draws as mvue24_cuda)
                ca = cc.mvue24_compress(key, _pad_rows(g2, 32), transposed=True, layout="cusparselt")
                return lt.cusparselt_spmm(ca, _pad_rows(x2, 32), m=o, n=i, k=tl32, a_layout=lt.A_MK,
                                          b_layout=lt.B_KN)  # (I, O)
            gs = cuda_mask_ops.mvue24_cuda(key, _pad_rows(g2, _WGRAD_TOKEN_ALIGN), axis=0)
            ca = lt.cusparselt_compress(gs, m=o, n=i, k=tlp, a_layout=lt.A_KM, b_layout=lt.B_KN)
            return lt.cusparselt_spmm(ca, _pad_rows(x2, _WGRAD_TOKEN_ALIGN), m=o, n=i, k=tlp, a_layout=lt.A_KM,
                                      b_layout=lt.B_KN)  # (I, O)

        if chosen == "cusparselt":
            from jax_sparse24._src import cuda_cusparselt_ops as lt

            cuda_fn = sparse_lt if lt.cusparselt_supports(o, i, tlp, dtype) else mvue_dense
        else:
            cuda_fn = sparse if cs.cutlass_supports_kn(o, i, tlp, dtype) else mvue_dense
        return ffi.per_platform(reference_fn, cuda_fn, key, x2, g2)

    # Partitioned like the dense weight gradient (tokens contracted: psum over a sharded token axis),
    # with the key folded with the index of the token shard as the MVUE op does (sharding.mvue_rule),
    # so every shard draws its own sample — the same draws as the unfused path.
    typed = jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key)
    kdims = () if typed else tuple(f"k{j}" for j in range(jnp.ndim(key)))
    rule = _sh.Rule("sparse24 weight-gradient GEMM (MVUE)", (kdims, ("t", "i"), ("t", "o")), (("i", "o"),),
                    contract=("t",), multiple_of=(("t", 4),), replicated=kdims, fold_key=(0, 2))
    return _sh.partitioned(rule, local, reference_fn=reference_fn)(key, x2, g2)


# --- Prepared weights: compress once, use for many calls -----------------------------------------
# Within one optimizer step the weight, its mask and therefore W̃ = W ⊙ M do not change, but every
# micro-batch of a gradient-accumulation loop calls the layer again — and XLA does not hoist the
# compression out of the loop (scripts/probe_hoist.py). ``prepare`` does that weight work once:
# the compressed W̃ᵀ (forward operand) and W̃ (input-gradient operand) where the sparse GEMM is
# chosen, the masked dense W̃ in the compute dtype where a dense GEMM is.

#: Keys of a prepared weight (a dict): ``"forward"`` / ``"input_grad"`` hold the compressed operand
#: (W̃ᵀ, W̃) when that GEMM runs sparse — ``{"values", "meta"}`` for CUTLASS, ``{"cusparselt"}`` (one
#: uint8 buffer, A stored (M, K)) for cuSPARSELt; ``"masked"`` holds W̃ when a GEMM runs dense.
PREPARED_KEYS = ("forward", "input_grad", "masked")
_OPERAND_KEYS = {"cutlass": ("values", "meta"), "cusparselt": ("cusparselt",)}


def weight_gemms_plan(backend: str, tokens: int, i: int, o: int, dtype, *, transposable: bool,
                      reuse: int | None = None):
    """``(forward, input_grad)`` kernels of a layer ``(i, o)`` at ``tokens`` rows (:func:`choose`;
    ``reuse``: a weight prepared for that many calls). Without a transposable mask ``∇x`` is dense."""
    fwd = choose(backend, o, tokens, i, dtype, reuse=reuse)
    if transposable:
        dx = choose(backend, i, tokens, o, dtype, reuse=reuse)
    else:
        dx = "reference" if backend == "reference" else "dense"
    return fwd, dx


def _mk_of(name: str, i: int, o: int) -> tuple[int, int]:
    """(M, K) of a weight GEMM's 2:4 operand: forward A = W̃ᵀ (O, I), input gradient A = W̃ (I, O)."""
    return (o, i) if name == "forward" else (i, o)


def _prepare_cutlass(wc, mk, names, dtype):
    """CUTLASS operands ``{"values", "meta"}`` of the GEMMs ``names`` (one pass over W for both)."""
    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import cuda_spmm_ops as cs

    i, o = wc.shape

    def cuda(wc, mk):
        if len(names) == 2:
            return cc.masked_compress_both(wc, mk)
        return (cc.masked_compress(wc, mk, transposed=names[0] == "forward"),)

    def placeholder(wc, mk):  # a non-CUDA platform never reads these (its GEMMs use w and mask)
        return tuple((jnp.zeros(vs, dtype), jnp.zeros(ms, jnp.uint8))
                     for vs, ms in (cs.cutlass_compressed_shapes(*_mk_of(n, i, o), dtype) for n in names))

    return {name: {"values": v, "meta": m} for name, (v, m) in zip(names, ffi.per_platform(placeholder, cuda, wc, mk))}


def _lt_prepared_a_layout(name: str, dtype) -> int:
    """cuSPARSELt's A layout of a prepared operand — the per-call path's (:func:`_weight_gemm`):
    bfloat16 A stored (M, K) (our fused compressor, or the library's on the transposed W̃ where the
    layout check fails); float16 (library compressor) W̃ as stored, (K, M) for the forward."""
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) or name != "forward":
        return lt.A_MK
    return lt.A_KM


def _prepare_cusparselt(wc, mk, names, tokens: int, dtype):
    """cuSPARSELt operands ``{"cusparselt"}`` (plan with ``tokens`` rows of B, A layout
    :func:`_lt_prepared_a_layout`) of the GEMMs ``names``: written by our fused compressor where its
    layout check passes (bfloat16), else by ``cusparseLtSpMMACompress`` on the masked weight (once
    per preparation)."""
    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    i, o = wc.shape
    plans = {n: _mk_of(n, i, o) for n in names}
    layouts = {n: _lt_prepared_a_layout(n, dtype) for n in names}
    fused = {n: layouts[n] == lt.A_MK and lt.fused_compress_ok(m, tokens, k, dtype) for n, (m, k) in plans.items()}
    sizes = {n: lt.cusparselt_compressed_size(m, tokens, k, dtype, layouts[n], lt.B_NK) for n, (m, k) in plans.items()}

    def cuda(wc, mk):
        if len(names) == 2 and all(fused.values()):
            return cc.masked_compress_both(wc, mk, layout="cusparselt")  # (W̃ᵀ, W̃): forward, input_grad
        out = []
        for n in names:
            if fused[n]:
                out.append(cc.masked_compress(wc, mk, transposed=n == "forward", layout="cusparselt"))
                continue
            a = masked_weight(wc, mk)  # (I, O): the forward's A stored (K, M), the input gradient's (M, K)
            if n == "forward" and layouts[n] == lt.A_MK:
                a = a.T
            m, k = plans[n]
            out.append(lt.cusparselt_compress(a, m=m, n=tokens, k=k, a_layout=layouts[n], b_layout=lt.B_NK))
        return tuple(out)

    def placeholder(wc, mk):
        return tuple(jnp.zeros((sizes[n],), jnp.uint8) for n in names)

    return {name: {"cusparselt": buf} for name, buf in zip(names, ffi.per_platform(placeholder, cuda, wc, mk))}


def prepare(w, mask, *, tokens: int, dtype, backend: str, transposable: bool, reuse: int) -> dict:
    """The prepared weight of ``w ⊙ mask`` (keys :data:`PREPARED_KEYS`); no gradient flows through it."""
    i, o = w.shape
    fwd, dx = weight_gemms_plan(backend, tokens, i, o, dtype, transposable=transposable, reuse=reuse)
    wc, mk = jnp.asarray(w).astype(dtype), _as_bool(mask)
    kinds = {"forward": fwd, "input_grad": dx}
    out = {}
    cutlass = tuple(n for n, kd in kinds.items() if kd == "cutlass")
    if cutlass:
        out.update(_prepare_cutlass(wc, mk, cutlass, dtype))
    cusparselt = tuple(n for n, kd in kinds.items() if kd == "cusparselt")
    if cusparselt:
        out.update(_prepare_cusparselt(wc, mk, cusparselt, int(tokens), dtype))
    if len(out) < 2:
        out["masked"] = masked_weight(wc, mk)
    return jax.tree.map(jax.lax.stop_gradient, out)


def prepared_backend(entry) -> str:
    """``"cutlass"`` or ``"cusparselt"``: the format of one prepared operand (``prepared["forward"]``)."""
    for backend, keys in _OPERAND_KEYS.items():
        if isinstance(entry, dict) and set(entry) == set(keys):
            return backend
    got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
    raise ValueError(f"a prepared operand must be {{'values', 'meta'}} (CUTLASS) or {{'cusparselt'}}, got {got}")


def check_prepared(prepared, w, dtype, op: str) -> None:
    """Trace-time check that ``prepared`` is a prepared weight of ``w``'s shape for ``dtype``."""
    from jax_sparse24._src import cuda_spmm_ops as cs

    if not isinstance(prepared, dict) or not prepared or set(prepared) - set(PREPARED_KEYS):
        got = sorted(prepared) if isinstance(prepared, dict) else type(prepared).__name__
        raise ValueError(f"{op}: prepared must be the dict made by jax_sparse24.prepare_weight (keys among "
                         f"{PREPARED_KEYS}), got {got}")
    i, o = w.shape
    dtype = jnp.dtype(dtype)
    for need in ("forward", "input_grad"):
        if need not in prepared and "masked" not in prepared:
            raise ValueError(f"{op}: prepared has neither {need!r} nor 'masked': not made by prepare_weight")
    if "masked" in prepared:
        m = prepared["masked"]
        if tuple(jnp.shape(m)) != (i, o) or jnp.result_type(m) != dtype:
            raise ValueError(f"{op}: prepared['masked'] must be W̃ of w's shape {(i, o)} in the compute dtype "
                             f"{dtype.name}, got {tuple(jnp.shape(m))} {jnp.result_type(m).name} (prepare the "
                             "weight with the dtype the layer computes in)")
    for name in ("forward", "input_grad"):
        if name not in prepared:
            continue
        entry = prepared[name]
        try:
            backend = prepared_backend(entry)
        except ValueError as e:
            raise ValueError(f"{op}: prepared[{name!r}]: {e}") from None
        mm, kk = _mk_of(name, i, o)
        if backend == "cusparselt":
            buf = entry["cusparselt"]
            # the exact byte count belongs to the plan; cusparselt_spmm checks it on the GPU
            if jnp.ndim(buf) != 1 or jnp.result_type(buf) != jnp.uint8:
                raise ValueError(f"{op}: prepared[{name!r}]['cusparselt'] must be a 1-D uint8 buffer, got "
                                 f"{tuple(jnp.shape(buf))} {jnp.result_type(buf).name}")
            if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
                raise ValueError(f"{op}: a cuSPARSELt prepared weight computes in bfloat16/float16, the layer in "
                                 f"{dtype.name}")
            continue
        (vs, ms) = cs.cutlass_compressed_shapes(mm, kk, dtype)
        values, meta = entry["values"], entry["meta"]
        if (tuple(jnp.shape(values)), jnp.result_type(values)) != (tuple(vs), dtype) or (
                tuple(jnp.shape(meta)), jnp.result_type(meta)) != (tuple(ms), jnp.dtype(jnp.uint8)):
            raise ValueError(
                f"{op}: prepared[{name!r}] does not match w {(i, o)} in {dtype.name}: values "
                f"{tuple(jnp.shape(values))} {jnp.result_type(values).name} (want {tuple(vs)} {dtype.name}), meta "
                f"{tuple(jnp.shape(meta))} {jnp.result_type(meta).name} (want {tuple(ms)} uint8)")


def _prepared_gemm(b2, w, mask, *operand, m: int, k: int, orient, dtype, precision, a_layout: int = 0):
    """D(m×T)ᵀ = b2 · orient(W̃) with A = orient(W̃)ᵀ already compressed: ``operand`` is CUTLASS's
    ``(values, meta)`` or cuSPARSELt's ``(buffer,)`` (A layout ``a_layout``); ``w`` and ``mask`` feed
    the reference lowering on non-CUDA platforms."""
    t = b2.shape[0]

    def sparse(b2, wc, mk, *operand):
        if len(operand) == 1:  # cuSPARSELt, B = b2 (T, K)
            from jax_sparse24._src import cuda_cusparselt_ops as lt

            return lt.cusparselt_spmm(operand[0], b2, m=m, n=t, k=k, a_layout=a_layout, b_layout=lt.B_NK)
        from jax_sparse24._src import cuda_spmm_ops as cs

        values, meta = operand
        return cs.cutlass_spmm(values, meta, b2, m=m, k=k, config=_config(m, t, k, dtype))  # (T, m)

    def dense(b2, wc, mk, *operand):
        return _dot(b2, orient(masked_weight(wc, mk)), precision)

    return ffi.per_platform(dense, sparse, b2.astype(dtype), w.astype(dtype), _as_bool(mask), *operand)


def _forward_prepared(x2, w, mask, *operand, dtype, precision=None):
    i, o = w.shape
    return _prepared_gemm(x2, w, mask, *operand, m=o, k=i, orient=lambda a: a, dtype=dtype, precision=precision,
                          a_layout=_lt_prepared_a_layout("forward", dtype) if len(operand) == 1 else 0)


def _input_grad_prepared(g2, w, mask, *operand, dtype, precision=None):
    i, o = w.shape
    return _prepared_gemm(g2, w, mask, *operand, m=i, k=o, orient=lambda a: a.T, dtype=dtype, precision=precision,
                          a_layout=_lt_prepared_a_layout("input_grad", dtype) if len(operand) == 1 else 0)


def _prepared_dtype(entry):
    return jnp.result_type(entry["values"]) if "values" in entry else None


def forward_prepared(x2, w, mask, entry, *, precision=None):
    """``x·W̃`` with W̃ᵀ already compressed (``entry = prepared["forward"]``: M = O, K = I)."""
    backend = prepared_backend(entry)
    dtype = _prepared_dtype(entry) or jnp.result_type(x2, w)
    return _FORWARD_PREPARED[backend](x2, w, mask, *(entry[k] for k in _OPERAND_KEYS[backend]), dtype=dtype,
                                      precision=precision)


def input_grad_prepared(g2, w, mask, entry, *, precision=None):
    """``∇y·W̃ᵀ`` with W̃ already compressed (``entry = prepared["input_grad"]``: M = I, K = O)."""
    backend = prepared_backend(entry)
    dtype = _prepared_dtype(entry) or jnp.result_type(g2, w)
    return _INPUT_GRAD_PREPARED[backend](g2, w, mask, *(entry[k] for k in _OPERAND_KEYS[backend]), dtype=dtype,
                                         precision=precision)


# --- Sharding (issue 6) -----------------------------------------------------------------------
# Each GEMM above runs as one custom-partitioned op (rules: _src/sharding.py, gemm_rule): under
# jit + NamedSharding it is called on the local shards (local shapes, so the backend choice and any
# compression are per shard) with a psum over a sharded contraction axis, instead of having its
# operands all-gathered. Keep these lines last: they wrap the final definitions.
from jax_sparse24._src import sharding as _sharding  # noqa: E402

forward = _sharding.partitioned_gemm("forward")(forward)
input_grad = _sharding.partitioned_gemm("input_grad")(input_grad)
weight_grad = _sharding.partitioned_gemm("weight_grad")(weight_grad)
# A prepared operand is the compression of the whole weight, so its GEMM keeps the weight whole
# (replicated: data parallelism); tokens may still be sharded. See sharding.gemm_rule(prepared=...).
_FORWARD_PREPARED = {b: _sharding.partitioned_gemm("forward", prepared=b)(_forward_prepared) for b in _OPERAND_KEYS}
_INPUT_GRAD_PREPARED = {b: _sharding.partitioned_gemm("input_grad", prepared=b)(_input_grad_prepared)
                        for b in _OPERAND_KEYS}
