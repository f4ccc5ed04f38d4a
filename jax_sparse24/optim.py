"""Optax gradient transformations and schedules for 2:4 sparse training.

* :func:`masked_decay` — SR-STE masked decay ``g ← g + α·(1 − M)⊙W``, chained before the optimizer.
* :func:`sparse_lr_scale` — the 2:4 weights' learning rate × ``1/density`` (2), chained after the
  optimizer: a 2:4 layer has half the inputs per output, so an Adam step moves its output half as
  far as a dense layer's; without it the sparse layers lag early in training and the model's loss
  spikes.
* :func:`adamw_step` — STEP (Lu et al. 2023): AdamW whose second moment of the sparse weights is
  frozen once it has converged (AutoSwitch), after which the model trains sparse (the other
  parameters stay plain AdamW): ``optax.adamw`` with :func:`scale_by_step_adam` (the Adam scaling
  with STEP's precondition phase and switch) in place of ``optax.scale_by_adam``;
  :func:`is_sparse_phase` reads the phase out of any (chained / injected / wrapped) optimizer state.
* :func:`sparsity_schedule` / :func:`dense_finetune_schedule` — "sparse, then dense fine-tune"
  step schedules for the model's ``sparse=`` flag.

Step convention used throughout: ``step`` is the number of optimizer updates already applied
(0 for the first training step), i.e. the ``count`` an optax state holds *before* the update.

Every transformation is jit-, scan- and ``optax.inject_hyperparams``-compatible. Callable
arguments that are not schedules (``where``, ``mask_fn``) must be named in ``static_args`` when
wrapping with ``optax.inject_hyperparams`` (it treats every callable as a schedule otherwise).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_sparse24._src import ops
from jax_sparse24._src.tree_paths import key_str as _key_str
from jax_sparse24._src.tree_paths import path_str as _path_str

__all__ = [
    "AdamWStepState",
    "MaskedDecayState",
    "SparseLRScaleState",
    "adamw_step",
    "default_where",
    "dense_finetune_schedule",
    "is_sparse_phase",
    "magnitude_masks",
    "masked_decay",
    "sparse_lr_scale",
    "scale_by_step_adam",
    "sparsity_schedule",
    "step_phase",
    "step_state",
]

ScalarOrSchedule = Union[float, jax.Array, Callable[[jax.Array], jax.Array]]
#: ``where(path, leaf) -> bool``: ``path`` is the leaf's key path joined by ``"/"``, e.g.
#: ``"params/Dense_0/kernel"``.
WhereFn = Callable[[str, Any], bool]

_INT32_MAX = np.iinfo(np.int32).max


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def _safe_increment(count):
    count = jnp.asarray(count)
    return jnp.where(count < _INT32_MAX, count + 1, _INT32_MAX).astype(count.dtype)


def _is_python_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def default_where(path: str, leaf) -> bool:
    """Default selection of the 2:4 sparse weights.

    A leaf is selected when it is 2-D, its key path ends in ``"kernel"`` and its first (input)
    axis is divisible by 4: the ``(in, out)`` kernel of a Flax ``Dense`` / ``Sparse24Dense``,
    grouped 2:4 along the contraction (input) axis.

    Args:
      path: the leaf's key path joined by ``"/"`` (e.g. ``"params/Dense_0/kernel"``).
      leaf: the leaf (an array or anything with ``shape``).

    Returns:
      Whether the leaf is a 2:4 sparse weight.

    >>> import jax.numpy as jnp
    >>> default_where("params/Dense_0/kernel", jnp.zeros((8, 3)))
    True
    >>> default_where("params/Dense_0/bias", jnp.zeros((3,)))
    False
    """
    shape = np.shape(leaf)
    return len(shape) == 2 and path.split("/")[-1].endswith("kernel") and shape[0] % 4 == 0


def _select(tree, where: Optional[WhereFn]):
    """Flat list of (leaf_index, selected) for a tree, with ``where`` applied to every leaf."""
    where = default_where if where is None else where
    leaves_with_path = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [bool(where(_path_str(p), x)) for p, x in leaves_with_path]


def magnitude_masks(params, *, where: Optional[WhereFn] = None, transposable: bool = False):
    """2:4 magnitude masks of the sparse weights in ``params`` (``None`` for every other leaf).

    The one way to make the 2:4 magnitude masks of a params tree: :func:`jax_sparse24.masks.kernel_masks`
    is a thin alias selecting layers by path (just their kernels kept: the ``old_params`` of
    :func:`jax_sparse24.masks.kernel_flip_rate`). :func:`jax_sparse24.prune.prune_trained` prunes a
    trained model to ASP's N:M patterns (its default ``"m4n2_1d"`` keeps the same 2 of 4) and zeroes
    the pruned weights.

    Args:
      params: a pytree of parameters.
      where: ``where(path, leaf) -> bool`` selecting the sparse weights; default
        :func:`default_where` (2-D ``kernel`` leaves with the input dim divisible by 4).
      transposable: use ``transposable_mask24`` (both W and Wᵀ 2:4; needs both dims divisible by
        4) instead of ``mask24(w, axis=0)`` (2:4 along the input axis of an ``(in, out)`` kernel).
        A selected leaf of more dimensions is a stack of ``(in, out)`` kernels (``nn.scan``'s
        ``(L, in, out)``): masked per slice, along axis -2. (:func:`default_where` selects 2-D
        kernels only; select stacked ones with ``where``, or pass ``masks=`` to :func:`masked_decay`
        — :func:`jax_sparse24.masks.masks_for_params` gives stacked masks for stacked kernels.)

    Returns:
      A pytree with ``params``'s structure whose leaves are ``bool`` masks for the selected
      leaves and ``None`` for the rest — the ``masks=`` argument of :func:`masked_decay`.

    >>> import jax.numpy as jnp
    >>> m = magnitude_masks({"kernel": jnp.array([[1.], [-5.], [3.], [0.]]), "bias": jnp.ones(1)})
    >>> m["bias"] is None, m["kernel"][:, 0].tolist()
    (True, [False, True, True, False])
    """
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
    selected = _select(params, where)
    out = []
    for (_, w), sel in zip(leaves_with_path, selected):
        if not sel:
            out.append(None)
        elif transposable:
            out.append(_transposable_mask(w))
        else:
            # along in: axis 0 of an (in, out) kernel, axis -2 of a stack (L, in, out) of them
            out.append(ops.mask24(w, axis=np.ndim(w) - 2 if np.ndim(w) >= 2 else 0))
    return jax.tree_util.tree_unflatten(treedef, out)


def _transposable_mask(w):
    """The transposable mask of an (in, out) kernel, or of each (in, out) slice of a stack (L, in, out):
    with in % 4 == 0 every 4×4 block of (L·in, out) lies in one slice."""
    if np.ndim(w) > 2:
        shape = np.shape(w)
        return jnp.reshape(ops.transposable_mask24(jnp.reshape(w, (-1, shape[-1]))), shape)
    return ops.transposable_mask24(w)


# ----------------------------------------------------------------------------------------------
# masked_decay
# ----------------------------------------------------------------------------------------------


def _norm_path(path) -> tuple:
    """A key path as a tuple of strings, without the ``.value`` of a Flax NNX ``Variable``."""
    keys = list(path)
    while keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name in ("value", "raw_value"):
        keys.pop()
    return tuple(_key_str(k) for k in keys)


def _align_masks(masks, params):
    """The mask of each leaf of ``params`` (a flat list, ``None`` where there is none), matched by key path.

    Lets ``masks`` and ``params`` be different containers with the same keys: e.g. a nested dict
    of masks for a Flax NNX ``State`` of params (``nnx.bridge.ToNNX``), or ``State``s with and
    without ``Variable`` wrappers. ``None`` when some leaf of ``masks`` (a ``None`` too) has no
    parameter at its path.
    """
    by_path = {_norm_path(path): m
               for path, m in jax.tree_util.tree_flatten_with_path(masks, is_leaf=lambda x: x is None)[0]}
    leaves = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: x is None)[0]
    out = [by_path.pop(_norm_path(path), None) for path, _ in leaves]
    return None if by_path else out


class MaskedDecayState(NamedTuple):
    """State of :func:`masked_decay`."""

    count: jax.Array  # int32 scalar: number of updates applied (for schedules / active_until)


def masked_decay(
    alpha: ScalarOrSchedule,
    *,
    mask_fn: Optional[Callable[[Any], Any]] = None,
    where: Optional[WhereFn] = None,
    active_until: Optional[int] = None,
) -> optax.GradientTransformationExtraArgs:
    r"""SR-STE masked decay: ``g ← g + α·(1 − M)⊙W`` on the gradients of the sparse weights.

    Chain it *before* the optimizer so the decay of the pruned weights goes through the
    optimizer like the gradient does (Zhou et al. 2021, SR-STE)::

        tx = optax.chain(masked_decay(2e-4), optax.adamw(1e-3))

    The masks ``M`` are either passed to ``update`` as the extra keyword argument ``masks``
    (``optax.chain`` and ``optax.inject_hyperparams`` forward extra keyword arguments) — use this
    to decay with exactly the masks the model used in the forward pass — or computed from the
    parameters with ``mask_fn(params)``; the default is :func:`magnitude_masks` (2:4 along the
    input axis of every leaf selected by ``where``). ``masks`` has ``params``'s structure with a
    ``bool`` mask (``True`` = kept) for each sparse weight and ``None`` for the other leaves; the
    gradients of ``None`` leaves pass unchanged. A tree of another container type with the same
    key paths also works (e.g. a dict of masks for a Flax NNX ``State`` of params, as
    :func:`jax_sparse24.nnx.masks_for_params` or :func:`jax_sparse24.masks.masks_for_params` under
    ``nnx.bridge.ToNNX`` give); the masks are then matched to the params by path.

    Args:
      alpha: decay strength (SR-STE's λ_W, typically 2e-4), a float or an optax schedule of the
        step count.
      mask_fn: ``mask_fn(params) -> masks`` used when ``update`` gets no ``masks``; default
        ``magnitude_masks(params, where=where)``. For the transposable recipe use
        ``functools.partial(magnitude_masks, transposable=True)``.
      where: ``where(path, leaf) -> bool`` selecting the sparse weights for the default
        ``mask_fn``; default :func:`default_where`.
      active_until: if given, the decay is applied only while ``step < active_until`` (e.g. the
        ``switch_step`` of a dense fine-tune, see :func:`sparsity_schedule`); afterwards the
        gradients pass unchanged.

    Returns:
      An ``optax.GradientTransformationExtraArgs``. ``update(updates, state, params, masks=None)``
      requires ``params``.

    Note:
      With ``optax.inject_hyperparams`` name the non-schedule callables as static:
      ``optax.inject_hyperparams(masked_decay, static_args=("mask_fn", "where"))(alpha=2e-4)``.
      ``alpha`` then lives in ``state.hyperparams["alpha"]`` and may be changed between steps.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> from jax_sparse24.optim import masked_decay
      >>> params = {"kernel": jnp.array([[1.], [-5.], [3.], [0.5]]), "bias": jnp.ones(1)}
      >>> grads = jax.tree.map(jnp.zeros_like, params)
      >>> tx = masked_decay(0.1)
      >>> state = tx.init(params)
      >>> updates, state = tx.update(grads, state, params)   # masks from |W|: keeps -5 and 3
      >>> updates["kernel"][:, 0].tolist(), updates["bias"].tolist()
      ([0.10000000149011612, 0.0, 0.0, 0.05000000074505806], [0.0])
      >>> tx = optax.chain(masked_decay(0.1), optax.adamw(1e-3))
      >>> masks = {"kernel": jnp.array([[True], [True], [False], [False]]), "bias": None}
      >>> state = tx.init(params)
      >>> updates, state = tx.update(grads, state, params, masks=masks)
    """

    def init_fn(params):
        del params
        return MaskedDecayState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, *, masks=None, **extra_args):
        del extra_args
        if params is None:
            raise ValueError(
                "masked_decay: `params` is required (the decay is alpha * (1 - M) * W); call "
                "`tx.update(grads, opt_state, params)`."
            )
        if masks is None:
            masks = mask_fn(params) if mask_fn is not None else magnitude_masks(params, where=where)
        a = alpha(state.count) if callable(alpha) else alpha
        if active_until is not None:
            a = jnp.where(state.count < active_until, a, jnp.zeros_like(a))

        def decay(g, m, w):
            if g is None or m is None:
                return g
            if np.shape(m) != np.shape(w):
                raise ValueError(
                    f"masked_decay: mask shape {np.shape(m)} does not match the parameter shape "
                    f"{np.shape(w)}"
                )
            d = jnp.where(jnp.asarray(m).astype(bool), jnp.zeros_like(w), w)
            return (g + a * d).astype(jnp.result_type(g))

        try:
            new_updates = jax.tree.map(decay, updates, masks, params, is_leaf=lambda x: x is None)
        except (ValueError, TypeError) as e:
            if "masked_decay" in str(e):
                raise
            # Another container type with the same paths (a dict of masks for Flax NNX's `State` of
            # params, `Variable`s around the arrays, ...): match the masks to the params by path.
            aligned = _align_masks(masks, params)
            g_leaves, g_def = jax.tree_util.tree_flatten(updates, is_leaf=lambda x: x is None)
            w_leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: x is None)
            if aligned is None or len(g_leaves) != len(w_leaves):
                raise ValueError(
                    "masked_decay: `masks` must have the structure of `params` (a bool mask for each "
                    f"sparse weight, None for the other leaves) or match its key paths: {e}"
                ) from e
            new_updates = jax.tree_util.tree_unflatten(
                g_def, [decay(g, m, w) for g, m, w in zip(g_leaves, aligned, w_leaves)])
        return new_updates, MaskedDecayState(count=_safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# ----------------------------------------------------------------------------------------------
# sparse_lr_scale
# ----------------------------------------------------------------------------------------------


class SparseLRScaleState(NamedTuple):
    """State of :func:`sparse_lr_scale`."""

    count: jax.Array  # int32 scalar: number of updates applied (for schedules / active_until)


def sparse_lr_scale(
    factor: ScalarOrSchedule = 2.0,
    *,
    where: Optional[WhereFn] = None,
    active_until: Optional[int] = None,
) -> optax.GradientTransformation:
    r"""Multiply the updates of the 2:4 sparse weights by ``factor``: their learning rate × ``factor``.

    Chain it *after* the optimizer (the updates it scales are the optimizer's, learning rate and
    decoupled weight decay included)::

        tx = optax.chain(masked_decay(2e-4), optax.adamw(1e-3), sparse_lr_scale(2.0, where=...))

    Why 2: with an Adam-type optimizer every weight moves by about the learning rate per step, so
    the change of a layer's output is proportional to the number of weights that act on each
    output. A 2:4 layer has half of them (the pruned half of each update changes weights the
    forward pass does not use), so at the dense model's learning rate its output moves half as
    fast — the per-layer learning rate rule of μP (∝ 1/fan-in) with the fan-in halved. Measured on
    a 4-layer GPT (``benchmarks/harness/train_gpt.py --size tiny``, real text): with the dense learning rate
    the 2:4 FFNs lag (layer-0 FFN output rms 0.046 at step 27 vs 0.115 dense), attention takes
    over and one Adam step of the layer-0 attention then doubles the loss (srste 2.30×, sste
    1.94× the running loss); with ``factor=2`` no recipe spikes and the final losses come within
    1% of dense (``benchmarks/results/quality_tiny_cpu_realtext.json``). It is not always the better
    choice: GPT-2 124M over 100M tokens (learning rate 6e-4, no spike either way) ended S-STE and
    STE +2.33% / +3.32% from dense with ``factor=2`` and +0.35% / 0.00% with 1
    (``benchmarks/results/quality_gpt2_h100_realtext_100m_lr1.md``); SR-STE there: +0.30% with 2.

    Args:
      factor: the multiplier (``1 / density``: 2 for 2:4), a float or an optax schedule of the
        step count.
      where: ``where(path, leaf) -> bool`` selecting the 2:4 weights; default
        :func:`default_where` (every 2-D ``kernel`` whose input dim is divisible by 4 — pass your
        own when the model also has dense layers of such shapes).
      active_until: if given, the scaling stops at this step (e.g. the first step of a dense
        fine-tune: once the model runs dense every weight acts and the dense learning rate is
        right again); afterwards the updates pass unchanged.

    Returns:
      An ``optax.GradientTransformation``; ``update(updates, state, params=None)``.

    >>> import jax.numpy as jnp, optax
    >>> from jax_sparse24.optim import sparse_lr_scale
    >>> tx = sparse_lr_scale(2.0, active_until=1)
    >>> u = {"kernel": jnp.ones((4, 2)), "bias": jnp.ones(2)}
    >>> state = tx.init(u)
    >>> out, state = tx.update(u, state)
    >>> float(out["kernel"][0, 0]), float(out["bias"][0])
    (2.0, 1.0)
    >>> float(tx.update(u, state)[0]["kernel"][0, 0])      # step 1: past active_until
    1.0
    """
    if _is_python_number(factor) and not factor > 0:
        raise ValueError(f"sparse_lr_scale: factor must be > 0, got {factor!r}")
    if active_until is not None and (isinstance(active_until, bool) or not isinstance(active_until, (int, np.integer))
                                     or active_until < 0):
        raise ValueError(f"sparse_lr_scale: active_until must be a non-negative int step or None, got {active_until!r}")

    def init_fn(params):
        del params
        return SparseLRScaleState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        f = factor(state.count) if callable(factor) else factor
        f = jnp.asarray(f, jnp.float32)
        if active_until is not None:
            f = jnp.where(state.count < active_until, f, jnp.ones_like(f))
        sel = default_where if where is None else where

        def scale(path, g):
            if g is None or not sel(_path_str(path), g):
                return g
            return (g * f).astype(jnp.result_type(g))

        new_updates = jax.tree_util.tree_map_with_path(scale, updates, is_leaf=lambda x: x is None)
        return new_updates, SparseLRScaleState(count=_safe_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)


# ----------------------------------------------------------------------------------------------
# adamw_step (STEP)
# ----------------------------------------------------------------------------------------------


class AdamWStepState(NamedTuple):
    """State of :func:`adamw_step`.

    Attributes:
      count: int32 scalar, number of updates applied.
      mu: first moment (EMA of gradients).
      nu: second moment (EMA of squared gradients); from the switch on frozen for the sparse
        weights (``freeze="sparse"``; every leaf with ``freeze="all"``), no extra copy.
      phase: int32 scalar, 0 = precondition phase (model dense), 1 = mask-learning phase (model
        sparse, ``nu`` frozen).
      switch_step: int32 scalar, the ``count`` of the update that switched (0 before the switch);
        the frozen ``nu`` is bias-corrected with this count in phase 1.
      z_buffer: float32 ``(window,)`` ring buffer of the last ``window = ⌊1/(1−b2)⌋`` values of
        the variance-change statistic Z_t.
      z_count: int32 scalar, number of Z values recorded (the ring position is
        ``z_count % window``).
      z_avg: float32 scalar, average of the recorded Z values in the window (log it to tune
        ``switch_eps``).
    """

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates
    phase: jax.Array
    switch_step: jax.Array
    z_buffer: jax.Array
    z_count: jax.Array
    z_avg: jax.Array


def _z_window(b2, z_window) -> int:
    if z_window is not None:
        if int(z_window) < 1:
            raise ValueError(f"adamw_step: z_window must be >= 1, got {z_window}")
        return int(z_window)
    try:
        b2f = float(b2)
    except (TypeError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(
            "adamw_step: the statistic window ⌊1/(1−b2)⌋ needs a concrete `b2` at init; pass "
            "`z_window=` or, with optax.inject_hyperparams, `static_args=('b2',)`."
        ) from e
    if not 0.0 <= b2f < 1.0:
        raise ValueError(f"adamw_step: b2 must be in [0, 1), got {b2f}")
    # 1/(1-b2) is e.g. 999.9999999999989 for b2 = 0.999: round before flooring.
    return max(1, int(math.floor(round(1.0 / (1.0 - b2f), 6))))


def scale_by_step_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    clipping: tuple[int, int],
    option: int = 1,
    switch_eps: float = 1e-9,
    where: Optional[WhereFn] = None,
    z_window: Optional[int] = None,
    freeze: str = "sparse",
) -> optax.GradientTransformation:
    r"""STEP's Adam scaling: ``optax.scale_by_adam`` with a precondition phase and an automatic switch.

    Lu et al. 2023, "STEP: Learning N:M Structured Sparsity Masks from Scratch with Precondition".
    :func:`adamw_step` chains it with optax's weight decay and learning rate.

    *Phase 0 (precondition, model dense)*: Adam's ``m̂ / (√v̂ + eps)``, bit for bit
    ``optax.scale_by_adam``'s under ``jit``. After every update ``t`` (1-based ``count``) the
    variance change ``Δv = v_t − v_{t−1}`` over the sparse weights (the leaves selected by
    ``where``) is summarised as

    * ``option=1``: ``Z_t = mean |Δv|``,
    * ``option=2``: ``Z_t = exp(mean log |Δv|)`` (geometric mean; ``|Δv|`` floored at the
      smallest normal float32 so exact zeros do not give ``log 0``),

    and averaged over the last ``window = ⌊1/(1−b2)⌋`` values (fewer at the start). The update
    ``t`` switches to phase 1 when ``t > t_max``, or when that average ``< switch_eps`` and
    ``t > t_min``.

    *Phase 1 (mask learning, model sparse)*: the sparse weights' ``v`` is frozen at its value after
    the switching update and bias-corrected with the switch's count, ``v̂* = v_switch / (1 −
    b2^switch_step)``; ``m`` keeps its EMA and bias correction. Every other leaf (embeddings,
    norms, biases, layers that stay dense) goes on with plain Adam (``freeze="sparse"``).

    Why not freeze every ``v``: the precondition exists because the straight-through gradient of a
    *masked* weight corrupts its variance estimate; a weight that is never masked has no such
    noise, and a frozen ``v`` removes Adam's normalisation for it exactly when its gradient scale
    changes (on GPT-2 the attention and LayerNorm gradients grow by orders of magnitude over their
    frozen ``v`` once the model starts to use context, and the run diverges). ``freeze="all"``
    keeps the frozen-everything variant for comparison.

    The transform only *exposes* the phase (:class:`AdamWStepState`): the train step reads
    :func:`is_sparse_phase` and runs the model sparse from the next step on.

    Args:
      b1: decay of the first-moment EMA.
      b2: decay of the second-moment EMA; also sets the statistic window ``⌊1/(1−b2)⌋``.
      eps: added to ``√v̂`` in the denominator.
      clipping: ``(t_min, t_max)`` integer step counts: never switch at ``t ≤ t_min``, always by
        ``t = t_max + 1``. The paper recommends 10% and 50% of the total steps.
      option: 1 (arithmetic mean of ``|Δv|``) or 2 (geometric mean).
      switch_eps: threshold on the windowed average of ``Z``. ``Z`` has the units of ``v``
        (squared gradients): in a stationary regime ``Δv = (1−b2)(g² − v)``, so ``Z`` settles
        near ``(1−b2)·mean|g² − v|`` — about ``(1−b2)·v`` for noise-dominated gradients. The
        default ``1e-9`` is that level for ``b2 = 0.999`` and a per-element gradient RMS of
        ``1e-3``. There is no scale-free default: log ``state.z_avg`` (:func:`step_state`) for a
        few hundred steps and set ``switch_eps`` a little above its plateau, or rely on ``clipping``.
      where: ``where(path, leaf) -> bool`` selecting the sparse weights whose variance is
        tracked and (``freeze="sparse"``) frozen; default :func:`default_where`. If it selects
        nothing, all leaves are.
      z_window: override the statistic window (default ``⌊1/(1−b2)⌋``).
      freeze: ``"sparse"`` (default): in phase 1 freeze ``v`` of the leaves selected by ``where``
        only; ``"all"``: every leaf's.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`AdamWStepState`. Its updates have the
      moments' dtype (as ``optax.scale_by_adam``'s).
    """
    t_min, t_max = _check_step_args(clipping, option, freeze)
    static_option = _is_python_number(option)

    def frozen_leaves(tree) -> list:
        """Per flat leaf of ``tree``: whether its ``v`` is frozen in phase 1."""
        selected = _select(tree, where)
        if freeze == "all" or not any(selected):
            return [True] * len(selected)
        return selected

    def init_fn(params):
        window = _z_window(b2, z_window)
        return AdamWStepState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree.map(jnp.zeros_like, params),
            nu=jax.tree.map(jnp.zeros_like, params),
            phase=jnp.zeros([], jnp.int32),
            switch_step=jnp.zeros([], jnp.int32),
            z_buffer=jnp.zeros([window], jnp.float32),
            z_count=jnp.zeros([], jnp.int32),
            z_avg=jnp.zeros([], jnp.float32),
        )

    def statistic(nu_old, nu_new):
        selected = _select(nu_new, where)
        new_leaves = jax.tree_util.tree_leaves(nu_new)
        if not any(selected):
            selected = [True] * len(new_leaves)
        pairs = [(o, n) for o, n, s in zip(jax.tree_util.tree_leaves(nu_old), new_leaves, selected) if s and np.size(n)]
        size = sum(int(np.size(n)) for _, n in pairs)
        if size == 0:
            return jnp.zeros([], jnp.float32)
        diffs = [jnp.abs(n.astype(jnp.float32) - o.astype(jnp.float32)) for o, n in pairs]
        tiny = jnp.finfo(jnp.float32).tiny

        def z1():
            return sum(jnp.sum(d) for d in diffs) / size

        def z2():
            return jnp.exp(sum(jnp.sum(jnp.log(jnp.maximum(d, tiny))) for d in diffs) / size)

        if static_option:
            return z1() if option == 1 else z2()
        return jnp.where(jnp.asarray(option) == 2, z2(), z1())

    def update_fn(updates, state, params=None):
        del params
        window = state.z_buffer.shape[0]
        count_inc = _safe_increment(state.count)
        mu = jax.tree.map(lambda g, m: (1 - b1) * (g**1) + b1 * m, updates, state.mu)
        # Adam's second moment: the v of phase 0 and (freeze="sparse") of the unfrozen leaves in phase 1
        nu_ema = jax.tree.map(lambda g, v: ((1 - b2) * (g**2) + b2 * v).astype(v.dtype), updates, state.nu)

        # Phase 0 measures the variance change and may switch; phase 1 keeps the record. Selected
        # with where, not lax.cond: a conditional's predicate is read on the host, a round trip per
        # step on a GPU. The price: the statistic is computed in phase 1 too (and its sum may round
        # in the last bit differently from a lax.cond form's).
        z = statistic(state.nu, nu_ema).astype(jnp.float32)
        buf = state.z_buffer.at[state.z_count % window].set(z)
        z_count_next = _safe_increment(state.z_count)
        avg = jnp.sum(buf) / jnp.minimum(z_count_next, window).astype(jnp.float32)  # unfilled entries are 0
        switch = (count_inc > t_max) | ((avg < switch_eps) & (count_inc > t_min))
        measuring = state.phase == 0
        sparse = jnp.where(measuring, switch, True)
        freeze_mask = jax.tree.unflatten(jax.tree.structure(state.nu), frozen_leaves(state.nu))
        # the frozen leaves keep v_switch from the update after the switch on; the others go on as Adam
        nu = jax.tree.map(lambda new, old, f: jnp.where(measuring, new, old) if f else new,
                          nu_ema, state.nu, freeze_mask)
        phase = sparse.astype(jnp.int32)
        switch_step = jnp.where(measuring & sparse, count_inc, state.switch_step).astype(jnp.int32)
        frozen_count = jnp.where(phase == 1, switch_step, count_inc)

        bc1 = 1 - b1**count_inc
        bc2_frozen = 1 - b2**frozen_count
        # live leaves: v / (1 - b2**count_inc), written as v / bc2_frozen times a factor that is
        # exactly 1 in phase 0, so that phase 0 stays bit-exact with optax.scale_by_adam under jit
        live = jnp.where(phase == 1, bc2_frozen / (1 - b2**count_inc), 1.0)
        mu_hat = jax.tree.map(lambda m: m / bc1.astype(m.dtype), mu)
        nu_hat = jax.tree.map(
            lambda v, f: v / bc2_frozen.astype(v.dtype) if f
            else (v / bc2_frozen.astype(v.dtype)) * live.astype(v.dtype),
            nu, freeze_mask)
        new_updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + 0.0) + eps), mu_hat, nu_hat)
        return new_updates, AdamWStepState(
            count=count_inc, mu=mu, nu=nu, phase=phase, switch_step=switch_step,
            z_buffer=jnp.where(measuring, buf, state.z_buffer),
            z_count=jnp.where(measuring, z_count_next, state.z_count),
            z_avg=jnp.where(measuring, avg, state.z_avg).astype(jnp.float32),
        )

    return optax.GradientTransformation(init_fn, update_fn)


def _check_step_args(clipping, option, freeze) -> tuple:
    if not (isinstance(clipping, (tuple, list)) and len(clipping) == 2):
        raise ValueError(f"adamw_step: clipping must be a (t_min, t_max) pair, got {clipping!r}")
    t_min, t_max = clipping
    for name, t in (("t_min", t_min), ("t_max", t_max)):
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 0:
            raise ValueError(
                f"adamw_step: clipping {name} must be a non-negative int step count (e.g. 10% and "
                f"50% of the total steps), got {t!r}"
            )
    if t_min > t_max:
        raise ValueError(f"adamw_step: clipping needs t_min <= t_max, got {clipping!r}")
    if _is_python_number(option) and option not in (1, 2):
        raise ValueError(f"adamw_step: option must be 1 (mean) or 2 (geometric mean), got {option!r}")
    if freeze not in ("sparse", "all"):
        raise ValueError(f"adamw_step: freeze must be 'sparse' or 'all', got {freeze!r}")
    return t_min, t_max


def adamw_step(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    *,
    clipping: tuple[int, int],
    option: int = 1,
    switch_eps: float = 1e-9,
    where: Optional[WhereFn] = None,
    z_window: Optional[int] = None,
    freeze: str = "sparse",
    mask: Optional[Any] = None,
) -> optax.GradientTransformationExtraArgs:
    r"""STEP: AdamW with a precondition phase and an automatically chosen switch to sparse training.

    ``optax.adamw`` with :func:`scale_by_step_adam` in place of ``optax.scale_by_adam``::

        optax.chain(scale_by_step_adam(b1, b2, eps, clipping=..., ...),
                    optax.add_decayed_weights(weight_decay, mask),
                    optax.scale_by_learning_rate(learning_rate))

    with the updates cast to the gradients' dtype. In the precondition phase (model dense) the
    updates are exactly ``optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay,
    mask=mask)``'s; after the switch the sparse weights' ``v`` is frozen
    (:func:`scale_by_step_adam`) and the model trains sparse (:func:`is_sparse_phase`).

    Args:
      learning_rate: a float or an optax schedule of the step count.
      b1, b2, eps, clipping, option, switch_eps, where, z_window, freeze: see
        :func:`scale_by_step_adam`. ``clipping=(t_min, t_max)``: e.g.
        ``(total_steps // 10, total_steps // 2)``.
      weight_decay: decoupled weight decay (AdamW), multiplied by the learning rate.
      mask: which leaves get the weight decay, as ``optax.adamw``'s ``mask``: a pytree of bools
        with the structure of the params, or a callable ``mask(params)`` returning one.
        ``None`` (default): every leaf.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is the chain's (a tuple whose
      first entry is the :class:`AdamWStepState`; :func:`step_state` finds it). ``update`` needs
      ``params`` when ``weight_decay`` is non-zero.

    Note:
      ``optax.inject_hyperparams(adamw_step)(learning_rate=..., clipping=(...))`` works (pass
      ``static_args=("where",)`` when giving ``where``); ``b2`` must be concrete when ``init``
      runs (it sizes the window) — call ``init`` outside ``jit`` or give ``z_window``.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> from jax_sparse24.optim import adamw_step, is_sparse_phase
      >>> params = {"kernel": jnp.ones((8, 4))}
      >>> tx = optax.chain(optax.clip_by_global_norm(1.0),
      ...                  adamw_step(1e-3, b2=0.99, clipping=(2, 5)))
      >>> state = tx.init(params)
      >>> for _ in range(6):
      ...     updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
      ...     params = optax.apply_updates(params, updates)
      >>> bool(is_sparse_phase(state))   # switched at update t_max + 1 = 6
      True
    """
    _check_step_args(clipping, option, freeze)
    wd_is_zero = _is_python_number(weight_decay) and weight_decay == 0
    decay_mask = None if mask is None else functools.partial(_decay_mask, mask)
    tx = optax.chain(
        scale_by_step_adam(b1, b2, eps, clipping=clipping, option=option, switch_eps=switch_eps, where=where,
                           z_window=z_window, freeze=freeze),
        optax.identity() if wd_is_zero else optax.add_decayed_weights(weight_decay, decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if params is None and not wd_is_zero:
            raise ValueError("adamw_step: `params` is required for weight decay; call "
                             "`tx.update(grads, opt_state, params)` (or set weight_decay=0).")
        new_updates, state = tx.update(updates, state, params)
        return jax.tree.map(lambda u, g: u.astype(jnp.result_type(g)), new_updates, updates), state

    return optax.GradientTransformationExtraArgs(tx.init, update_fn)


def _decay_mask(mask, params):
    """``optax.adamw``'s ``mask`` (a tree of bools or a callable) as a tree of Python bools, checked."""
    m = mask(params) if callable(mask) else mask
    try:
        return jax.tree.map(lambda _, d: bool(d), params, m)
    except (ValueError, TypeError) as e:
        raise ValueError("adamw_step: mask must be a pytree of Python bools with the structure of the params "
                         f"(or a callable returning one): {e}") from None


def _find_step_state(opt_state) -> AdamWStepState:
    is_step = lambda x: isinstance(x, AdamWStepState)  # noqa: E731
    found = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=is_step) if is_step(x)]
    if not found:
        raise ValueError(
            "no AdamWStepState found in the optimizer state: is adamw_step part of the optimizer?"
        )
    if len(found) > 1:
        raise ValueError(
            f"found {len(found)} AdamWStepState in the optimizer state; read the phase from the "
            "one you mean with step_phase(opt_state_part)"
        )
    return found[0]


def step_state(opt_state) -> AdamWStepState:
    """The :class:`AdamWStepState` inside an optimizer state, for logging STEP.

    Its ``phase`` (0 dense precondition, 1 sparse) and ``z_avg`` (the variance-change statistic
    STEP's automatic switch compares with ``switch_eps``) are what a training log wants per step;
    ``switch_step`` is the update that switched. Found anywhere inside ``opt_state`` (``optax.chain``,
    ``inject_hyperparams``, ``MultiSteps``, ``masked``); works under ``jit``.

    Raises:
      ValueError: if there is no ``AdamWStepState`` or more than one.

    >>> import jax.numpy as jnp, optax
    >>> tx = optax.chain(optax.clip(1.0), adamw_step(1e-3, clipping=(10, 100)))
    >>> st = step_state(tx.init({"w": jnp.zeros(4)}))
    >>> int(st.phase), float(st.z_avg)
    (0, 0.0)
    """
    return _find_step_state(opt_state)


def step_phase(opt_state) -> jax.Array:
    """The STEP phase (int32 scalar: 0 dense precondition, 1 sparse) of an optimizer state.

    Finds the single :class:`AdamWStepState` anywhere inside ``opt_state`` (``optax.chain``,
    ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked``, any pytree). Works
    under ``jit``.

    Raises:
      ValueError: if there is no ``AdamWStepState`` or more than one.
    """
    return _find_step_state(opt_state).phase


def is_sparse_phase(opt_state) -> jax.Array:
    """Whether STEP has switched to the sparse (mask-learning) phase — a ``bool`` scalar.

    Use it in the train step to pick the model's mode for the *next* forward pass::

        sparse = jax_sparse24.optim.is_sparse_phase(state.opt_state)
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, sparse)   # model(x, sparse=...)
        updates, opt_state = tx.update(grads, opt_state, params)

    >>> import jax.numpy as jnp, optax
    >>> tx = optax.chain(optax.clip(1.0), adamw_step(1e-3, clipping=(10, 100)))
    >>> bool(is_sparse_phase(tx.init({"w": jnp.zeros(4)})))
    False
    """
    return step_phase(opt_state) == 1


# ----------------------------------------------------------------------------------------------
# Sparse → dense fine-tune schedules
# ----------------------------------------------------------------------------------------------


def dense_finetune_schedule(switch_step: int) -> Callable[[jax.typing.ArrayLike], jax.Array]:
    """Schedule of the model's ``sparse`` flag: ``True`` for ``step < switch_step``, then dense.

    Args:
      switch_step: first step that runs dense (``step`` = optimizer updates already applied).

    Returns:
      ``fn(step) -> bool array``; works on Python ints and traced steps.

    >>> fn = dense_finetune_schedule(5)
    >>> bool(fn(4)), bool(fn(5))
    (True, False)
    """
    if not isinstance(switch_step, (int, np.integer)) or isinstance(switch_step, bool):
        raise ValueError(f"dense_finetune_schedule: switch_step must be an int, got {switch_step!r}")

    def schedule(step):
        return jnp.asarray(step) < switch_step

    return schedule


def sparsity_schedule(
    total_steps: int, *, dense_finetune_fraction: float = 1 / 6
) -> Callable[[jax.typing.ArrayLike], jax.Array]:
    """Sparse training followed by a dense fine-tune of the last ``dense_finetune_fraction`` steps.

    The transposable SR-STE recipe (Hu et al., ICML 2024) trains the last ~1/6 of the steps
    dense. The switch step is ``total_steps − round(total_steps · dense_finetune_fraction)``.

    Use in the train step (``step`` = ``opt_state`` count; a traced step works if the layer takes
    a traced ``sparse`` flag, else call it on a Python int and make ``sparse`` static)::

        is_sparse = sparsity_schedule(total_steps)
        def loss_fn(params, x, y, sparse):
            return loss(model.apply(params, x, sparse=sparse), y)   # Sparse24Dense(..)(x, sparse=)
        sparse = is_sparse(step)
        grads = jax.grad(loss_fn)(params, x, y, sparse)

    Pair it with ``masked_decay(alpha, active_until=switch_step)`` so the SR-STE decay stops when
    the model goes dense.

    Args:
      total_steps: total number of optimizer steps.
      dense_finetune_fraction: fraction of the steps at the end trained dense, in ``[0, 1]``.

    Returns:
      ``fn(step) -> bool array``, ``True`` while the model should run sparse.

    >>> fn = sparsity_schedule(600)
    >>> bool(fn(499)), bool(fn(500))
    (True, False)
    """
    if not isinstance(total_steps, (int, np.integer)) or total_steps < 0:
        raise ValueError(f"sparsity_schedule: total_steps must be a non-negative int, got {total_steps!r}")
    if not 0.0 <= float(dense_finetune_fraction) <= 1.0:
        raise ValueError(
            "sparsity_schedule: dense_finetune_fraction must be in [0, 1], got "
            f"{dense_finetune_fraction!r}"
        )
    switch_step = int(total_steps) - int(round(total_steps * float(dense_finetune_fraction)))
    return dense_finetune_schedule(switch_step)
