"""A train state for 2:4 sparse training: :class:`SparseTrainState`.

Flax's ``flax.training.train_state.TrainState`` plus what a 2:4 sparse train step needs: the
``"sparsity"`` collection in every ``apply``, its masks for :func:`jax_sparse24.optim.masked_decay`,
their refresh after the update, an ``"mvue"`` RNG that changes every step, the weights prepared once
per step under gradient accumulation, and the switch between dense and sparse phases::

    state = SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx,
                                    sparsity=v["sparsity"], rng=jax.random.key(1))

    @jax.jit
    def train_step(state, x, y):
        loss_fn = lambda p: ((state.apply(x, params=p) - y) ** 2).mean()
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

The work is done by public functions of :mod:`jax_sparse24.masks` (:func:`~jax_sparse24.masks.masks_for_params`,
:func:`~jax_sparse24.masks.refresh_masks`, ...), :mod:`jax_sparse24.preparation` and
:func:`jax_sparse24.optim.is_sparse_phase`, for a loop of your own.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jax_sparse24 import masks, optim, preparation
from jax_sparse24._src import fp8_math as _fp8
from jax_sparse24.nn import FP8_META, MVUE_RNG

__all__ = ["SparseTrainState"]


def _find(tree, cls) -> list:
    is_cls = lambda x: isinstance(x, cls)  # noqa: E731
    return [x for x in jax.tree_util.tree_leaves(tree, is_leaf=is_cls) if is_cls(x)]


class SparseTrainState(struct.PyTreeNode):
    """Train state of a model with 2:4 sparse layers, in the shape of Flax's ``TrainState``.

    :meth:`apply_gradients` does what a hand-written sparse step does, in order: the ``srste``
    masks to ``tx.update(..., masks=)`` when ``tx`` has :func:`~jax_sparse24.optim.masked_decay`
    (all ones while the model runs dense), the update, the mask refresh due at ``step + 1`` (its
    flip rate in :attr:`flip_rate`), ``step + 1``.

    Phases: with ``dense_after`` (a dense fine-tune from that step) or
    :func:`~jax_sparse24.optim.adamw_step` in ``tx`` (STEP), :meth:`apply` passes the model
    ``sparse=`` :meth:`is_sparse` (a traced flag: one compiled step for both phases). For one
    program per phase pass a Python bool ``sparse=`` to :meth:`apply`, :meth:`prepare` and
    :meth:`apply_gradients` instead.

    Attributes:
      step: int32 scalar, optimizer updates applied so far.
      apply_fn: usually ``model.apply`` (static).
      params: the ``"params"`` collection.
      tx: the optax optimizer (static).
      opt_state: ``tx``'s state.
      sparsity: the ``"sparsity"`` collection (:mod:`jax_sparse24.masks`) of ``model.init``.
      rng: base key of the MVUE weight gradient (step ``s`` uses ``fold_in(rng, s)``), or ``None``.
      flip_rate: float32 scalar, the fraction of mask entries the last refresh changed.
      prepared: the :data:`~jax_sparse24.preparation.PREPARED` collection of :meth:`prepare` for
        the current step, or ``None`` (:meth:`apply_gradients` drops it).
      dense_after: first step of a dense fine-tune, or ``None`` (static).
      fp8_meta: the :data:`~jax_sparse24.nn.FP8_META` collection of delayed-scaling fp8 layers, or
        ``None``; differentiate the loss with respect to it too and pass that gradient (its new
        value) to :meth:`apply_gradients` as ``fp8_meta=``.

    >>> import jax, optax, jax_sparse24 as s24
    >>> model = s24.nn.Sparse24Dense(8, mask_every=1)
    >>> x = jax.numpy.ones((2, 16))
    >>> v = model.init(jax.random.key(0), x)
    >>> tx = optax.chain(s24.optim.masked_decay(2e-4), optax.adamw(1e-2))
    >>> state = SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx,
    ...                                 sparsity=v["sparsity"], rng=jax.random.key(1))
    >>> grads = jax.grad(lambda p: state.apply(x, params=p).sum())(state.params)
    >>> state = state.apply_gradients(grads=grads)
    >>> int(state.step), 0 <= float(state.flip_rate) <= 1
    (1, True)
    """

    step: jax.Array
    apply_fn: Callable = struct.field(pytree_node=False)
    params: Any = struct.field(pytree_node=True)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    opt_state: optax.OptState = struct.field(pytree_node=True)
    sparsity: Any = struct.field(pytree_node=True)
    rng: Optional[jax.Array] = struct.field(pytree_node=True, default=None)
    flip_rate: jax.Array = struct.field(pytree_node=True, default=None)
    prepared: Any = struct.field(pytree_node=True, default=None)
    dense_after: Optional[int] = struct.field(pytree_node=False, default=None)
    fp8_meta: Any = struct.field(pytree_node=True, default=None)

    @classmethod
    def create(cls, *, apply_fn: Callable, params, tx: optax.GradientTransformation, sparsity=None,
               rng: Optional[jax.Array] = None, dense_after: Optional[int] = None, fp8_meta=None,
               **kwargs) -> "SparseTrainState":
        """A new state with ``step=0`` and ``opt_state = tx.init(params)``.

        ``sparsity``: the ``"sparsity"`` collection of ``model.init`` (``{}`` for a model without
        masks), checked against ``params`` (:func:`jax_sparse24.masks.check_sparsity`); ``rng``: a
        PRNG key for the MVUE weight gradient or ``None``; ``dense_after``: first step of a dense
        fine-tune, e.g. ``total - total // 6``; ``fp8_meta``: the ``FP8_META`` collection of a
        model with delayed-scaling fp8 layers; ``**kwargs``: other fields (subclasses).
        """
        _check_create(params, sparsity, dense_after, rng)
        opt_state = tx.init(params)
        if len(_find(opt_state, optim.AdamWStepState)) > 1:
            raise ValueError("SparseTrainState.create: tx contains more than one adamw_step (STEP); its phase "
                             "must be unique")
        return cls(step=jnp.zeros((), jnp.int32), apply_fn=apply_fn, params=params, tx=tx, opt_state=opt_state,
                   sparsity=sparsity, rng=rng, flip_rate=jnp.zeros((), jnp.float32), prepared=None,
                   dense_after=None if dense_after is None else int(dense_after), fp8_meta=fp8_meta or None,
                   **kwargs)

    @property
    def has_phases(self) -> bool:
        """Whether the model switches between sparse and dense (``dense_after`` or STEP in ``tx``)."""
        return self.dense_after is not None or bool(_find(self.opt_state, optim.AdamWStepState))

    def is_sparse(self) -> jax.Array:
        """Whether the model runs sparse at this step (a bool scalar): ``step < dense_after`` (if set)
        and STEP's phase (if ``tx`` has ``adamw_step``)."""
        sparse = jnp.asarray(True)
        if self.dense_after is not None:
            sparse = sparse & (jnp.asarray(self.step) < self.dense_after)
        if _find(self.opt_state, optim.AdamWStepState):
            sparse = sparse & optim.is_sparse_phase(self.opt_state)
        return sparse

    def _sparse_flag(self, sparse):
        if isinstance(sparse, str):
            if sparse != "auto":
                raise ValueError(f"SparseTrainState: sparse must be 'auto', None, a bool or a bool scalar, "
                                 f"got {sparse!r}")
            return self.is_sparse() if self.has_phases else None
        return sparse

    def mvue_key(self, micro_batch=None) -> Optional[jax.Array]:
        """This step's MVUE key, ``fold_in(rng, step)`` (then ``fold_in(., micro_batch)``); ``None`` without ``rng``."""
        if self.rng is None:
            return None
        key = jax.random.fold_in(self.rng, self.step)
        return key if micro_batch is None else jax.random.fold_in(key, micro_batch)

    def variables(self, params=None, *, prepared: bool = True, fp8_meta=None) -> dict:
        """The variables for ``apply_fn``: ``params``, ``sparsity``, the fp8 state and (``prepared``)
        the preparation."""
        v = {"params": self.params if params is None else params}
        if self.sparsity:
            v[masks.SPARSITY] = self.sparsity
        meta = self.fp8_meta if fp8_meta is None else fp8_meta
        if meta:
            v[FP8_META] = meta
        if prepared and self.prepared:
            v[preparation.PREPARED] = self.prepared
        return v

    def apply(self, *args, params=None, sparse="auto", micro_batch=None, rngs=None, fp8_meta=None, **kwargs):
        """``apply_fn(variables, *args, sparse=..., rngs={"mvue": ...}, **kwargs)``.

        ``params`` / ``fp8_meta``: the values to use (the arguments being differentiated; default
        the state's); ``sparse``: ``"auto"`` (:meth:`is_sparse` when the state has phases, else not
        passed), ``None`` (not passed) or a bool passed as ``sparse=``; ``micro_batch``: its index
        under gradient accumulation (its own MVUE key); ``rngs``: other streams.
        """
        flag = self._sparse_flag(sparse)
        if flag is not None:
            kwargs["sparse"] = flag
        rngs = dict(rngs or {})
        key = self.mvue_key(micro_batch)
        if key is not None:
            rngs.setdefault(MVUE_RNG, key)
        if rngs:
            kwargs["rngs"] = rngs
        return self.apply_fn(self.variables(params, fp8_meta=fp8_meta), *args, **kwargs)

    def prepare(self, *args, tokens: Optional[int] = None, reuse: int = 1, sparse="auto", batch="auto",
                **kwargs) -> "SparseTrainState":
        """The state with this step's prepared weights (:func:`jax_sparse24.preparation.prepare` on
        one micro-batch's arguments), which :meth:`apply` hands to every micro-batch."""
        flag = self._sparse_flag(sparse)
        if flag is not None:
            kwargs["sparse"] = flag
        prepared = preparation.prepare_apply(self.apply_fn, self.variables(prepared=False), *args, tokens=tokens,
                                             reuse=reuse, batch=batch, op="SparseTrainState.prepare", **kwargs)
        return self.replace(prepared=prepared or None)

    def prune_to_masks(self, *, reset_moments: bool = False, method: str | None = None,
                       paths=None) -> "SparseTrainState":
        """The state with the 2:4 kernels set to the weights the sparse forward pass uses
        (:func:`jax_sparse24.masks.prune_to_masks`), for the switch to a dense fine-tune.
        ``reset_moments``: also zero the pruned positions of the params-shaped trees of the
        optimizer state (Adam's moments)."""
        params, sparsity, pruned = masks.prune_to_masks(self.params, self.sparsity, method=method, paths=paths)
        opt_state = masks.zero_pruned(self.opt_state, pruned) if reset_moments else self.opt_state
        return self.replace(params=params, opt_state=opt_state, sparsity=sparsity, prepared=None)

    def decay_masks(self, sparse="auto"):
        """The ``masks=`` of ``tx.update``: the ``srste`` masks (all ones while the model runs dense);
        ``None`` when ``tx`` has no ``masked_decay`` or the model no ``srste`` layer."""
        if not _find(self.opt_state, optim.MaskedDecayState):
            return None
        flag = self._sparse_flag(sparse)
        decay = masks.masks_for_params(self.params, self.sparsity, sparse=True if flag is None else flag)
        if all(m is None for m in jax.tree_util.tree_leaves(decay, is_leaf=lambda x: x is None)):
            return None
        return decay

    def apply_gradients(self, *, grads, sparse="auto", refresh: bool = True, **kwargs) -> "SparseTrainState":
        """The state after one optimizer step with ``grads``: masked decay, update, mask refresh.

        ``sparse``: whether this step's forward pass ran sparse (``"auto"``: :meth:`is_sparse`);
        ``refresh=False``: masks unchanged and ``flip_rate`` 0 (refresh with :meth:`refresh_masks`
        in a program of its own, sparing a GPU step the host round trip of the refresh's
        ``lax.cond``); ``**kwargs``: other fields to replace, ``fp8_meta=`` required with
        delayed-scaling fp8 layers.
        """
        if self.fp8_meta is not None:
            if "fp8_meta" not in kwargs:
                raise ValueError(
                    "SparseTrainState.apply_gradients: the model has delayed-scaling fp8 layers; pass fp8_meta= "
                    "the gradient of the loss with respect to state.fp8_meta (state.apply(x, params=p, fp8_meta=m), "
                    "jax.grad(loss, argnums=(0, 1))(state.params, state.fp8_meta)): without it the amax "
                    "histories never update and every scale stays at its initial value")
            # a layer that got no gradient this step (its output off the loss) keeps its state
            kwargs["fp8_meta"] = _fp8.keep_unupdated(self.fp8_meta, kwargs["fp8_meta"])
        decay = self.decay_masks(sparse)
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params,
                                            **({} if decay is None else {"masks": decay}))
        params = optax.apply_updates(self.params, updates)
        step = jnp.asarray(self.step, jnp.int32) + 1
        sparsity, flip_rate = self.sparsity, jnp.zeros((), jnp.float32)
        if refresh:
            sparsity, flip_rate = masks.refresh_masks(params, self.sparsity, step=step)
        return self.replace(step=step, params=params, opt_state=opt_state, sparsity=sparsity,
                            flip_rate=jnp.asarray(flip_rate, jnp.float32), prepared=None, **kwargs)

    def refresh_masks(self) -> "SparseTrainState":
        """The state with the masks due at :attr:`step` refreshed and their :attr:`flip_rate`, without a
        conditional: :meth:`apply_gradients`'s refresh as a program of its own, run on the steps
        :func:`jax_sparse24.masks.refresh_due` names (every layer's mask is computed)."""
        sparsity, flip_rate = masks.refresh_masks(self.params, self.sparsity, step=self.step, skip_idle=False)
        return self.replace(sparsity=sparsity, flip_rate=jnp.asarray(flip_rate, jnp.float32), prepared=None)


def _check_create(params, sparsity, dense_after, rng) -> None:
    """:meth:`SparseTrainState.create`'s argument checks."""
    op = "SparseTrainState.create"
    if sparsity is None:
        raise ValueError(f"{op}: pass sparsity=variables['sparsity'] from model.init(...) (the 2:4 masks of the "
                         "Sparse24Dense layers; {} for a model without masks)")
    if hasattr(params, "keys") and FP8_META in params:
        raise ValueError(f"{op}: params has a '{FP8_META}' entry; pass the delayed-scaling fp8 state as "
                         f"fp8_meta=variables['{FP8_META}'] and params=variables['params']")
    if hasattr(params, "keys") and (masks.SPARSITY in params or "params" in params):
        raise ValueError(f"{op}: params looks like a whole variables dict (it has a "
                         f"'{'params' if 'params' in params else masks.SPARSITY}' entry); pass "
                         "params=variables['params'], sparsity=variables['sparsity']")
    if dense_after is not None and (isinstance(dense_after, bool) or int(dense_after) != dense_after
                                    or dense_after < 0):
        raise ValueError(f"{op}: dense_after must be a non-negative int step or None, got {dense_after!r}")
    if rng is not None and not (jnp.issubdtype(jnp.result_type(rng), jax.dtypes.prng_key)
                                or jnp.result_type(rng) == jnp.uint32):
        raise ValueError(f"{op}: rng must be a PRNG key (jax.random.key(seed)) or None, got {rng!r}")
    masks.check_sparsity(params, sparsity, "SparseTrainState")
