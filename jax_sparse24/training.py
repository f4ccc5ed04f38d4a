"""A train state for 2:4 sparse training: :class:`SparseTrainState`.

Flax's ``flax.training.train_state.TrainState`` holds ``step``, ``params``, ``tx`` and
``opt_state``. A 2:4 sparse train step needs more, and wiring it by hand is easy to get subtly
wrong: the ``"sparsity"`` collection (masks) goes into every ``apply``, the masks go to
:func:`jax_sparse24.optim.masked_decay` through ``tx.update(..., masks=...)``, the masks are
refreshed after the update (:func:`jax_sparse24.nn.refresh_masks`), the MVUE weight gradient wants
an ``"mvue"`` RNG that changes every step, gradient accumulation wants the weights prepared once
per step (:func:`jax_sparse24.nn.prepare`), and the dense fine-tune / STEP recipes switch the
model between dense and sparse. :class:`SparseTrainState` owns all of it::

    state = SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx,
                                    sparsity=v["sparsity"], rng=jax.random.key(1))

    @jax.jit
    def train_step(state, x, y):
        loss_fn = lambda p: ((state.apply(x, params=p) - y) ** 2).mean()
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

It is a ``flax.struct.PyTreeNode``: it passes through ``jit`` (``apply_fn`` and ``tx`` are static),
takes shardings like any pytree and is saved / restored by orbax as one pytree. The lower-level
functions it calls (:func:`jax_sparse24.nn.masks_for_params`, :func:`jax_sparse24.nn.refresh_masks`,
:func:`jax_sparse24.nn.prepare`, :func:`jax_sparse24.optim.is_sparse_phase`) stay public for your
own loop.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jax_sparse24 import nn as _nn
from jax_sparse24._src import fp8 as _fp8
from jax_sparse24 import optim as _optim
from jax_sparse24._src import validation as v
from jax_sparse24._src.validation import check_positive_int

__all__ = ["SparseTrainState"]

_AUTO = "auto"


def _find(tree, cls) -> list:
    is_cls = lambda x: isinstance(x, cls)  # noqa: E731
    return [x for x in jax.tree_util.tree_leaves(tree, is_leaf=is_cls) if is_cls(x)]


def _path_str(path) -> str:
    return "/".join(str(p) for p in path)


def _check_sparsity(params, sparsity) -> None:
    """Every 2:4 layer of ``sparsity`` has a kernel of its mask's shape in ``params``; periods >= 1."""
    for path, layer in _nn._layer_states(sparsity):
        name = _nn._TMASK if _nn._TMASK in layer else _nn._MASK
        try:
            kernel = _nn._get(params, path)["kernel"]
        except (KeyError, TypeError, IndexError):
            raise ValueError(
                f"SparseTrainState: the sparsity collection has a 2:4 layer at '{_path_str(path)}' but "
                f"params has no '{_path_str(path + ('kernel',))}': pass the 'params' and 'sparsity' "
                "collections of the same model.init(...)"
            ) from None
        if np.shape(kernel) != np.shape(layer[name]):
            raise ValueError(
                f"SparseTrainState: the mask of '{_path_str(path)}' has shape {np.shape(layer[name])} but its "
                f"kernel {np.shape(kernel)}: pass the 'params' and 'sparsity' collections of the same model.init(...)"
            )
        # The layers trust their collection's masks (no device check in the step): a concrete mask
        # handed in here (e.g. edited or loaded by the user) is checked once, 2:4 along in (axis -2)
        # and, for a transposable mask, along out (axis -1), per layer of a stack.
        where = f"SparseTrainState: sparsity '{_path_str(path + (name,))}'"
        v.check_concrete_mask_on_device(layer[name], 2, 4, -2, where, name, axis_name="in")
        if name == _nn._TMASK:
            v.check_concrete_mask_on_device(layer[name], 2, 4, -1, where, name, axis_name="out, transposable")
        try:  # (a stack of layers, nn.scan's, has one period per layer)
            every = None if _nn._EVERY not in layer else int(np.min(np.asarray(layer[_nn._EVERY])))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError, ValueError):
            every = None  # traced (create under jit): not checked
        if every is not None and every < 1:
            raise ValueError(
                f"SparseTrainState: '{_path_str(path)}' has mask_every={every}; the mask refresh period "
                "must be a positive number of optimizer steps (Sparse24Dense(mask_every=...))"
            )


class SparseTrainState(struct.PyTreeNode):
    """Train state of a model with 2:4 sparse layers, in the shape of Flax's ``TrainState``.

    Build it with :meth:`create`, run the model with :meth:`apply` and update it with
    :meth:`apply_gradients`, which does, in order, what a hand-written sparse train step does:

    1. SR-STE masked decay: when the optimizer contains :func:`jax_sparse24.optim.masked_decay`
       and the model has ``srste`` layers, ``tx.update`` gets ``masks=`` the masks the forward
       pass used (:func:`jax_sparse24.nn.masks_for_params`); while the model runs dense (the
       fine-tune after ``dense_after``, STEP's precondition phase) the masks given are all ones,
       so nothing is decayed;
    2. the optimizer update (``tx.update`` + ``optax.apply_updates``);
    3. the mask refresh :func:`jax_sparse24.nn.refresh_masks` with ``step=step + 1`` (each layer
       every ``mask_every`` steps), its flip rate kept in :attr:`flip_rate` (or, with
       ``refresh=False``, none: :meth:`refresh_masks` then does it in a program of its own, which
       spares a GPU step the host round trip of the refresh's ``lax.cond``);
    4. ``step + 1``; the preparation of :meth:`prepare` is dropped (it is stale).

    Phases: :meth:`is_sparse` says whether the model runs sparse at the current step — ``step <
    dense_after`` when ``dense_after`` is set (sparse training, then a dense fine-tune), and STEP's
    phase (:func:`jax_sparse24.optim.is_sparse_phase`) when ``tx`` contains
    :func:`jax_sparse24.optim.adamw_step`. With either, :meth:`apply` passes ``sparse=`` that flag
    to the model (its ``__call__`` must take ``sparse=`` and hand it to its ``Sparse24Dense``
    layers): a traced flag, so one compiled step serves both phases (the layers ``lax.cond``
    between the sparse and the dense computation). For one program per phase instead, pass a
    Python bool ``sparse=`` to :meth:`apply`, :meth:`prepare` and :meth:`apply_gradients` (static
    argument of the jitted step) and read ``bool(state.is_sparse())`` on the host between steps.

    Attributes:
      step: int32 scalar, optimizer updates applied so far.
      apply_fn: usually ``model.apply`` (static).
      params: the ``"params"`` collection.
      tx: the optax optimizer (static).
      opt_state: ``tx``'s state.
      sparsity: the ``"sparsity"`` collection (masks, refresh periods, S-STE β) of ``model.init``.
      rng: base key of the MVUE weight gradient (step ``s`` uses ``fold_in(rng, s)``), or ``None``
        for no ``"mvue"`` RNG stream (exact weight gradients).
      flip_rate: float32 scalar, the fraction of mask entries the last mask refresh changed (0 on
        steps where no layer refreshed).
      prepared: the :data:`jax_sparse24.nn.PREPARED` collection made by :meth:`prepare` for the
        current step, or ``None``. Only inside a step: :meth:`apply_gradients` resets it.
      dense_after: first step of a dense fine-tune, or ``None`` (static).
      fp8_meta: the :data:`jax_sparse24.nn.FP8_META` collection of a model with delayed-scaling fp8
        layers (``Sparse24Dense(fp8=True, fp8_scaling="delayed")``), or ``None``. Differentiate the
        loss with respect to it as well (``state.apply(x, params=p, fp8_meta=m)``) and pass that
        gradient — its new value — to :meth:`apply_gradients` as ``fp8_meta=``.

    >>> import jax, optax, jax_sparse24 as s24
    >>> from flax import linen as nn
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

    # ------------------------------------------------------------------------------------------
    # construction
    # ------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, *, apply_fn: Callable, params, tx: optax.GradientTransformation, sparsity=None,
               rng: Optional[jax.Array] = None, dense_after: Optional[int] = None, fp8_meta=None,
               **kwargs) -> "SparseTrainState":
        """A new state with ``step=0`` and ``opt_state = tx.init(params)``.

        Args:
          apply_fn: the model's apply function (``model.apply``).
          params: the ``"params"`` collection of ``model.init(...)``.
          tx: the optimizer, e.g. ``optax.chain(s24.optim.masked_decay(2e-4), optax.adamw(1e-3))``.
          sparsity: the ``"sparsity"`` collection of ``model.init(...)`` (``{}`` for a model without
            masks, e.g. only ``ste`` / ``soft`` / ``dense`` layers).
          rng: a PRNG key for the MVUE weight gradient (``jax.random.key(...)``), or ``None`` for
            none (the exact weight gradient everywhere).
          dense_after: first step of a dense fine-tune (the model runs dense from that step on),
            e.g. ``total - total // 6``; ``None``: no fine-tune.
          fp8_meta: the :data:`jax_sparse24.nn.FP8_META` collection of ``model.init(...)`` for a
            model with delayed-scaling fp8 layers (``None`` otherwise).
          **kwargs: other fields (subclasses).

        Raises:
          ValueError: ``sparsity`` missing, not matching ``params`` or with a ``mask_every`` below 1,
            ``params`` that is a whole variables dict, a negative ``dense_after``, more than one
            :func:`~jax_sparse24.optim.adamw_step` in ``tx``.
        """
        if sparsity is None:
            raise ValueError(
                "SparseTrainState.create: pass sparsity=variables['sparsity'] from model.init(...) (the "
                "2:4 masks of the Sparse24Dense layers; {} for a model without masks)"
            )
        if hasattr(params, "keys") and _nn.FP8_META in params:
            raise ValueError(
                f"SparseTrainState.create: params has a '{_nn.FP8_META}' entry; pass the delayed-scaling fp8 "
                f"state as fp8_meta=variables['{_nn.FP8_META}'] and params=variables['params']"
            )
        if hasattr(params, "keys") and (_nn.SPARSITY in params or "params" in params):
            raise ValueError(
                "SparseTrainState.create: params looks like a whole variables dict (it has a "
                f"'{'params' if 'params' in params else _nn.SPARSITY}' entry); pass params=variables['params'], "
                "sparsity=variables['sparsity']"
            )
        if dense_after is not None and (isinstance(dense_after, bool) or int(dense_after) != dense_after
                                        or dense_after < 0):
            raise ValueError(
                f"SparseTrainState.create: dense_after must be a non-negative int step or None, got {dense_after!r}"
            )
        _check_sparsity(params, sparsity)
        opt_state = tx.init(params)
        if len(_find(opt_state, _optim.AdamWStepState)) > 1:
            raise ValueError("SparseTrainState.create: tx contains more than one adamw_step (STEP); its phase "
                             "must be unique")
        if rng is not None and not (jnp.issubdtype(jnp.result_type(rng), jax.dtypes.prng_key)
                                    or jnp.result_type(rng) == jnp.uint32):
            raise ValueError(f"SparseTrainState.create: rng must be a PRNG key (jax.random.key(seed)) or None, "
                             f"got {rng!r}")
        return cls(step=jnp.zeros((), jnp.int32), apply_fn=apply_fn, params=params, tx=tx, opt_state=opt_state,
                   sparsity=sparsity, rng=rng, flip_rate=jnp.zeros((), jnp.float32), prepared=None,
                   dense_after=None if dense_after is None else int(dense_after), fp8_meta=fp8_meta or None,
                   **kwargs)

    # ------------------------------------------------------------------------------------------
    # phases
    # ------------------------------------------------------------------------------------------

    @property
    def has_phases(self) -> bool:
        """Whether the model switches between sparse and dense (``dense_after`` or STEP in ``tx``)."""
        return self.dense_after is not None or bool(_find(self.opt_state, _optim.AdamWStepState))

    def is_sparse(self) -> jax.Array:
        """Whether the model runs sparse at this step: a bool scalar (traced under ``jit``).

        ``step < dense_after`` (if set) and STEP's phase (if ``tx`` contains ``adamw_step``); ``True``
        without either.
        """
        sparse = jnp.asarray(True)
        if self.dense_after is not None:
            sparse = sparse & (jnp.asarray(self.step) < self.dense_after)
        if _find(self.opt_state, _optim.AdamWStepState):
            sparse = sparse & _optim.is_sparse_phase(self.opt_state)
        return sparse

    def _sparse_flag(self, sparse):
        if isinstance(sparse, str):
            if sparse != _AUTO:
                raise ValueError(f"SparseTrainState: sparse must be 'auto', None, a bool or a bool scalar, got {sparse!r}")
            return self.is_sparse() if self.has_phases else None
        return sparse

    # ------------------------------------------------------------------------------------------
    # running the model
    # ------------------------------------------------------------------------------------------

    def mvue_key(self, micro_batch=None) -> Optional[jax.Array]:
        """This step's MVUE key, ``fold_in(rng, step)`` (then ``fold_in(., micro_batch)``); ``None`` without ``rng``."""
        if self.rng is None:
            return None
        key = jax.random.fold_in(self.rng, self.step)
        return key if micro_batch is None else jax.random.fold_in(key, micro_batch)

    def variables(self, params=None, *, prepared: bool = True, fp8_meta=None) -> dict:
        """``{"params", "sparsity"}`` for ``apply_fn`` (and the prepared weights, if any and ``prepared``;
        the delayed-scaling fp8 state: ``fp8_meta``, default :attr:`fp8_meta`)."""
        v = {"params": self.params if params is None else params}
        if self.sparsity:
            v[_nn.SPARSITY] = self.sparsity
        meta = self.fp8_meta if fp8_meta is None else fp8_meta
        if meta:
            v[_nn.FP8_META] = meta
        if prepared and self.prepared:
            v[_nn.PREPARED] = self.prepared
        return v

    def apply(self, *args, params=None, sparse=_AUTO, micro_batch=None, rngs=None, fp8_meta=None, **kwargs):
        """``apply_fn(variables, *args, sparse=..., rngs={"mvue": ...}, **kwargs)``.

        Args:
          *args, **kwargs: as for ``model.apply`` (``method=``, ``mutable=``, model arguments).
          params: the params to use (the argument of the loss being differentiated); default
            ``self.params``.
          sparse: ``"auto"`` (the default): :meth:`is_sparse` when the state has phases, else not
            passed; ``None``: not passed; a bool or bool scalar: passed to the model as ``sparse=``.
          micro_batch: index of the micro-batch under gradient accumulation (its own MVUE key).
          rngs: other RNG streams (e.g. ``{"dropout": key}``); ``"mvue"`` is added from ``rng``.
          fp8_meta: the delayed-scaling fp8 state to use — the argument of the loss being
            differentiated, so that its gradient is the new state; default :attr:`fp8_meta`.
        """
        flag = self._sparse_flag(sparse)
        if flag is not None:
            kwargs["sparse"] = flag
        key = self.mvue_key(micro_batch)
        rngs = dict(rngs or {})
        if key is not None:
            rngs.setdefault(_nn.MVUE_RNG, key)
        if rngs:
            kwargs["rngs"] = rngs
        return self.apply_fn(self.variables(params, fp8_meta=fp8_meta), *args, **kwargs)

    def prepare(self, *args, tokens: Optional[int] = None, reuse: int = 1, sparse=_AUTO, batch="auto",
                **kwargs) -> "SparseTrainState":
        """The state with this step's prepared weights, for gradient accumulation.

        Runs :func:`jax_sparse24.nn.prepare` (the masking and compression of every sparse layer's
        weight, once per optimizer step) on one micro-batch's arguments and keeps the result in
        :attr:`prepared`, which :meth:`apply` then hands to every micro-batch::

            state = state.prepare(micro[0], reuse=n)          # inside the jitted step
            def body(acc, inp):
                j, xb = inp
                g = jax.grad(lambda p: loss(state.apply(xb, params=p, micro_batch=j)))(state.params)
                return jax.tree.map(jnp.add, acc, g), None

        Args:
          *args, **kwargs: as for :meth:`apply` on one micro-batch (only the shapes matter).
          tokens, reuse, batch: see :func:`jax_sparse24.nn.prepare` (``reuse``: micro-batches per
            step; ``batch``: all layers' compressions in few kernel launches).
          sparse: as for :meth:`apply`; layers called with ``sparse=False`` are not prepared.
        """
        check_positive_int(tokens, "tokens", "SparseTrainState.prepare", allow_none=True)
        check_positive_int(reuse, "reuse", "SparseTrainState.prepare")
        _nn._check_batch(batch, "SparseTrainState.prepare")
        flag = self._sparse_flag(sparse)
        if flag is not None:
            kwargs["sparse"] = flag
        prepared = _nn._run_prepare(
            lambda: self.apply_fn(self.variables(prepared=False), *args, mutable=[_nn.PREPARED], **kwargs),
            tokens, reuse, batch)
        return self.replace(prepared=prepared or None)

    def prune_to_masks(self, *, reset_moments: bool = False, method: str | None = None,
                       paths=None) -> "SparseTrainState":
        """The state with the 2:4 kernels set to the weights the sparse forward pass uses.

        For the switch to a dense fine-tune (``dense_after``): the dense model then starts from
        exactly the function the 2:4 model computed, instead of taking back at once the pruned
        weights, which the forward pass has not used since the masks pruned them (SR-STE decays
        them towards zero, but not to zero). Call it once, on the state of the first dense step::

            if step == dense_after:
                state = state.prune_to_masks()

        Without ``method``: every ``srste`` kernel becomes ``kernel * mask`` with the masks the sparse
        forward pass would use at this step (the transposable mask where the layer keeps one), as
        :func:`jax_sparse24.nn.apply_masks`; layers without stored masks are unchanged. With
        ``method`` and ``paths``: the layers at ``paths`` (module paths) of that
        :class:`~jax_sparse24.nn.Sparse24Dense` method, whose masks are not stored — ``"ste"``
        (``kernel ⊙ mask24(kernel)``) and ``"soft"`` (S-STE's ``β·S(kernel)``, values changed too) —
        as :func:`jax_sparse24.nn.sparse_weights`. ``step`` is unchanged, and so is the ``sparsity``
        collection except that ``soft`` layers' β become 1 (the dense phase does not read β; with β = 1
        the soft threshold of the new kernels is the kernels themselves). So a second call changes
        nothing, for every method.

        Args:
          reset_moments: also zero, at the pruned positions, every entry of the optimizer state
            that is a params-shaped tree (Adam's ``mu`` and ``nu``, ``adamw_step``'s moments), so
            the pruned weights restart like freshly added ones (their moments then rebuild from
            the dense gradients). ``False``: the optimizer state is kept.
          method, paths: see above (both or neither).

        Returns:
          The new state (``prepared=None``: the preparation was of the old weights).
        """
        if (method is None) != (paths is None):
            raise ValueError("prune_to_masks: pass method and paths together (or neither, for srste's stored masks)")
        if method is None:
            masks = _nn.masks_for_params(self.params, self.sparsity)
        else:
            params, masks = _nn.sparse_weights(self.params, self.sparsity, method=method, paths=paths)
        is_none = lambda x: x is None  # noqa: E731

        def prune(tree):
            return jax.tree.map(lambda m, x: x if m is None else jnp.where(m, x, jnp.zeros((), x.dtype)),
                                masks, tree, is_leaf=is_none)

        sparsity = self.sparsity
        if method is None:
            params = prune(self.params)
        elif method == "soft":
            for path in _nn._layer_paths(paths, "prune_to_masks"):
                beta = _nn._get(sparsity, path + (_nn._BETA,))
                sparsity = _nn._set(sparsity, path + (_nn._BETA,), jnp.ones_like(beta))
        opt_state = self.opt_state
        if reset_moments:
            params_def = jax.tree.structure(self.params)
            is_params = lambda x: (not isinstance(x, (jax.Array, np.ndarray))  # noqa: E731
                                   and jax.tree.structure(x) == params_def)
            opt_state = jax.tree.map(lambda x: prune(x) if is_params(x) else x, opt_state, is_leaf=is_params)
        return self.replace(params=params, opt_state=opt_state, sparsity=sparsity, prepared=None)

    # ------------------------------------------------------------------------------------------
    # the update
    # ------------------------------------------------------------------------------------------

    def decay_masks(self, sparse=_AUTO):
        """The ``masks=`` of ``tx.update``: the ``srste`` masks (all ones while the model runs dense).

        ``None`` when ``tx`` has no :func:`~jax_sparse24.optim.masked_decay` or the model no ``srste``
        layer (``masked_decay`` then computes its masks with its ``mask_fn``; stop it with its
        ``active_until``).
        """
        if not _find(self.opt_state, _optim.MaskedDecayState):
            return None
        masks = _nn.masks_for_params(self.params, self.sparsity)
        if all(m is None for m in jax.tree_util.tree_leaves(masks, is_leaf=lambda x: x is None)):
            return None
        flag = self._sparse_flag(sparse)
        if flag is None or flag is True:
            return masks
        ones = lambda m: None if m is None else jnp.ones_like(m)  # noqa: E731 - nothing pruned: no decay
        if flag is False:
            return jax.tree.map(ones, masks, is_leaf=lambda x: x is None)
        flag = jnp.asarray(flag)
        return jax.tree.map(lambda m: None if m is None else jnp.where(flag, m, jnp.ones_like(m)), masks,
                            is_leaf=lambda x: x is None)

    def apply_gradients(self, *, grads, sparse=_AUTO, refresh: bool = True, **kwargs) -> "SparseTrainState":
        """The state after one optimizer step with ``grads`` (masked decay, update, mask refresh).

        Args:
          grads: gradients with the structure of ``params``.
          sparse: whether this step's forward pass ran sparse, for the masked decay: ``"auto"``
            (:meth:`is_sparse`), or the Python bool the step passed to :meth:`apply`.
          refresh: ``True``: the mask refresh of the layers due at ``step + 1``, inside the step
            under one ``lax.cond`` (on a GPU the host then waits for the device once per step,
            ~0.5% of a GPT-2 124M step on the H200; see :meth:`refresh_masks`); ``False``: masks unchanged
            and ``flip_rate`` 0 -- refresh them with :meth:`refresh_masks` in a program of its
            own on the steps where a layer is due.
          **kwargs: other fields to replace (as Flax's ``TrainState.apply_gradients``); with
            delayed-scaling fp8 layers ``fp8_meta=`` the gradient of the loss with respect to
            :attr:`fp8_meta` (its new value; required).

        Returns:
          The new state: ``step + 1``, updated ``params`` and ``opt_state``, refreshed ``sparsity``,
          the refresh's ``flip_rate``, ``prepared=None``.
        """
        if self.fp8_meta is not None and "fp8_meta" not in kwargs:
            raise ValueError(
                "SparseTrainState.apply_gradients: the model has delayed-scaling fp8 layers; pass fp8_meta= the "
                "gradient of the loss with respect to state.fp8_meta (state.apply(x, params=p, fp8_meta=m), "
                "jax.grad(loss, argnums=(0, 1))(state.params, state.fp8_meta)): without it the amax histories "
                "never update and every scale stays at its initial value"
            )
        if self.fp8_meta is not None:
            # a layer that got no gradient this step (its output off the loss) keeps its state
            kwargs["fp8_meta"] = _fp8.keep_unupdated(self.fp8_meta, kwargs["fp8_meta"])
        masks = self.decay_masks(sparse)
        extra = {} if masks is None else {"masks": masks}
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params, **extra)
        params = optax.apply_updates(self.params, updates)
        step = jnp.asarray(self.step, jnp.int32)
        if refresh:
            sparsity, flip_rate = _nn.refresh_masks(params, self.sparsity, step=step + 1)
        else:
            sparsity, flip_rate = self.sparsity, jnp.zeros((), jnp.float32)
        return self.replace(step=step + 1, params=params, opt_state=opt_state, sparsity=sparsity,
                            flip_rate=jnp.asarray(flip_rate, jnp.float32), prepared=None, **kwargs)

    def refresh_masks(self) -> "SparseTrainState":
        """The state with the masks of the layers due at :attr:`step` refreshed (``step % mask_every
        == 0``, each layer its own period) and their :attr:`flip_rate`: the refresh of
        :meth:`apply_gradients` as a program of its own, without a conditional.

        A ``lax.cond`` inside the train step costs a host round trip per step on a GPU (the host
        reads the predicate and waits for the device to reach it; ~0.5% of a GPT-2 124M step
        on the H200, ``docs/performance.md``). Leave it out of the step and refresh only on the
        steps that need it::

            periods = s24.nn.mask_periods(state.sparsity)        # host ints, read once
            refresh = jax.jit(lambda s: s.refresh_masks(), donate_argnums=0)

            @jax.jit
            def train_step(state, x, y):
                ...
                return state.apply_gradients(grads=grads, refresh=False), loss

            for i in range(n):
                state, loss = train_step(state, x, y)
                if s24.nn.refresh_due(periods, i + 1):           # the host's count of updates
                    state = refresh(state)

        Same masks and flip rate as ``apply_gradients(refresh=True)``. Every layer's mask is
        computed (the due ones kept), so call it on due steps only.
        """
        sparsity, flip_rate = _nn.refresh_masks(self.params, self.sparsity, step=self.step, skip_idle=False)
        return self.replace(sparsity=sparsity, flip_rate=jnp.asarray(flip_rate, jnp.float32), prepared=None)
