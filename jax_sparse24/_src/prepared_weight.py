"""Prepared weights: the weight work of a 2:4 linear layer done once for many calls, and the two
GEMMs that read it.

Within one optimizer step the weight, its mask and therefore W̃ = W ⊙ M do not change, but every
micro-batch of a gradient-accumulation loop calls the layer again — and XLA does not hoist the
compression out of the loop (scripts/probe_hoist.py). :func:`prepare` does that weight work once:
the compressed W̃ᵀ (forward operand) and W̃ (input-gradient operand) where the sparse GEMM is
chosen (:func:`~jax_sparse24._src.autotune.weight_gemms_plan` with the preparation's cost, a share
of a per-call compression, amortized over ``reuse`` calls), the masked dense W̃ in the compute dtype
where a dense GEMM is.
:func:`check_prepared` checks one at trace time; :func:`forward_prepared` and
:func:`input_grad_prepared` run the GEMMs on its compressed operands (the per-call GEMMs are in
:mod:`jax_sparse24._src.gemm`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jax_sparse24._src import autotune, ffi
from jax_sparse24._src.gemm import bool_mask, masked_weight

__all__ = ["PREPARED_KEYS", "WeightPlan", "plan", "prepare", "prepare_many", "prepared_backend", "check_prepared",
           "forward_prepared", "input_grad_prepared"]

#: Keys of a prepared weight (a dict): ``"forward"`` / ``"input_grad"`` hold the compressed operand
#: (W̃ᵀ, W̃) when that GEMM runs sparse — ``{"values", "meta"}`` for CUTLASS, ``{"cusparselt"}`` (one
#: uint8 buffer, A stored (M, K)) for cuSPARSELt; ``"masked"`` holds W̃ when a GEMM runs dense.
PREPARED_KEYS = ("forward", "input_grad", "masked")
_OPERAND_KEYS = {"cutlass": ("values", "meta"), "cusparselt": ("cusparselt",)}


def _mk_of(name: str, i: int, o: int) -> tuple[int, int]:
    """(M, K) of a weight GEMM's 2:4 operand: forward A = W̃ᵀ (O, I), input gradient A = W̃ (I, O)."""
    return (o, i) if name == "forward" else (i, o)


def _lt_prepared_a_layout(name: str, dtype) -> int:
    """cuSPARSELt's A layout of a prepared operand — the per-call path's (``gemm._weight_gemm``):
    bfloat16 A stored (M, K) (our fused compressor, or the library's on the transposed W̃ where the
    layout check fails); float16 (library compressor) W̃ as stored, (K, M) for the forward."""
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) or name != "forward":
        return lt.A_MK
    return lt.A_KM


class WeightPlan(NamedTuple):
    """The weight work of one layer, decided at trace time (:func:`plan`) and run by :func:`prepare_many`.

    ``cutlass`` / ``cusparselt``: the GEMMs (``"forward"``, ``"input_grad"``) whose 2:4 operand is
    prepared in that backend's format; W̃ itself is kept when fewer than two are.
    """

    wc: Any  # w in the compute dtype
    mk: Any  # the bool mask
    dtype: Any
    tokens: int
    cutlass: tuple
    cusparselt: tuple


class _Unit(NamedTuple):
    """One compression of a plan: ``layout`` ``"cutlass"`` or ``"cusparselt"`` (our fused compressor,
    groupable across layers by ``direction``) or ``"library"`` (``cusparseLtSpMMACompress`` of one
    GEMM's operand, per layer); ``shapes``: its flat outputs (per name: values, meta / one buffer)."""

    plan: int
    layout: str
    direction: str | None
    names: tuple
    shapes: tuple


def plan(w, mask, *, tokens: int, dtype, backend: str, transposable: bool, reuse: int,
         batched: bool = False) -> WeightPlan:
    """Which operands the prepared weight of ``w ⊙ mask`` holds (the GEMMs' plan; ``batched``: it will
    be prepared together with other layers); nothing computed yet."""
    i, o = w.shape
    fwd, dx = autotune.weight_gemms_plan(backend, tokens, i, o, dtype, transposable=transposable, reuse=reuse,
                                         batched=batched)
    kinds = {"forward": fwd, "input_grad": dx}
    return WeightPlan(jnp.asarray(w).astype(dtype), bool_mask(mask), jnp.dtype(dtype), int(tokens),
                      tuple(n for n, kd in kinds.items() if kd == "cutlass"),
                      tuple(n for n, kd in kinds.items() if kd == "cusparselt"))


def _direction(names) -> str:
    """``masked_compress_many``'s direction writing the operands of ``names``, in that order."""
    if len(names) == 2:
        return "both"  # (W̃ᵀ, W̃): forward, input_grad
    return "transposed" if names[0] == "forward" else "direct"


def _units(index: int, p: WeightPlan) -> list[_Unit]:
    """The compressions of plan ``p``: one pass over W for CUTLASS's operands; for cuSPARSELt's, one
    pass where our fused compressor writes every operand (its layout check passes: bfloat16), else
    one per GEMM (fused, or the library's compressor on the masked weight)."""
    from jax_sparse24._src import cuda_cusparselt_ops as lt
    from jax_sparse24._src import cuda_spmm_ops as cs

    i, o = p.wc.shape
    units = []
    if p.cutlass:
        shapes = []
        for n in p.cutlass:
            vs, ms = cs.cutlass_compressed_shapes(*_mk_of(n, i, o), p.dtype)
            shapes += [jax.ShapeDtypeStruct(vs, p.dtype), jax.ShapeDtypeStruct(ms, jnp.uint8)]
        units.append(_Unit(index, "cutlass", _direction(p.cutlass), p.cutlass, tuple(shapes)))
    if p.cusparselt:
        plans = {n: _mk_of(n, i, o) for n in p.cusparselt}
        layouts = {n: _lt_prepared_a_layout(n, p.dtype) for n in p.cusparselt}
        fused = {n: layouts[n] == lt.A_MK and lt.fused_compress_ok(m, p.tokens, k, p.dtype)
                 for n, (m, k) in plans.items()}
        shape = {n: jax.ShapeDtypeStruct((lt.cusparselt_compressed_size(m, p.tokens, k, p.dtype, layouts[n], lt.B_NK),),
                                         jnp.uint8) for n, (m, k) in plans.items()}
        if len(p.cusparselt) == 2 and all(fused.values()):
            units.append(_Unit(index, "cusparselt", "both", p.cusparselt, tuple(shape[n] for n in p.cusparselt)))
        else:
            for n in p.cusparselt:
                units.append(_Unit(index, "cusparselt" if fused[n] else "library",
                                   _direction((n,)) if fused[n] else None, (n,), (shape[n],)))
    return units


def _library_compress(p: WeightPlan, name: str, wc, mk):
    """cuSPARSELt's compressor on the masked weight (once per preparation): the forward's A stored
    (K, M) = W̃ as is, or (M, K) = W̃ᵀ; the input gradient's A = W̃ stored (M, K)."""
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    i, o = wc.shape
    layout = _lt_prepared_a_layout(name, p.dtype)
    a = masked_weight(wc, mk)
    if name == "forward" and layout == lt.A_MK:
        a = a.T
    m, k = _mk_of(name, i, o)
    return lt.cusparselt_compress(a, m=m, n=p.tokens, k=k, a_layout=layout, b_layout=lt.B_NK)


def _flat(result, unit: _Unit) -> list:
    """A ``masked_compress_many`` result of ``unit`` as its flat outputs (per name: values, meta / buffer)."""
    per_name = result if unit.direction == "both" else (result,)
    if unit.layout == "cutlass":
        return [a for pair in per_name for a in pair]
    return list(per_name)


def _entries(unit: _Unit, flat) -> dict:
    """``{name: operand}`` from a unit's flat outputs (``_OPERAND_KEYS`` of its format)."""
    keys = _OPERAND_KEYS["cutlass" if unit.layout == "cutlass" else "cusparselt"]
    return {n: dict(zip(keys, flat[j * len(keys):(j + 1) * len(keys)])) for j, n in enumerate(unit.names)}


def prepare_many(plans, *, batched: bool = True) -> list[dict]:
    """The prepared weights of ``plans`` (:func:`plan`), in order (keys :data:`PREPARED_KEYS`).

    ``batched``: the fused compressions of all plans run as one ``masked_compress_many`` per
    (dtype, format, direction) — one launch per 64 weights instead of one per weight — else each as
    its own call (the one-tensor compressors). The results are the same bits either way; on a
    non-CUDA platform both are placeholders (its GEMMs read ``w`` and ``mask``). One
    ``platform_dependent`` covers all plans. No gradient flows through the result.
    """
    from jax_sparse24._src import cuda_compress_ops as cc

    plans = list(plans)
    units = [u for j, p in enumerate(plans) for u in _units(j, p)]
    flat_args = [a for p in plans for a in (p.wc, p.mk)]

    def cuda(*args):
        outs = [None] * len(units)
        groups = {}
        for j, u in enumerate(units):
            if u.layout == "library":
                outs[j] = [_library_compress(plans[u.plan], u.names[0], args[2 * u.plan], args[2 * u.plan + 1])]
            else:
                key = (u.layout, u.direction, plans[u.plan].dtype) + (() if batched else (j,))
                groups.setdefault(key, []).append(j)
        for (layout, direction, *_), js in groups.items():
            results = cc.masked_compress_many([args[2 * units[j].plan] for j in js],
                                              [args[2 * units[j].plan + 1] for j in js],
                                              direction=direction, layout=layout)
            for j, r in zip(js, results):
                outs[j] = _flat(r, units[j])
        return tuple(a for o in outs for a in o)

    def placeholder(*args):  # a non-CUDA platform never reads these (its GEMMs use w and mask)
        return tuple(jnp.zeros(sd.shape, sd.dtype) for u in units for sd in u.shapes)

    flat = list(ffi.per_platform(placeholder, cuda, *flat_args)) if units else []
    out = [{} for _ in plans]
    for u in units:
        out[u.plan].update(_entries(u, flat[:len(u.shapes)]))
        flat = flat[len(u.shapes):]
    for p, o in zip(plans, out):
        if len(o) < 2:
            o["masked"] = masked_weight(p.wc, p.mk)
    return [jax.tree.map(jax.lax.stop_gradient, o) for o in out]


def prepare(w, mask, *, tokens: int, dtype, backend: str, transposable: bool, reuse: int) -> dict:
    """The prepared weight of ``w ⊙ mask`` (keys :data:`PREPARED_KEYS`); no gradient flows through it."""
    return prepare_many([plan(w, mask, tokens=tokens, dtype=dtype, backend=backend, transposable=transposable,
                              reuse=reuse)])[0]


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

