"""Flax linen layers for 2:4 sparse training.

:class:`Sparse24Dense` is a drop-in for ``flax.linen.Dense``: same fields, same parameter tree
(``kernel`` of shape (in, out), ``bias``). Sparsity state — masks, the S-STE scale β, the mask
refresh period — lives in the non-parameter collection ``"sparsity"`` (:data:`SPARSITY`), never
in ``params``, so optimizers and checkpoints of ``params`` are unchanged. A train step refreshes
the masks from the current params with :func:`refresh_masks` (which returns the flip rate) and
hands them to :func:`jax_sparse24.optim.masked_decay` through :func:`masks_for_params`.

Typical use::

    model = MLP(...)                      # uses Sparse24Dense(features, method="srste")
    variables = model.init(key, x)        # {"params": ..., "sparsity": ...}
    y = model.apply(variables, x, rngs={"mvue": step_key})
    sparsity, flips = refresh_masks(variables["params"], variables["sparsity"], step=step)

With gradient accumulation, :func:`prepare` does every layer's weight work (mask, compression)
once per optimizer step; pass its result as the :data:`PREPARED` collection to each micro-batch's
``apply``.

Scanned layers: a stack of blocks under ``nn.scan`` (one compiled body for all layers, instead of
every layer traced and compiled on its own) keeps every collection stacked along a leading layer
axis; scan them all and split the MVUE stream so that each layer draws its own key::

    Stack = nn.scan(Block, length=n_layer,
                    variable_axes={"params": 0, SPARSITY: 0, PREPARED: 0, FP8_META: 0},
                    split_rngs={"params": True, MVUE_RNG: True})

The functions here take such stacked leaves (``kernel (L, in, out)`` with ``mask (L, in, out)``,
``mask_every (L,)``) and work per layer: the 2:4 groups run along ``in`` (axis -2), a transposable
mask is per ``(in, out)`` slice, each layer refreshes on its own period, :func:`layer_flip_rates`
gives one rate per layer. :func:`stack_layers` / :func:`unstack_layers` convert a tree (variables,
optimizer or train state) between the unrolled and the scanned layouts.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen.dtypes import promote_dtype

from jax_sparse24._src import fp8 as _fp8
from jax_sparse24._src import layer as _layer
from jax_sparse24._src import ops as _ops
from jax_sparse24._src import prepared_weight as _prepared_weight
from jax_sparse24._src import sharding as _sharding
from jax_sparse24._src.gemm import masked_weight
from jax_sparse24._src.linear import plan_weight
from jax_sparse24._src.tree_paths import path_tuple
from jax_sparse24._src.validation import check_positive_int

__all__ = [
    "Sparse24Dense",
    "SPARSITY",
    "FP8_META",
    "PREPARED",
    "METHODS",
    "prepare",
    "refresh_masks",
    "layer_flip_rates",
    "mask_periods",
    "refresh_due",
    "masks_for_params",
    "apply_masks",
    "sparse_weights",
    "kernel_flip_rate",
    "kernel_masks",
    "stack_layers",
    "unstack_layers",
]

#: Name of the Flax collection holding masks, β and refresh periods.
SPARSITY = "sparsity"
#: The collection of the delayed-scaling fp8 state (``fp8_scaling="delayed"``): Flax's
#: ``OVERWRITE_WITH_GRADIENT`` — the gradient of these variables is their new value.
FP8_META = _fp8.META_COLLECTION
#: Name of the Flax collection of prepared weights (:func:`prepare`): per layer ``{"weight": ...}``.
PREPARED = "sparse24_prepared"
#: Training methods of :class:`Sparse24Dense`.
METHODS = _layer.METHODS
#: Name of the RNG stream used for the MVUE weight gradient.
MVUE_RNG = "mvue"

_TMASK = "transposable_mask"  # 2:4 along in and out (SR-STE with transposable=True)
_MASK = "mask"  # 2:4 along in
_EVERY = "mask_every"
_BETA = "beta"

default_kernel_init = nn.initializers.lecun_normal()


class Sparse24Dense(nn.Module):
    """A 2:4 sparse ``Dense`` layer for training (drop-in for ``flax.linen.Dense``).

    The weight used in the matmul is 2:4 along ``in`` (groups of 4 consecutive input features);
    gradients reach the dense ``kernel`` straight through. ``method`` selects the recipe:

    * ``"srste"`` — hard mask kept in ``sparsity/transposable_mask`` (or ``sparsity/mask`` with
      ``transposable=False``), recomputed from the kernel by :func:`refresh_masks` every
      ``mask_every`` optimizer steps; pair with :func:`jax_sparse24.optim.masked_decay`.
      Transposable masks let ``∇x`` use the sparse kernel too (transposable SR-STE, ICML'24).
    * ``"ste"`` — hard 2:4 magnitude mask recomputed from the kernel on every call.
    * ``"soft"`` — S-STE: ``β·S(kernel)`` with the soft threshold ``S`` and β frozen at init.
    * ``"dense"`` — plain dense layer (e.g. a dense fine-tune, or a baseline).

    With ``mvue=True`` and an ``"mvue"`` RNG stream passed to ``apply`` the weight gradient may be
    ``xᵀ·MVUE(∇y)`` (unbiased, 2:4 along tokens, so its GEMM runs on the sparse tensor cores); with
    ``backend="auto"`` that happens only where the fused MVUE + sparse GEMM is measured faster than
    the exact dense ``xᵀ·∇y`` for the shape — elsewhere (and on CPUs) the exact gradient is used.
    ``backend="dense"`` always samples MVUE (the sparse path's math, for quality studies).
    Without the stream (evaluation) it is ``xᵀ·∇y``.

    Attributes:
      features: number of output features.
      use_bias: whether to add a bias.
      dtype: computation dtype (``None``: inferred from inputs and params).
      param_dtype: dtype of ``kernel`` and ``bias``.
      precision: ``lax.Precision`` of the matmuls.
      kernel_init: initializer of the (in, out) kernel.
      bias_init: initializer of the bias.
      method: one of ``"srste"``, ``"ste"``, ``"soft"``, ``"dense"``.
      mvue: use the MVUE weight gradient when an ``"mvue"`` RNG is given.
      transposable: ``srste`` masks are transposable (2:4 along in and out).
      mask_every: ``srste`` mask refresh period in optimizer steps (see :func:`refresh_masks`).
      backend: GEMM backend, see :func:`jax_sparse24.sparse24_linear`.
      fp8: run the forward and input-gradient GEMMs in float8_e4m3fn with per-tensor current
        scaling (``sparse24_linear(..., fp8=True)``, docs/fp8.md) for every method: the 2:4 GEMMs
        of the method's effective weight, and in the dense phase (``method="dense"`` or
        ``sparse=False``) XLA's fp8 dot of the dense kernel. The MVUE weight gradient runs in fp8
        too where it runs sparse; an exact weight gradient (and the dense phase's) stays 16-bit.
        With the default current scaling it is stateless; :func:`prepare` skips fp8 layers (their
        weight is quantized and compressed on every call).
      fp8_scaling: ``"current"`` (scales from each call's amax) or ``"delayed"`` (Flax's recipe: the
        scales from amax histories of the previous calls, kept in the :data:`FP8_META` collection —
        Flax's ``OVERWRITE_WITH_GRADIENT`` — whose gradient is its new value; docs/fp8.md).
      amax_history_length: length of each amax history with delayed scaling (Flax's default 1024).

    >>> import jax, jax.numpy as jnp
    >>> from flax import linen as nn
    >>> x = jnp.ones((2, 16))
    >>> v = Sparse24Dense(8).init(jax.random.key(0), x)
    >>> jax.tree_util.tree_map(jnp.shape, v["params"])
    {'bias': (8,), 'kernel': (16, 8)}
    >>> jax.tree_util.tree_map(jnp.shape, v["sparsity"])
    {'mask_every': (), 'transposable_mask': (16, 8)}
    >>> jax.tree_util.tree_map(jnp.shape, nn.Dense(8).init(jax.random.key(0), x)["params"])
    {'bias': (8,), 'kernel': (16, 8)}
    """

    features: int
    use_bias: bool = True
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    method: str = "srste"
    mvue: bool = True
    transposable: bool = True
    mask_every: int = 40
    backend: str = "auto"
    fp8: bool = False
    fp8_scaling: str = "current"
    amax_history_length: int = 1024

    @nn.compact
    def __call__(self, inputs, *, sparse: bool | jax.Array | None = None):
        """Apply the layer.

        Args:
          inputs: ``(..., in)`` with ``in % 4 == 0``.
          sparse: run sparse (True) or dense (False). A traced boolean (e.g. from
            :func:`jax_sparse24.optim.is_sparse_phase` or a fine-tune schedule) selects at run
            time with ``lax.cond``. ``None``: sparse unless ``method == "dense"``.
        """
        _layer.check_config("Sparse24Dense", self.method, self.backend, self.fp8, self.fp8_scaling,
                            self.amax_history_length)
        check_positive_int(self.features, "features", f"Sparse24Dense {self.name or ''}".rstrip())
        in_features = jnp.shape(inputs)[-1]
        if self.method != "dense" and in_features % 4:
            raise ValueError(
                f"Sparse24Dense {self.name or ''}: the input feature size must be divisible by 4 "
                f"(2:4 groups along in), got inputs of shape {jnp.shape(inputs)}"
            )
        kernel = self.param("kernel", self.kernel_init, (in_features, self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None

        # Sparsity state (created at init from the initial kernel).
        state = {}
        if self.method == "srste":
            if self.transposable and self.features % 4:
                raise ValueError(
                    f"Sparse24Dense {self.name or ''}: transposable masks need features divisible "
                    f"by 4, got features={self.features}; use transposable=False"
                )
            name = _TMASK if self.transposable else _MASK
            self._require_sparsity(name)
            state["mask"] = self.variable(SPARSITY, name, lambda: _layer.init_mask(kernel, self.transposable)).value
            self.variable(SPARSITY, _EVERY, lambda: jnp.asarray(self.mask_every, jnp.int32))
        elif self.method == "soft":
            self._require_sparsity(_BETA)
            state["beta"] = self.variable(SPARSITY, _BETA, lambda: _layer.init_beta(kernel)).value

        inputs, kernel_c, bias_c = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        key = None
        if self.mvue and self.method != "dense" and self.has_rng(MVUE_RNG) and not self.is_initializing():
            key = self.make_rng(MVUE_RNG)

        # Prepared weight (gradient accumulation, see `prepare`): made in the prepare pass (the
        # collection is mutable), read in the micro-batch passes.
        prepared = None
        if self.method != "dense" and sparse is not False and not self.fp8 and not self.is_initializing():
            if self.is_mutable_collection(PREPARED):
                ctx = _PREPARE_CONTEXT.get()
                tokens = ctx["tokens"] or max(1, math.prod(jnp.shape(inputs)[:-1]))
                w_used, mask, transposable = _layer.effective(self.method, kernel_c, state.get("mask"),
                                                              state.get("beta"), self.transposable)
                batch = ctx["batch"]
                collecting = batch is not None and batch.collecting()
                plan = plan_weight(w_used, mask, tokens=tokens, dtype=jnp.result_type(inputs, kernel_c),
                                   backend=self.backend, transposable=transposable, reuse=ctx["reuse"],
                                   batched=batch is not None and batch.will_batch([w_used, mask]), check_mask=False)
                if collecting:
                    # `prepare` does the weight work of every layer together once the pass is over
                    # (one compressor launch for many layers); the pass computes with W̃ (its output
                    # is dropped).
                    self.put_variable(PREPARED, "weight", batch.add(plan))
                    prepared = {"masked": masked_weight(plan.wc, plan.mk)}
                elif batch is not None:
                    # Inside a lifted transform (nn.scan, nn.remat, ...): this trace's values cannot
                    # be kept for the end of the pass, so the layer leaves its weight and mask in the
                    # collection (nn.scan stacks them along its layer axis: the PREPARED collection
                    # must be in its variable_axes) and `prepare` compresses them there, with every
                    # other layer's, when the pass is over.
                    self.put_variable(PREPARED, "weight", _Deferred(plan))
                    prepared = {"masked": masked_weight(plan.wc, plan.mk)}
                else:
                    prepared = _prepared_weight.prepare_many([plan])[0]
                    self.put_variable(PREPARED, "weight", prepared)
            elif _PREPARE_CONTEXT.get().get("active"):
                # a prepare pass whose collection this layer cannot write: a lifted transform
                # (nn.scan, nn.vmap, ...) without PREPARED among its variable collections would drop
                # the preparation silently (and the micro-batch passes could not read it either)
                raise ValueError(
                    f"Sparse24Dense {self.name or ''}: prepare() cannot write the '{PREPARED}' collection here: "
                    f"the layer runs inside a lifted transform that does not carry it; add '{PREPARED}' to the "
                    f"transform's variable collections, e.g. nn.scan(..., variable_axes={{'params': 0, "
                    f"'{SPARSITY}': 0, '{PREPARED}': 0}})")
            elif self.has_variable(PREPARED, "weight"):
                prepared = self.get_variable(PREPARED, "weight")

        fp8_meta = None
        if self.fp8 and self.fp8_scaling == "delayed":
            fp8_meta = {}
            init = _fp8.init_meta(self.amax_history_length)
            for n in _fp8.META_NAMES:
                self._require_fp8_meta(n)
                fp8_meta[n] = self.variable(FP8_META, n, lambda n=n: init[n]).value
        return _layer.apply(inputs, kernel_c, bias_c, method=self.method, mask=state.get("mask"),
                            beta=state.get("beta"), transposable=self.transposable, key=key, backend=self.backend,
                            precision=self.precision, sparse=sparse, prepared=prepared, fp8=self.fp8,
                            fp8_meta=fp8_meta, owner="Sparse24Dense")

    def _require_fp8_meta(self, name: str) -> None:
        if self.is_initializing() or self.has_variable(FP8_META, name) or self.is_mutable_collection(FP8_META):
            return
        raise ValueError(
            f"Sparse24Dense {self.name or ''} (fp8_scaling='delayed') needs '{FP8_META}/{name}': pass the "
            f"'{FP8_META}' collection from model.init(...) to apply, and differentiate the loss with respect "
            "to it too: its gradient is its new value (SparseTrainState.create(..., fp8_meta=...) does this "
            "bookkeeping; docs/fp8.md)"
        )

    def _require_sparsity(self, name: str) -> None:
        if self.is_initializing() or self.has_variable(SPARSITY, name):
            return
        if self.is_mutable_collection(SPARSITY):
            return
        raise ValueError(
            f"Sparse24Dense {self.name or ''} (method={self.method!r}) needs '{SPARSITY}/{name}': pass "
            f"the '{SPARSITY}' collection from model.init(...) to apply, e.g. "
            "model.apply({'params': params, 'sparsity': sparsity}, x)"
        )


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
        where :func:`~jax_sparse24._src.sharding.unpartitioned_batch_ok` allows it): what the planner
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


def _check_batch(batch, op: str):
    if not (batch is True or batch is False or (isinstance(batch, str) and batch == "auto")):
        raise ValueError(f"{op}: batch must be 'auto', True or False, got {batch!r}")
    return batch


def _run_prepare(apply, tokens, reuse, batch):
    """The :data:`PREPARED` collection of ``apply()`` (a ``model.apply(..., mutable=[PREPARED])``)."""
    collector = None if batch is False else _PrepareBatch(batch)
    with _prepare_context(None if tokens is None else int(tokens), int(reuse), collector):
        _, state = apply()
    prepared = state.get(PREPARED, {})
    return prepared if collector is None else collector.finish(prepared)


def prepare(model, variables, *args, tokens: int | None = None, reuse: int = 1, batch="auto", method=None,
            **kwargs):
    """Prepared weights of every sparse :class:`Sparse24Dense` in ``model``: the :data:`PREPARED` collection.

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
    check_positive_int(tokens, "tokens", "prepare", allow_none=True)
    check_positive_int(reuse, "reuse", "prepare")
    _check_batch(batch, "prepare")
    if PREPARED in variables:
        variables = {k: v for k, v in variables.items() if k != PREPARED}
    return _run_prepare(lambda: model.apply(variables, *args, mutable=[PREPARED], method=method, **kwargs),
                        tokens, reuse, batch)


def _layer_states(sparsity):
    """Yield (layer_path, layer_dict) for every Sparse24Dense state in a sparsity tree."""
    def walk(node, path):
        if isinstance(node, dict) or hasattr(node, "items"):
            keys = set(node.keys())
            if keys & {_TMASK, _MASK}:
                yield path, node
                return
            for k, child in node.items():
                yield from walk(child, path + (k,))
    yield from walk(sparsity, ())


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    if not path:
        return value
    out = dict(tree)
    out[path[0]] = _set(tree[path[0]], path[1:], value)
    return out


def refresh_masks(params, sparsity, *, step=None, skip_idle: bool = True):
    """Recompute every ``srste`` mask from the current kernels; return ``(sparsity, flip_rate)``.

    Call once per optimizer step (not per micro-batch) after the update. With ``step`` given a
    layer refreshes only when ``step % mask_every == 0`` (its own period; one ``lax.cond`` for the
    whole model skips the mask computation on steps where no layer refreshes, ``jit``-friendly);
    with ``step=None`` every mask is refreshed.

    The ``lax.cond`` has a price on a GPU: XLA reads a conditional's predicate on the host, which
    waits for the device to reach it, so the queue of launched kernels drains once per step
    (measured: ~0.5% of a GPT-2 124M step on the H200, ``docs/performance.md``). To avoid it, refresh in a
    program of its own that the host runs only on the steps where a layer is due, with
    ``skip_idle=False`` (no conditional)::

        periods = mask_periods(sparsity)                  # host ints, read once
        refresh = jax.jit(lambda p, s, step: refresh_masks(p, s, step=step, skip_idle=False))
        for step in range(n):
            params, opt_state = train_step(params, sparsity, opt_state, step)  # no refresh inside
            if refresh_due(periods, step + 1):
                sparsity, flips = refresh(params, sparsity, step + 1)

    (:meth:`jax_sparse24.training.SparseTrainState.refresh_masks` does this for the train state.)

    Args:
      params: the model's ``params`` (kernels in Flax (in, out) layout).
      sparsity: the model's ``"sparsity"`` collection.
      step: optimizer step (int or scalar array) or ``None``.
      skip_idle: with ``step``, skip the mask computation under a ``lax.cond`` when no layer is
        due (``True``); ``False``: no conditional -- every layer's mask is computed and the due
        layers' kept (same result, for a program run only when some layer is due).

    Returns:
      The new sparsity collection and the flip rate: the fraction of mask entries (over all
      refreshed layers) that changed; 0 when no layer refreshed.
    """
    layers = list(_layer_states(sparsity))
    names = [_TMASK if _TMASK in layer else _MASK for _, layer in layers]
    masks, rate = _layer.refresh([_get(params, path)["kernel"] for path, _ in layers],
                                 [layer[name] for (_, layer), name in zip(layers, names)],
                                 [name == _TMASK for name in names],
                                 [layer.get(_EVERY, 1) for _, layer in layers], step, skip_idle=skip_idle)
    new = sparsity
    for (path, layer), name, mask in zip(layers, names, masks):
        layer_new = dict(layer)
        layer_new[name] = mask
        new = _set(new, path, layer_new)
    return new, rate


def layer_flip_rates(old_sparsity, new_sparsity) -> dict:
    """The flip rate of each ``srste`` layer between two versions of the sparsity collection (e.g.
    before and after :func:`refresh_masks`): ``{"a/b/c": rate}``, keyed by the layer's module path.

    A layer of a stack (``nn.scan``'s, masks ``(L, in, out)``) has one rate per layer, shape ``(L,)``;
    other layers a scalar. The rate is the fraction of the layer's mask entries that differ (0 for a
    layer that was not due). :func:`refresh_masks` returns the rate over all refreshed layers.

    >>> import jax.numpy as jnp
    >>> old = {"fc": {"mask": jnp.array([[True], [True], [False], [False]])}}
    >>> new = {"fc": {"mask": jnp.array([[True], [False], [False], [True]])}}
    >>> float(layer_flip_rates(old, new)["fc"])
    0.5
    """
    new_layers = dict(_layer_states(new_sparsity))
    rates = {}
    for path, layer in _layer_states(old_sparsity):
        name = _TMASK if _TMASK in layer else _MASK
        key = "/".join(map(str, path))
        if path not in new_layers or name not in new_layers[path]:
            raise ValueError(f"layer_flip_rates: new_sparsity has no '{key}/{name}'")
        old, new = layer[name], new_layers[path][name]
        if np.shape(old) != np.shape(new) or np.ndim(old) < 2:
            raise ValueError(f"layer_flip_rates: the masks of '{key}' must have the same (..., in, out) shape, got "
                             f"{np.shape(old)} and {np.shape(new)}")
        rates[key] = jnp.mean(old != new, axis=(-2, -1), dtype=jnp.float32)
    return rates


def mask_periods(sparsity) -> tuple:
    """The distinct ``srste`` mask refresh periods (``mask_every``) of a sparsity collection, as
    sorted Python ints; ``()`` without ``srste`` layers.

    A host read of the collection's period entries: call it once, outside ``jit`` (the periods
    never change), and decide each step with :func:`refresh_due` -- reading them every step
    would wait for the previous step to finish.

    Raises:
      ValueError: called on traced values (inside ``jit``).
    """
    periods = set()
    for path, layer in _layer_states(sparsity):
        every = layer.get(_EVERY, 1)
        try:
            # (a stack of layers, e.g. nn.scan's, holds one period per layer)
            periods.update(max(1, int(p)) for p in np.ravel(np.asarray(every)))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
            raise ValueError(
                f"mask_periods: the refresh period of '{'/'.join(map(str, path))}' is traced; call mask_periods "
                "outside jit, once, on the sparsity collection of model.init(...) or of the train state"
            ) from None
    return tuple(sorted(periods))


def refresh_due(periods, step: int) -> bool:
    """Whether some layer with a refresh period in ``periods`` (:func:`mask_periods`) refreshes at
    optimizer step ``step`` (``step % period == 0``, the rule of :func:`refresh_masks`): the host's
    side of a refresh run in its own program."""
    return any(int(step) % int(p) == 0 for p in periods)


def masks_for_params(params, sparsity):
    """A params-shaped tree with the ``srste`` mask at each such layer's ``kernel`` and ``None`` elsewhere.

    This is what :func:`jax_sparse24.optim.masked_decay` takes as ``masks=``.
    """
    masks = {}
    for path, layer in _layer_states(sparsity):
        name = _TMASK if _TMASK in layer else _MASK
        masks[path] = layer[name]

    def pick(path, leaf):
        p = path_tuple(path)
        if p and p[-1] == "kernel" and p[:-1] in masks:
            return masks[p[:-1]]
        return None

    return jax.tree_util.tree_map_with_path(pick, params)


def apply_masks(params, sparsity):
    """Params with every ``srste`` kernel multiplied by its mask (the deployed sparse weights)."""
    masks = {}
    for path, layer in _layer_states(sparsity):
        masks[path] = layer[_TMASK if _TMASK in layer else _MASK]

    def apply(path, leaf):
        p = path_tuple(path)
        if p and p[-1] == "kernel" and p[:-1] in masks:
            return jnp.where(masks[p[:-1]], leaf, jnp.zeros((), leaf.dtype))
        return leaf

    return jax.tree_util.tree_map_with_path(apply, params)


def _layer_paths(paths, op: str) -> list:
    """Module paths given as a list of key tuples or ``"a/b"`` strings, as a list of tuples."""
    if isinstance(paths, (str, tuple)):
        raise ValueError(f"{op}: paths must be a list of layer paths, got {paths!r}; wrap a single path in a list")
    return [tuple(p.strip("/").split("/")) if isinstance(p, str) else tuple(p) for p in paths]


def sparse_weights(params, sparsity, *, method: str, paths):
    """Params with the kernels of the given 2:4 layers replaced by the weights their sparse forward
    pass computes with, as dense ``(in, out)`` arrays (zeros at the pruned positions).

    ``method="srste"``: ``kernel ⊙ mask`` (the stored mask, as :func:`apply_masks`); ``"ste"``:
    ``kernel ⊙ mask24(kernel)`` along ``in``; ``"soft"`` (S-STE): ``β·S(kernel)``, the soft-thresholded
    kernel times the layer's frozen β from ``sparsity``. For a switch to dense training that starts
    from the function the 2:4 model computed (the example's ``--finetune-start masked``): for
    ``soft`` the plain kernel is not that function at all (S subtracts each group's threshold and β
    rescales), so a dense phase from the raw kernels starts elsewhere.

    Args:
      params: the model's params.
      sparsity: the ``"sparsity"`` collection (β of ``soft`` layers, masks of ``srste`` ones).
      method: the layers' :class:`Sparse24Dense` method.
      paths: module paths of the layers (tuples of keys or ``"a/b"`` strings), each with a
        ``kernel`` ``(in, out)``.

    Returns:
      ``(new_params, masks)``: masks is a params-shaped tree with each replaced kernel's 2:4 mask
      (bool) and ``None`` elsewhere.
    """
    if method not in ("srste", "ste", "soft"):
        raise ValueError(f"sparse_weights: method must be 'srste', 'ste' or 'soft', got {method!r}")
    paths = _layer_paths(paths, "sparse_weights")
    stored = dict(_layer_states(sparsity)) if method == "srste" else {}
    new_params, masks = params, jax.tree.map(lambda _: None, params)
    for path in paths:
        try:
            kernel = _get(params, path + ("kernel",))
        except (KeyError, TypeError):
            raise ValueError(f"sparse_weights: no kernel at {'/'.join(path)} in params") from None
        zero = jnp.zeros((), kernel.dtype)
        if method == "srste":
            if path not in stored:
                raise ValueError(f"sparse_weights: no srste mask for {'/'.join(path)} in sparsity")
            layer = stored[path]
            mask = layer[_TMASK if _TMASK in layer else _MASK]
            w = jnp.where(mask, kernel, zero)
        elif method == "ste":
            mask = _ops.mask24(kernel, axis=-2)
            w = jnp.where(mask, kernel, zero)
        else:
            try:
                beta = _get(sparsity, path + (_BETA,))
            except (KeyError, TypeError):
                raise ValueError(f"sparse_weights: no S-STE beta for {'/'.join(path)} in sparsity") from None
            if kernel.ndim < 2 or np.shape(beta) != kernel.shape[:-2]:
                raise ValueError(f"sparse_weights: soft kernels must be (in, out) (or a stack (L, in, out) with "
                                 f"one beta per layer), got kernel {kernel.shape} and beta {np.shape(beta)} at "
                                 f"{'/'.join(path)}")
            soft = _layer.soft_weight
            for _ in range(kernel.ndim - 2):  # a stack of layers (nn.scan): each (in, out) slice with its beta
                soft = jax.vmap(soft)
            w, mask = soft(kernel, beta)
        new_params = _set(new_params, path + ("kernel",), w)
        masks = _set(masks, path + ("kernel",), mask)
    return new_params, masks


def _kernel_paths(params) -> list:
    """Layer paths (tuples) of every ``kernel`` leaf of at least 2 dimensions, in tree order."""
    found = []

    def visit(path, leaf):
        p = path_tuple(path)
        if p and p[-1] == "kernel" and np.ndim(leaf) >= 2:
            found.append(p[:-1])
        return leaf

    jax.tree_util.tree_map_with_path(visit, params)
    return found


def kernel_flip_rate(old_params, new_params, paths=None):
    """Fraction of 2:4 mask entries that changed between two versions of the kernels.

    For layers whose 2:4 mask is not stored but recomputed from the kernel on every call
    (``method="ste"`` and ``"soft"`` — S-STE's soft threshold keeps the same 2 of 4 entries — and
    AST's :class:`jax_sparse24.distill.Sparse24LowRankDense`): the mask is the 2:4 magnitude mask
    along ``in`` (:func:`jax_sparse24.mask24` of the ``(in, out)`` kernel on axis ``-2``), and its
    flip rate across an optimizer update is this function of the params before and after it.
    (``srste`` layers keep their masks in the ``"sparsity"`` collection; their flip rate is what
    :func:`refresh_masks` returns.)

    ::

        new_params = optax.apply_updates(params, updates)
        flip = kernel_flip_rate(params, new_params, paths=[("h_0", "mlp", "fc"), ...])

    It computes two masks per kernel. To log it every ``n`` steps only, either put it under
    ``lax.cond((step + 1) % n == 0, ...)`` in the step (a conditional costs a host round trip per
    step on a GPU, see :func:`refresh_masks`), or keep the step free of it: on logging steps take
    ``old = kernel_masks(params, paths)`` before the step (1 byte per entry instead of the old
    params) and ``kernel_flip_rate(old, new_params, paths)`` after it, each a small program.

    Args:
      old_params, new_params: params trees of the same structure (e.g. before and after
        ``optax.apply_updates``); only the compared kernels are read, so trees holding just those
        (``{"h_0": {"mlp": {"fc": {"kernel": k}}}}``) work too. ``old_params`` may hold the old
        masks instead of the old kernels (:func:`kernel_masks`: a bool ``kernel`` leaf is taken as
        the mask).
      paths: the layers to compare: module paths in ``params`` (tuples of keys, or ``"a/b"``
        strings), each with a ``kernel`` of shape ``(..., in, out)``, ``in % 4 == 0``. ``None``:
        every ``kernel`` of 2 or more dimensions in ``old_params`` — pass ``paths`` when the model
        also has dense layers (a dense head's kernel would otherwise count too).

    Returns:
      A float32 scalar in [0, 1]: changed mask entries summed over the layers, divided by their
      total number of entries (0 when there is no layer).

    Raises:
      ValueError: a path with no ``kernel`` in either tree, kernels of different shapes, or an
        ``in`` dimension not divisible by 4.

    >>> import jax.numpy as jnp
    >>> old = {"fc": {"kernel": jnp.array([[4.0], [3.0], [1.0], [0.0]])}}
    >>> new = {"fc": {"kernel": jnp.array([[4.0], [0.0], [1.0], [3.0]])}}
    >>> float(kernel_flip_rate(old, new))  # [T, T, F, F] -> [T, F, F, T]: 2 of 4 entries changed
    0.5
    """
    if paths is None:
        paths = _kernel_paths(old_params)
    else:
        paths = _layer_paths(paths, "kernel_flip_rate")
    flips, total = jnp.zeros((), jnp.float32), 0
    for path in paths:
        kernels = []
        for name, tree in (("old_params", old_params), ("new_params", new_params)):
            try:
                kernels.append(_get(tree, path)["kernel"])
            except (KeyError, TypeError, IndexError):
                raise ValueError(f"kernel_flip_rate: {name} has no '{'/'.join(map(str, path + ('kernel',)))}'") from None
        old, new = kernels
        if np.shape(old) != np.shape(new) or np.ndim(old) < 2:
            raise ValueError(f"kernel_flip_rate: the kernels at '{'/'.join(map(str, path))}' must have the same "
                             f"(..., in, out) shape, got {np.shape(old)} and {np.shape(new)}")
        axis = np.ndim(old) - 2
        old_mask = old if jnp.result_type(old) == jnp.bool_ else _kernel_mask(old, path, "kernel_flip_rate")
        flips = flips + jnp.sum(old_mask != _kernel_mask(new, path, "kernel_flip_rate"), dtype=jnp.float32)
        total += int(np.size(old))
    return flips / max(total, 1)


def _kernel_mask(kernel, path, op: str):
    """The 2:4 magnitude mask of an ``(..., in, out)`` kernel along ``in``."""
    if np.ndim(kernel) < 2 or np.shape(kernel)[-2] % 4:
        raise ValueError(f"{op}: the kernel at '{'/'.join(map(str, path))}' must have shape (..., in, out) with "
                         f"in divisible by 4 (whole 2:4 groups), got {np.shape(kernel)}")
    return _ops.mask24(kernel, axis=np.ndim(kernel) - 2)


def kernel_masks(params, paths=None):
    """The 2:4 magnitude masks of kernels, as a tree holding just them (``{"h_0": {"mlp": {"fc":
    {"kernel": bool mask}}}}``): the ``old_params`` of :func:`kernel_flip_rate` for a flip rate
    measured across an update without keeping the old params.

    Args:
      params: a params tree.
      paths: the layers, as for :func:`kernel_flip_rate` (``None``: every kernel of 2 or more
        dimensions).
    """
    paths = _kernel_paths(params) if paths is None else _layer_paths(paths, "kernel_masks")
    out: dict = {}
    for path in paths:
        try:
            kernel = _get(params, path)["kernel"]
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"kernel_masks: params has no '{'/'.join(map(str, path + ('kernel',)))}'") from None
        node = out
        for k in path:
            node = node.setdefault(k, {})
        node["kernel"] = _kernel_mask(kernel, path, "kernel_masks")
    return out


# --------------------------------------------------------------------------------------------------
# Scanned <-> unrolled layouts
# --------------------------------------------------------------------------------------------------


def _is_mapping(x) -> bool:
    return hasattr(x, "keys") and hasattr(x, "items") and not isinstance(x, (jax.Array, np.ndarray))


def _relayout(tree, has_layers, convert, op: str):
    """``tree`` with every mapping for which ``has_layers(mapping)`` holds replaced by ``convert(mapping)``
    (the top-most such mappings; other pytree nodes — optimizer states, train states — pass through)."""
    hits = [0]

    def is_leaf(x):
        return _is_mapping(x) and has_layers(x)

    def fn(x):
        if is_leaf(x):
            hits[0] += 1
            return convert(x)
        return x

    out = jax.tree_util.tree_map(fn, tree, is_leaf=is_leaf)
    return out, hits[0]


def stack_layers(tree, names, name: str):
    """Convert a tree from the unrolled layout (one entry per layer, ``names``) to the scanned one (one
    entry ``name`` whose leaves are stacked along a new leading layer axis), as ``nn.scan`` with
    ``variable_axes={...: 0}`` lays out its variables.

    Works on any pytree holding such mappings — a variables dict, a ``params`` or ``sparsity``
    collection, an optimizer state, a :class:`~jax_sparse24.training.SparseTrainState` — wherever a
    mapping has every key of ``names``. E.g. ``stack_layers(params, [f"h_{i}" for i in range(n)], "h")``.

    Raises:
      ValueError: no mapping has all of ``names``, or a mapping also has ``name``, or the layers'
        trees differ in structure or shapes.
    """
    names = list(names)
    if not names or isinstance(names, str):
        raise ValueError(f"stack_layers: names must be a non-empty list of the layers' keys, got {names!r}")

    def convert(d):
        if name in d:
            raise ValueError(f"stack_layers: a mapping has both the per-layer keys {names[:2]}... and the stacked "
                             f"key {name!r}")
        layers = [d[n] for n in names]
        try:
            stacked = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *layers)
        except (ValueError, TypeError) as e:
            raise ValueError(f"stack_layers: the layers {names[0]!r}...{names[-1]!r} differ in structure or "
                             f"shapes: {e}") from None
        out = {k: v for k, v in d.items() if k not in names}
        out[name] = stacked
        return type(d)(out) if not isinstance(d, dict) else out

    out, hits = _relayout(tree, lambda d: all(n in d for n in names), convert, "stack_layers")
    if not hits:
        raise ValueError(f"stack_layers: no mapping in the tree has the per-layer keys {names[0]!r}...{names[-1]!r} "
                         "(is it already in the scanned layout?)")
    return out


def unstack_layers(tree, name: str, names):
    """The inverse of :func:`stack_layers`: every mapping's entry ``name`` (leaves with a leading layer
    axis of length ``len(names)``) split into one entry per layer, keyed ``names``.

    Raises:
      ValueError: no mapping has ``name``, or a leaf's leading axis is not ``len(names)``.
    """
    names = list(names)
    if not names or isinstance(names, str):
        raise ValueError(f"unstack_layers: names must be a non-empty list of the layers' keys, got {names!r}")

    def convert(d):
        stacked = d[name]
        for leaf in jax.tree_util.tree_leaves(stacked):
            if np.ndim(leaf) < 1 or np.shape(leaf)[0] != len(names):
                raise ValueError(f"unstack_layers: a leaf of {name!r} has shape {np.shape(leaf)}; a stack of "
                                 f"{len(names)} layers needs a leading axis of {len(names)}")
        out = {k: v for k, v in d.items() if k != name}
        for i, n in enumerate(names):
            if n in out:
                raise ValueError(f"unstack_layers: a mapping has both {name!r} and the per-layer key {n!r}")
            out[n] = jax.tree.map(lambda x: x[i], stacked)
        return type(d)(out) if not isinstance(d, dict) else out

    out, hits = _relayout(tree, lambda d: name in d, convert, "unstack_layers")
    if not hits:
        raise ValueError(f"unstack_layers: no mapping in the tree has the stacked key {name!r} (is it already in "
                         "the unrolled layout?)")
    return out
