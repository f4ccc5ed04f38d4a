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

from jax_sparse24._src import autotune, backends, ffi, partitioning
from jax_sparse24._src import cuda_compress_ops as cc
from jax_sparse24._src.backends import Backend, bool_mask, masked_weight, operand_mk

__all__ = ["PREPARED_KEYS", "WeightPlan", "plan", "prepare", "prepare_many", "prepared_backend", "check_prepared",
           "forward_prepared", "input_grad_prepared"]

#: Keys of a prepared weight (a dict): ``"forward"`` / ``"input_grad"`` hold the compressed operand
#: (W̃ᵀ, W̃) when that GEMM runs sparse — a dict of its backend's ``operand_keys``: ``{"values", "meta"}``
#: for CUTLASS, ``{"cusparselt"}`` (one uint8 buffer, A stored (M, K)) for cuSPARSELt; ``"masked"``
#: holds W̃ when a GEMM runs dense.
PREPARED_KEYS = ("forward", "input_grad", "masked")


class WeightPlan(NamedTuple):
    """The weight work of one layer, decided at trace time (:func:`plan`) and run by :func:`prepare_many`.

    ``operands``: ``(backend, names)`` per backend with prepared operands, the GEMMs (``"forward"``,
    ``"input_grad"``) whose 2:4 operand is prepared in its format; W̃ itself is kept when fewer than
    two are.
    """

    wc: Any  # w in the compute dtype
    mk: Any  # the bool mask
    dtype: Any
    tokens: int
    operands: tuple


class _Unit(NamedTuple):
    """One :class:`~jax_sparse24._src.backends.base.Compression` of a plan: ``layout`` a fused
    compressor's (groupable across layers by ``direction``) or None (``backend.library_compress`` of
    one GEMM's operand, per layer); ``shapes``: its flat outputs (per name, the backend's operand arrays)."""

    plan: int
    backend: Backend
    layout: str | None
    direction: str | None
    names: tuple
    shapes: tuple


def plan(w, mask, *, tokens: int, dtype, backend: str, transposable: bool, reuse: int,
         batched: bool = False) -> WeightPlan:
    """Which operands the prepared weight of ``w ⊙ mask`` holds (the GEMMs' plan; ``batched``: it will
    be prepared together with other layers); nothing computed yet."""
    i, o = w.shape
    chosen = dict(zip(("forward", "input_grad"), autotune.weight_gemms_backends(
        backend, tokens, i, o, dtype, transposable=transposable, reuse=reuse, batched=batched)))
    operands = {}
    for name, b in chosen.items():
        if b.operand_keys:
            operands.setdefault(b, []).append(name)
    return WeightPlan(jnp.asarray(w).astype(dtype), bool_mask(mask), jnp.dtype(dtype), int(tokens),
                      tuple((b, tuple(names)) for b, names in operands.items()))


def _direction(names) -> str:
    """``masked_compress_many``'s direction writing the operands of ``names``, in that order."""
    if len(names) == 2:
        return "both"  # (W̃ᵀ, W̃): forward, input_grad
    return "transposed" if names[0] == "forward" else "direct"


def _units(index: int, p: WeightPlan) -> list[_Unit]:
    """The compressions of plan ``p``, as each backend does them (:meth:`~jax_sparse24._src.backends.base.Backend.compressions`)."""
    i, o = p.wc.shape
    return [_Unit(index, b, c.layout, None if c.layout is None else _direction(c.names), c.names, c.shapes)
            for b, names in p.operands for c in b.compressions(names, i, o, p.tokens, p.dtype)]


def _flat(result, unit: _Unit) -> list:
    """A ``masked_compress_many`` result of ``unit`` as its flat outputs (per name: its operand's arrays)."""
    per_name = result if unit.direction == "both" else (result,)
    return [a for r in per_name for a in (r if isinstance(r, tuple) else (r,))]


def _entries(unit: _Unit, flat) -> dict:
    """``{name: operand}`` from a unit's flat outputs (its backend's ``operand_keys``)."""
    keys = unit.backend.operand_keys
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
            if u.layout is None:
                p, name = plans[u.plan], u.names[0]
                m, k = operand_mk(name, *p.wc.shape)
                outs[j] = [u.backend.library_compress(name, args[2 * u.plan], args[2 * u.plan + 1], m=m, k=k,
                                                      tokens=p.tokens, dtype=p.dtype)]
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


def prepared_backend(entry) -> Backend:
    """The backend whose operand format one prepared operand (``prepared["forward"]``) is in."""
    preparable = [b for b in backends.registered() if b.operand_keys and not b.fp8]
    for b in preparable:
        if isinstance(entry, dict) and set(entry) == set(b.operand_keys):
            return b
    got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
    want = " or ".join("{" + ", ".join(map(repr, b.operand_keys)) + f"}} ({b.name})" for b in preparable)
    raise ValueError(f"a prepared operand must be {want}, got {got}")


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
        backend.check_operand(entry, name, *operand_mk(name, i, o), dtype, w_shape=(i, o), op=op)


def _prepared_gemm(b2, w, mask, *operand, backend: Backend, name: str, dtype, precision):
    """D(m×T)ᵀ = b2 · orient(W̃) with A = orient(W̃)ᵀ already compressed in ``backend``'s format
    (``operand``: its arrays, :attr:`~jax_sparse24._src.backends.base.Backend.operand_keys`); ``w`` and
    ``mask`` feed the reference lowering on non-CUDA platforms. Runs on the local shards (the
    partitioned op of :func:`forward_prepared` / :func:`input_grad_prepared`)."""
    i, o = w.shape
    m, k = operand_mk(name, i, o)
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
    (the backend's ``sharding_rule(name, prepared=True)``): a prepared operand is the
    compression of the whole weight, so its GEMM keeps the weight whole (replicated: data parallelism);
    tokens may still be sharded."""
    backend = prepared_backend(entry)
    dtype = backend.operand_dtype(entry) or jnp.result_type(b2, w)

    def local(*arrays):
        return _prepared_gemm(*arrays, backend=backend, name=name, dtype=dtype, precision=precision)

    rule = backend.sharding_rule(name, prepared=True)
    return partitioning.partitioned(rule, local)(b2, w, mask, *(entry[k] for k in backend.operand_keys))


def forward_prepared(x2, w, mask, entry, *, precision=None):
    """``x·W̃`` with W̃ᵀ already compressed (``entry = prepared["forward"]``: M = O, K = I)."""
    return _prepared_call("forward", x2, w, mask, entry, precision)


def input_grad_prepared(g2, w, mask, entry, *, precision=None):
    """``∇y·W̃ᵀ`` with W̃ already compressed (``entry = prepared["input_grad"]``: M = I, K = O)."""
    return _prepared_call("input_grad", g2, w, mask, entry, precision)
