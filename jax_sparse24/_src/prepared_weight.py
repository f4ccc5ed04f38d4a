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

from jax_sparse24._src import autotune, ffi, sharding
from jax_sparse24._src import cuda_compress_ops as cc
from jax_sparse24._src.backends import CUSPARSELT, CUTLASS, Backend, bool_mask, masked_weight

__all__ = ["PREPARED_KEYS", "WeightPlan", "plan", "prepare", "prepare_many", "prepared_backend", "check_prepared",
           "forward_prepared", "input_grad_prepared"]

#: Keys of a prepared weight (a dict): ``"forward"`` / ``"input_grad"`` hold the compressed operand
#: (W̃ᵀ, W̃) when that GEMM runs sparse — ``{"values", "meta"}`` for CUTLASS, ``{"cusparselt"}`` (one
#: uint8 buffer, A stored (M, K)) for cuSPARSELt; ``"masked"`` holds W̃ when a GEMM runs dense.
PREPARED_KEYS = ("forward", "input_grad", "masked")
#: The backends with prepared operands, by name: each operand is a dict of its ``operand_keys``.
_PREPARABLE = {b.name: b for b in (CUTLASS, CUSPARSELT)}
_OPERAND_KEYS = {name: b.operand_keys for name, b in _PREPARABLE.items()}


def _mk_of(name: str, i: int, o: int) -> tuple[int, int]:
    """(M, K) of a weight GEMM's 2:4 operand: forward A = W̃ᵀ (O, I), input gradient A = W̃ (I, O)."""
    return (o, i) if name == "forward" else (i, o)


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
                      tuple(n for n, kd in kinds.items() if kd == CUTLASS.name),
                      tuple(n for n, kd in kinds.items() if kd == CUSPARSELT.name))


def _direction(names) -> str:
    """``masked_compress_many``'s direction writing the operands of ``names``, in that order."""
    if len(names) == 2:
        return "both"  # (W̃ᵀ, W̃): forward, input_grad
    return "transposed" if names[0] == "forward" else "direct"


def _units(index: int, p: WeightPlan) -> list[_Unit]:
    """The compressions of plan ``p``: one pass over W for CUTLASS's operands; for cuSPARSELt's, one
    pass where our fused compressor writes every operand (its layout check passes: bfloat16), else
    one per GEMM (fused, or the library's compressor on the masked weight)."""
    i, o = p.wc.shape
    units = []
    if p.cutlass:
        shapes = [sd for n in p.cutlass for sd in CUTLASS.operand_shapes(*_mk_of(n, i, o), p.tokens, p.dtype)]
        units.append(_Unit(index, CUTLASS.name, _direction(p.cutlass), p.cutlass, tuple(shapes)))
    if p.cusparselt:
        plans = {n: _mk_of(n, i, o) for n in p.cusparselt}
        layouts = {n: CUSPARSELT.prepared_a_layout(n, p.dtype) for n in p.cusparselt}
        fused = {n: layouts[n] == CUSPARSELT.FUSED_A_LAYOUT and CUSPARSELT.fused_operand_ok(m, p.tokens, k, p.dtype)
                 for n, (m, k) in plans.items()}
        shape = {n: CUSPARSELT.operand_shapes(m, k, p.tokens, p.dtype, layouts[n])[0] for n, (m, k) in plans.items()}
        if len(p.cusparselt) == 2 and all(fused.values()):
            units.append(_Unit(index, CUSPARSELT.name, "both", p.cusparselt, tuple(shape[n] for n in p.cusparselt)))
        else:
            for n in p.cusparselt:
                units.append(_Unit(index, CUSPARSELT.name if fused[n] else "library",
                                   _direction((n,)) if fused[n] else None, (n,), (shape[n],)))
    return units


def _library_compress(p: WeightPlan, name: str, wc, mk):
    """cuSPARSELt's compressor on the masked weight (once per preparation)."""
    m, k = _mk_of(name, *wc.shape)
    return CUSPARSELT.library_compress(name, wc, mk, m=m, k=k, tokens=p.tokens, dtype=p.dtype)


def _flat(result, unit: _Unit) -> list:
    """A ``masked_compress_many`` result of ``unit`` as its flat outputs (per name: values, meta / buffer)."""
    per_name = result if unit.direction == "both" else (result,)
    if unit.layout == CUTLASS.name:
        return [a for pair in per_name for a in pair]
    return list(per_name)


def _entries(unit: _Unit, flat) -> dict:
    """``{name: operand}`` from a unit's flat outputs (``_OPERAND_KEYS`` of its format)."""
    keys = _OPERAND_KEYS[CUTLASS.name if unit.layout == CUTLASS.name else CUSPARSELT.name]
    return {n: dict(zip(keys, flat[j * len(keys):(j + 1) * len(keys)])) for j, n in enumerate(unit.names)}


def prepare_many(plans, *, batched: bool = True) -> list[dict]:
    """The prepared weights of ``plans`` (:func:`plan`), in order (keys :data:`PREPARED_KEYS`).

    ``batched``: the fused compressions of all plans run as one ``masked_compress_many`` per
    (dtype, format, direction) — one launch per 64 weights instead of one per weight — else each as
    its own call (the one-tensor compressors). The results are the same bits either way; on a
    non-CUDA platform both are placeholders (its GEMMs read ``w`` and ``mask``). One
    ``platform_dependent`` covers all plans. No gradient flows through the result.
    """
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
        _PREPARABLE[backend].check_operand(entry, name, *_mk_of(name, i, o), dtype, w_shape=(i, o), op=op)


def _prepared_gemm(b2, w, mask, *operand, backend: Backend, name: str, dtype, precision):
    """D(m×T)ᵀ = b2 · orient(W̃) with A = orient(W̃)ᵀ already compressed in ``backend``'s format
    (``operand``: its arrays, :attr:`~jax_sparse24._src.backends.base.Backend.operand_keys`); ``w`` and
    ``mask`` feed the reference lowering on non-CUDA platforms. Runs on the local shards (the
    partitioned op of :func:`forward_prepared` / :func:`input_grad_prepared`)."""
    i, o = w.shape
    m, k = _mk_of(name, i, o)
    orient = (lambda a: a) if name == "forward" else (lambda a: a.T)
    gemm = backend.prepared_gemm(name=name, m=m, n=b2.shape[0], k=k, dtype=dtype,
                                 config_of=lambda *a: autotune.kernel_config(backend, *a))

    def sparse(b2, wc, mk, *operand):
        return gemm(b2, *operand)

    def dense(b2, wc, mk, *operand):
        return jnp.dot(b2, orient(masked_weight(wc, mk)), precision=precision)

    return ffi.per_platform(dense, sparse, b2.astype(dtype), w.astype(dtype), bool_mask(mask), *operand, barrier=True)


def _prepared_call(name: str, b2, w, mask, entry, precision):
    """The GEMM ``name`` on the prepared operand ``entry``, as one custom-partitioned op per operand format
    (:func:`~jax_sparse24._src.sharding.gemm_rule` with ``prepared=``): a prepared operand is the
    compression of the whole weight, so its GEMM keeps the weight whole (replicated: data parallelism);
    tokens may still be sharded."""
    backend = _PREPARABLE[prepared_backend(entry)]
    dtype = backend.operand_dtype(entry) or jnp.result_type(b2, w)
    gemm = sharding.partitioned_gemm(name, prepared=backend.name)(_prepared_gemm)
    return gemm(b2, w, mask, *(entry[k] for k in backend.operand_keys), backend=backend, name=name, dtype=dtype,
                precision=precision)


def forward_prepared(x2, w, mask, entry, *, precision=None):
    """``x·W̃`` with W̃ᵀ already compressed (``entry = prepared["forward"]``: M = O, K = I)."""
    return _prepared_call("forward", x2, w, mask, entry, precision)


def input_grad_prepared(g2, w, mask, entry, *, precision=None):
    """``∇y·W̃ᵀ`` with W̃ already compressed (``entry = prepared["input_grad"]``: M = I, K = O)."""
    return _prepared_call("input_grad", g2, w, mask, entry, precision)
