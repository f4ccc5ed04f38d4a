"""Prepared weights: the weight work of a 2:4 linear layer done once for many calls, and the two
GEMMs that read it.

Within one optimizer step the weight, its mask and therefore W̃ = W ⊙ M do not change, but every
micro-batch of a gradient-accumulation loop calls the layer again — and XLA does not hoist the
compression out of the loop (scripts/probe_hoist.py). :func:`prepare` does that weight work once:
the compressed W̃ᵀ (forward operand) and W̃ (input-gradient operand) where the sparse GEMM is
chosen (:func:`~jax_sparse24._src.autotune.weight_gemms_plan` with the compression amortized over
``reuse`` calls), the masked dense W̃ in the compute dtype where a dense GEMM is.
:func:`check_prepared` checks one at trace time; :func:`forward_prepared` and
:func:`input_grad_prepared` run the GEMMs on its compressed operands (the per-call GEMMs are in
:mod:`jax_sparse24._src.gemm`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse24._src import autotune, ffi
from jax_sparse24._src.gemm import bool_mask, masked_weight

__all__ = ["PREPARED_KEYS", "prepare", "prepared_backend", "check_prepared", "forward_prepared",
           "input_grad_prepared"]

#: Keys of a prepared weight (a dict): ``"forward"`` / ``"input_grad"`` hold the compressed operand
#: (W̃ᵀ, W̃) when that GEMM runs sparse — ``{"values", "meta"}`` for CUTLASS, ``{"cusparselt"}`` (one
#: uint8 buffer, A stored (M, K)) for cuSPARSELt; ``"masked"`` holds W̃ when a GEMM runs dense.
PREPARED_KEYS = ("forward", "input_grad", "masked")
_OPERAND_KEYS = {"cutlass": ("values", "meta"), "cusparselt": ("cusparselt",)}


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
    """cuSPARSELt's A layout of a prepared operand — the per-call path's (``gemm._weight_gemm``):
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
    fwd, dx = autotune.weight_gemms_plan(backend, tokens, i, o, dtype, transposable=transposable, reuse=reuse)
    wc, mk = jnp.asarray(w).astype(dtype), bool_mask(mask)
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
        return cs.cutlass_spmm(values, meta, b2, m=m, k=k,
                               config=autotune.cutlass_config(m, t, k, dtype))  # (T, m)

    def dense(b2, wc, mk, *operand):
        return jnp.dot(b2, orient(masked_weight(wc, mk)), precision=precision)

    return ffi.per_platform(dense, sparse, b2.astype(dtype), w.astype(dtype), bool_mask(mask), *operand)


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
# Each prepared GEMM above runs as one custom-partitioned op per operand format (rules:
# _src/sharding.py, gemm_rule(prepared=...)), like the per-call GEMMs at the end of gemm.py. Keep
# these lines last: they wrap the final definitions.
from jax_sparse24._src import sharding as _sharding  # noqa: E402

# A prepared operand is the compression of the whole weight, so its GEMM keeps the weight whole
# (replicated: data parallelism); tokens may still be sharded. See sharding.gemm_rule(prepared=...).
_FORWARD_PREPARED = {b: _sharding.partitioned_gemm("forward", prepared=b)(_forward_prepared) for b in _OPERAND_KEYS}
_INPUT_GRAD_PREPARED = {b: _sharding.partitioned_gemm("input_grad", prepared=b)(_input_grad_prepared)
                        for b in _OPERAND_KEYS}

