"""Prepared weights: each sparse layer's weight work done once per optimizer step.

Under gradient accumulation every micro-batch would mask and compress each layer's weight again.
:func:`prepare` runs the model once per step with the :data:`PREPARED` collection mutable: every
:class:`~jax_sparse24.nn.Sparse24Dense` leaves its prepared weight there (:func:`layer_prepared`),
and the micro-batch passes read it back. The layers' compressions run together after the pass
(few kernel launches for all layers, stacked ``nn.scan`` layers included).

Public API: :data:`PREPARED`, :func:`prepare` (a Flax module), :func:`prepare_apply` (an apply
function, as :class:`~jax_sparse24.training.SparseTrainState` holds), :func:`layer_prepared` (the
layer's side of the pass).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp

from jax_sparse24._src import layer as _layer
from jax_sparse24._src import prepared_weight as _prepared_weight
from jax_sparse24._src import partitioning as _sharding
from jax_sparse24._src.gemm import masked_weight
from jax_sparse24._src.linear import plan_weight
from jax_sparse24._src.validation import check_positive_int
from jax_sparse24.masks import SPARSITY

__all__ = ["PREPARED", "layer_prepared", "prepare", "prepare_apply"]

#: Name of the Flax collection of prepared weights (:func:`prepare`): per layer ``{"weight": ...}``.
PREPARED = "sparse24_prepared"

_PREPARE_CONTEXT = contextvars.ContextVar("jax_sparse24_prepare",
                                           default={"tokens": None, "reuse": 1, "batch": None})

class _Pending:
    """A layer's place in the :data:`PREPARED` collection while :func:`prepare` collects the layers: a
    pytree without leaves (it passes through Flax untouched), replaced by the prepared weight."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"_Pending({self.index})"


jax.tree_util.register_pytree_node(_Pending, lambda p: ((), p.index), lambda index, _: _Pending(index))


class _Deferred:
    """A layer's weight plan left in the :data:`PREPARED` collection by a layer inside a lifted
    transform during :func:`prepare`'s pass: its arrays (``wc``, ``mk``) are the pytree's leaves, so
    ``nn.scan`` stacks them (``(L, in, out)``, one slice per layer); the rest of the plan (the GEMMs'
    choice, made from the per-layer shape) is static. :meth:`_PrepareBatch.finish` replaces it with
    the prepared weight (stacked the same way)."""

    __slots__ = ("plan",)

    def __init__(self, plan):
        self.plan = plan

    def __repr__(self):
        return f"_Deferred({jnp.shape(self.plan.wc)})"

    def plans(self) -> list:
        """The per-layer plans of the (possibly stacked) arrays, in row-major order of the stack."""
        p = self.plan
        shape = jnp.shape(p.wc)
        if len(shape) == 2:
            return [p]
        wc = jnp.reshape(p.wc, (-1,) + shape[-2:])
        mk = jnp.reshape(p.mk, (-1,) + shape[-2:])
        return [p._replace(wc=wc[j], mk=mk[j]) for j in range(wc.shape[0])]

    def assemble(self, prepared: list):
        """The prepared weights of :meth:`plans` stacked back into the stack's shape."""
        lead = jnp.shape(self.plan.wc)[:-2]
        if not lead:
            return prepared[0]
        return jax.tree.map(lambda *xs: jnp.reshape(jnp.stack(xs), lead + jnp.shape(xs[0])), *prepared)


jax.tree_util.register_pytree_node(
    _Deferred, lambda d: ((d.plan.wc, d.plan.mk), d.plan._replace(wc=None, mk=None)),
    lambda static, arrays: _Deferred(static._replace(wc=arrays[0], mk=arrays[1])))


def _trace_state():
    from jax.extend import core as jex_core

    return jex_core.get_opaque_trace_state(convention="flax")


class _PrepareBatch:
    """The weight plans of one :func:`prepare` pass, run together when it ends (:meth:`finish`).

    Layers traced at the pass's own level are collected here (:meth:`collecting`); a layer inside a
    lifted transform (``nn.scan``, ``nn.remat``, ``nn.vmap``, ...) holds that transform's tracers, so
    it leaves its weight and mask in the collection instead (:class:`_Deferred`; ``nn.scan`` stacks
    them along the layer axis) and :meth:`finish` prepares those too: every layer of every stack in
    the same batched call.
    """

    def __init__(self, mode):
        self.mode = mode
        self.trace = _trace_state()
        self.plans = []

    def collecting(self) -> bool:
        return _trace_state() == self.trace

    def will_batch(self, arrays) -> bool:
        """Whether :meth:`finish` runs these arrays' preparation batched (``mode=True``, or ``"auto"``
        where :func:`~jax_sparse24._src.partitioning.unpartitioned_batch_ok` allows it): what the planner
        is told, so it counts the batched pass's cost only where that pass runs."""
        return self.mode is True or _sharding.unpartitioned_batch_ok(arrays)

    def add(self, plan) -> _Pending:
        self.plans.append(plan)
        return _Pending(len(self.plans) - 1)

    def finish(self, collection):
        """``collection`` with every placeholder replaced by its prepared weight."""
        is_pending = lambda x: isinstance(x, (_Pending, _Deferred))  # noqa: E731
        nodes = [x for x in jax.tree_util.tree_leaves(collection, is_leaf=is_pending) if is_pending(x)]
        used = sorted({x.index for x in nodes if isinstance(x, _Pending)})
        deferred = [x for x in nodes if isinstance(x, _Deferred)]
        if not used and not deferred:
            return collection
        plans = [self.plans[i] for i in used]  # (a layer called twice keeps its last call's, as without batching)
        spans = []
        for d in deferred:  # every layer of a stack is a plan of its own, all in the same call
            layer_plans = d.plans()
            spans.append((len(plans), len(layer_plans)))
            plans += layer_plans
        batched = self.will_batch([a for p in plans for a in (p.wc, p.mk)])
        out = _prepared_weight.prepare_many(plans, batched=batched)
        done = dict(zip(used, out))
        stacked = {id(d): d.assemble(out[start:start + n]) for d, (start, n) in zip(deferred, spans)}

        def replace(x):
            if isinstance(x, _Pending):
                return done[x.index]
            if isinstance(x, _Deferred):
                return stacked[id(x)]
            return x

        return jax.tree_util.tree_map(replace, collection, is_leaf=is_pending)


@contextlib.contextmanager
def _prepare_context(tokens, reuse, batch=None):
    token = _PREPARE_CONTEXT.set({"tokens": tokens, "reuse": reuse, "batch": batch, "active": True})
    try:
        yield
    finally:
        _PREPARE_CONTEXT.reset(token)


def prepare(model, variables, *args, tokens: int | None = None, reuse: int = 1, batch="auto", method=None,
            **kwargs):
    """Prepared weights of every sparse :class:`~jax_sparse24.nn.Sparse24Dense` in ``model``: the
    :data:`PREPARED` collection.

    For gradient accumulation: call it once per optimizer step (inside the jitted step, before the
    micro-batch loop) and pass the result to every micro-batch's ``apply`` — each layer then masks
    and compresses its weight once per step instead of once per micro-batch
    (:func:`jax_sparse24.prepare_weight`)::

        prepared = prepare(model, {"params": p, "sparsity": s}, x_micro, reuse=n_micro)
        def micro_loss(p, xb):                                   # inside lax.scan
            v = {"params": p, "sparsity": s, PREPARED: prepared}
            return loss(model.apply(v, xb, rngs={"mvue": key}))

    It runs ``model.apply(variables, *args, **kwargs)`` with the collection mutable and keeps only
    the collection: under ``jit`` XLA drops the rest of that forward pass (it feeds nothing), so
    ``args`` need only have a micro-batch's shapes. Layers called with ``sparse=False`` are not
    prepared (they run dense). Rebuild it whenever params or masks change — a stale preparation
    computes with the old weights.

    Args:
      model: a Flax module containing ``Sparse24Dense`` layers.
      variables: its variables (``params``, ``sparsity``).
      *args, **kwargs, method: as for ``model.apply`` on one micro-batch.
      tokens: rows per call the kernels are planned for (default: the layer input's size; under
        data parallelism pass the per-device count).
      reuse: calls that share the preparation (micro-batches per step); ``backend="auto"`` layers
        then count the preparation's cost (a share of a per-call compression,
        :data:`~jax_sparse24._src.autotune.PREPARE_COST_SHARE`) once per ``reuse`` GEMMs.
      batch: run the weight work of all layers together — the masked compressions as one kernel
        launch per (dtype, operand format, direction) and 64 weights
        (:func:`~jax_sparse24._src.cuda_compress_ops.masked_compress_many`) instead of one or two
        small launches per layer — with the same operands bit for bit for the same plan. The plan
        counts the batched pass's lower cost per weight
        (:data:`~jax_sparse24._src.autotune.PREPARE_COST_SHARE`), so with ``backend="auto"`` a GEMM
        near the break-even may run sparse batched and dense unbatched. ``"auto"`` (default): batch on
        a single device, or where every weight is known at trace time to be whole on each device
        (inside ``shard_map``, or ``Explicit`` mesh axes with the weights replicated); elsewhere
        (sharding decided by the partitioner) one call per layer, since the compressor has no
        partitioning rule: the partitioner gathers its operands whole, and one call would gather
        all the sharded weights at once. ``True``: batch anyway (e.g. data parallelism with
        replicated weights under automatic sharding); ``False``: one call per layer. Layers inside
        lifted transforms (``nn.scan``, ``nn.remat``, ...) are batched too: the pass leaves their
        (stacked) weights and masks in the collection and the preparation runs after it, on every
        layer of the stack, in the same call as the others (so ``PREPARED`` must be in the
        ``nn.scan``'s ``variable_axes``, as it must for the micro-batch passes to read it).

    Returns:
      the :data:`PREPARED` collection (a nested dict; empty when no layer is sparse).
    """
    return prepare_apply(model.apply, variables, *args, tokens=tokens, reuse=reuse, batch=batch, method=method,
                         **kwargs)


def prepare_apply(apply_fn, variables, *args, tokens: int | None = None, reuse: int = 1, batch="auto",
                  op: str = "prepare", **kwargs):
    """:func:`prepare` for an apply function: the :data:`PREPARED` collection of
    ``apply_fn(variables, *args, mutable=[PREPARED], **kwargs)`` (``variables`` without a previous
    preparation). ``op`` names the caller in errors."""
    check_positive_int(tokens, "tokens", op, allow_none=True)
    check_positive_int(reuse, "reuse", op)
    if not (batch is True or batch is False or (isinstance(batch, str) and batch == "auto")):
        raise ValueError(f"{op}: batch must be 'auto', True or False, got {batch!r}")
    if PREPARED in variables:
        variables = {k: v for k, v in variables.items() if k != PREPARED}
    collector = None if batch is False else _PrepareBatch(batch)
    with _prepare_context(None if tokens is None else int(tokens), int(reuse), collector):
        _, state = apply_fn(variables, *args, mutable=[PREPARED], **kwargs)
    prepared = state.get(PREPARED, {})
    return prepared if collector is None else collector.finish(prepared)


def layer_prepared(module, inputs, kernel, *, method: str, mask, beta, transposable: bool, backend: str,
                   owner: str = "Sparse24Dense"):
    """A sparse layer's prepared weight (the ``prepared=`` of its GEMMs), or ``None``.

    Called by the layer (a Flax module) on every sparse, non-fp8 call after init. In a
    :func:`prepare` pass (the :data:`PREPARED` collection mutable) it plans the layer's weight work,
    leaves its place in the collection and returns the masked weight the pass computes with (the
    pass's output is dropped); in a micro-batch pass it returns what the collection holds for the
    layer (``None`` without a preparation).

    Raises:
      ValueError: a :func:`prepare` pass that cannot write the collection here (the layer runs
        inside a lifted transform that does not carry :data:`PREPARED`).
    """
    if module.is_mutable_collection(PREPARED):
        ctx = _PREPARE_CONTEXT.get()
        tokens = ctx["tokens"] or max(1, math.prod(jnp.shape(inputs)[:-1]))
        w_used, m, transposable = _layer.effective(method, kernel, mask, beta, transposable)
        batch = ctx["batch"]
        plan = plan_weight(w_used, m, tokens=tokens, dtype=jnp.result_type(inputs, kernel), backend=backend,
                           transposable=transposable, reuse=ctx["reuse"],
                           batched=batch is not None and batch.will_batch([w_used, m]), check_mask=False)
        if batch is None:
            prepared = _prepared_weight.prepare_many([plan])[0]
            module.put_variable(PREPARED, "weight", prepared)
            return prepared
        if batch.collecting():
            # the weight work of every layer runs together once the pass is over (one compressor
            # launch for many layers); the pass computes with W̃ (its output is dropped)
            module.put_variable(PREPARED, "weight", batch.add(plan))
        else:
            # Inside a lifted transform (nn.scan, nn.remat, ...): this trace's values cannot be kept
            # for the end of the pass, so the layer leaves its weight and mask in the collection
            # (nn.scan stacks them along its layer axis: PREPARED must be in its variable_axes) and
            # the pass's end compresses them there, with every other layer's.
            module.put_variable(PREPARED, "weight", _Deferred(plan))
        return {"masked": masked_weight(plan.wc, plan.mk)}
    if _PREPARE_CONTEXT.get().get("active"):
        # a prepare pass whose collection this layer cannot write: a lifted transform (nn.scan,
        # nn.vmap, ...) without PREPARED among its variable collections would drop the preparation
        # silently (and the micro-batch passes could not read it either)
        raise ValueError(
            f"{owner} {module.name or ''}: prepare() cannot write the '{PREPARED}' collection here: "
            f"the layer runs inside a lifted transform that does not carry it; add '{PREPARED}' to the "
            f"transform's variable collections, e.g. nn.scan(..., variable_axes={{'params': 0, "
            f"'{SPARSITY}': 0, '{PREPARED}': 0}})")
    if module.has_variable(PREPARED, "weight"):
        return module.get_variable(PREPARED, "weight")
    return None
