"""Flax NNX layers for 2:4 sparse training.

:class:`Sparse24Linear` is the NNX counterpart of :class:`jax_sparse24.nn.Sparse24Dense` (and a
drop-in for ``flax.nnx.Linear``: same arguments, same ``kernel`` (in, out) and ``bias``
``nnx.Param`` variables, same initialization). It computes through the same code as the linen layer, so
both give the same outputs and gradients for the same kernel and mask.

Its sparsity state — the ``srste`` mask, the ``soft`` scale β — lives in :class:`Sparsity`
variables (the mask in its subtype :class:`Sparse24Mask`), never in ``nnx.Param``: an
``nnx.Optimizer(model, tx, wrt=nnx.Param)``, ``nnx.grad`` and ``nnx.state(model, nnx.Param)`` see
only the kernel and bias, and ``nnx.state(model, Sparsity)`` holds everything the layer needs
besides its parameters. A train step hands the masks to :func:`jax_sparse24.optim.masked_decay`
through :func:`masks_for_params` and refreshes them in place with :func:`refresh_masks` (which
returns the flip rate)::

    model = MLP(rngs=nnx.Rngs(0, mvue=1))   # uses Sparse24Linear(d_in, d_out, rngs=rngs)
    tx = optax.chain(s24.optim.masked_decay(2e-4), optax.adamw(1e-3))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        grads = nnx.grad(loss_fn)(model, x, y)
        optimizer.update(model, grads, masks=s24.nnx.masks_for_params(model))   # flax >= 0.11
        return s24.nnx.refresh_masks(model, step=optimizer.step)              # flip rate

(flax 0.10's ``nnx.Optimizer`` holds the model itself: ``optimizer.update(grads, masks=...)``.)

The MVUE weight gradient draws its randomness from an ``nnx.Rngs`` stream named ``"mvue"``
(:data:`MVUE_RNG`), given at construction (the layer forks its own stream from it) or at call
time; without one the weight gradient is the exact ``xᵀ·∇y``, as in the linen layer.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx
from flax.linen.dtypes import promote_dtype

from jax_sparse24._src import fp8_math as _fp8
from jax_sparse24._src import layer as _layer
from jax_sparse24._src.tree_paths import key_str
from jax_sparse24._src.validation import check_positive_int

__all__ = [
    "METHODS",
    "MVUE_RNG",
    "Fp8Meta",
    "Sparse24Linear",
    "Sparse24Mask",
    "Sparsity",
    "masks_for_params",
    "refresh_masks",
    "update_fp8_meta",
]

#: Training methods of :class:`Sparse24Linear` (as for :class:`jax_sparse24.nn.Sparse24Dense`).
METHODS = _layer.METHODS
#: Name of the ``nnx.Rngs`` stream used for the MVUE weight gradient.
MVUE_RNG = "mvue"

default_kernel_init = nnx.initializers.lecun_normal()

# flax >= 0.11 marks pytree data attributes with `nnx.data` (a `None` attribute is static otherwise);
# flax 0.10 has no such marker and needs none.
_data = getattr(nnx, "data", lambda value: value)


def _get(variable):
    """A Variable's value (``get_value`` from flax 0.12 on, where ``.value`` is deprecated)."""
    return variable.get_value() if hasattr(variable, "get_value") else variable.value


def _set(variable, value) -> None:
    if hasattr(variable, "set_value"):
        variable.set_value(value)
    else:  # flax < 0.12
        variable.value = value


class Sparsity(nnx.Variable):
    """Non-trainable sparsity state of a :class:`Sparse24Linear` (the NNX ``"sparsity"`` collection).

    Not an ``nnx.Param``: optimizers built with ``wrt=nnx.Param`` and ``nnx.grad`` leave it alone.
    ``nnx.state(model, Sparsity)`` selects the masks and the β of every layer.
    """


class Sparse24Mask(Sparsity):
    """The ``srste`` 2:4 mask of a :class:`Sparse24Linear` kernel: ``bool``, the kernel's ``(in, out)`` shape."""


class Fp8Meta(nnx.Variable):
    """The delayed-scaling fp8 state of a :class:`Sparse24Linear` (``fp8_scaling="delayed"``): one
    variable per entry of :data:`jax_sparse24.fp8.META_NAMES` (``fp8_input_scale``, ...).

    Not an ``nnx.Param``: the optimizer never updates it. Differentiate the loss with respect to it
    too (``nnx.grad(..., argnums=nnx.DiffState(0, (nnx.Param, Fp8Meta)))``): its gradient is its new
    value, which :func:`update_fp8_meta` writes into the model.
    """


class Sparse24Linear(nnx.Module):
    """A 2:4 sparse linear layer for training (drop-in for ``flax.nnx.Linear``).

    The NNX version of :class:`jax_sparse24.nn.Sparse24Dense`, with the same recipes and the same
    math (both call :func:`jax_sparse24.sparse24_linear`). The weight used in the matmul is 2:4
    along ``in`` (groups of 4 consecutive input features); gradients reach the dense ``kernel``
    straight through. ``method`` selects the recipe:

    * ``"srste"`` — hard mask kept in ``self.mask`` (a :class:`Sparse24Mask`; transposable — 2:4
      along in and out — unless ``transposable=False``), recomputed from the kernel by
      :func:`refresh_masks` every ``mask_every`` optimizer steps; pair with
      :func:`jax_sparse24.optim.masked_decay` and :func:`masks_for_params`.
    * ``"ste"`` — hard 2:4 magnitude mask recomputed from the kernel on every call.
    * ``"soft"`` — S-STE: ``β·S(kernel)`` with the soft threshold ``S`` and β (``self.beta``, a
      :class:`Sparsity`) frozen at construction.
    * ``"dense"`` — plain dense layer (e.g. a dense fine-tune, or a baseline).

    With ``mvue=True`` and an ``"mvue"`` stream in ``rngs`` (or passed at call time) the weight
    gradient may be ``xᵀ·MVUE(∇y)``; ``backend`` decides where that pays, exactly as for
    ``Sparse24Dense``. Without a stream the weight gradient is the exact ``xᵀ·∇y``.

    Args:
      in_features: input feature size (divisible by 4 unless ``method="dense"``).
      out_features: output feature size (divisible by 4 for ``srste`` with ``transposable=True``).
      use_bias: whether to add a bias.
      dtype: computation dtype (``None``: inferred from inputs and params).
      param_dtype: dtype of ``kernel`` and ``bias``.
      precision: ``lax.Precision`` of the matmuls.
      kernel_init: initializer of the (in, out) kernel.
      bias_init: initializer of the bias.
      method: one of ``"srste"``, ``"ste"``, ``"soft"``, ``"dense"``.
      mvue: use the MVUE weight gradient when an ``"mvue"`` stream is available.
      transposable: ``srste`` masks are transposable (2:4 along in and out).
      mask_every: ``srste`` mask refresh period in optimizer steps (see :func:`refresh_masks`).
      backend: GEMM backend, see :func:`jax_sparse24.sparse24_linear`.
      fp8: forward and input-gradient GEMMs (and a sparse MVUE weight gradient) in float8_e4m3fn,
        as :class:`jax_sparse24.nn.Sparse24Dense`'s ``fp8``.
      fp8_scaling: ``"current"`` or ``"delayed"`` (amax histories in :class:`Fp8Meta` variables;
        see :func:`update_fp8_meta`), as ``Sparse24Dense``'s.
      amax_history_length: length of each amax history with delayed scaling.
      rngs: ``nnx.Rngs``; its ``params`` stream initializes kernel and bias (as ``nnx.Linear``),
        its ``"mvue"`` stream, if any, drives the MVUE weight gradient.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> layer = Sparse24Linear(16, 8, rngs=nnx.Rngs(0))
    >>> layer.kernel.shape, layer.mask.shape, layer(jnp.ones((2, 16))).shape
    ((16, 8), (16, 8), (2, 8))
    >>> jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(layer, nnx.Param)))
    {'bias': (8,), 'kernel': (16, 8)}
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        dtype: Optional[Any] = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: Callable = default_kernel_init,
        bias_init: Callable = nnx.initializers.zeros_init(),
        method: str = "srste",
        mvue: bool = True,
        transposable: bool = True,
        mask_every: int = 40,
        backend: str = "auto",
        fp8: bool = False,
        fp8_scaling: str = "current",
        amax_history_length: int = 1024,
        rngs: nnx.Rngs,
    ):
        _layer.check_config("Sparse24Linear", method, backend, fp8, fp8_scaling, amax_history_length)
        check_positive_int(in_features, "in_features", "Sparse24Linear")
        check_positive_int(out_features, "out_features", "Sparse24Linear")
        check_positive_int(mask_every, "mask_every", "Sparse24Linear")
        if method != "dense" and in_features % 4:
            raise ValueError(f"Sparse24Linear: in_features must be divisible by 4 (2:4 groups along in), "
                             f"got {in_features}")
        if method == "srste" and transposable and out_features % 4:
            raise ValueError(f"Sparse24Linear: transposable masks need out_features divisible by 4, got "
                             f"out_features={out_features}; use transposable=False")
        # Same key order as nnx.Linear: the same Rngs give the same kernel and bias.
        kernel = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
        self.kernel = nnx.Param(kernel)
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else _data(None)
        self.mask = Sparse24Mask(_layer.init_mask(kernel, transposable)) if method == "srste" else _data(None)
        self.beta = Sparsity(_layer.init_beta(kernel)) if method == "soft" else _data(None)
        if mvue and method != "dense" and MVUE_RNG in rngs:
            self.mvue_rngs = rngs[MVUE_RNG].fork()
        else:
            self.mvue_rngs = _data(None)

        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.method = method
        self.mvue = mvue
        self.transposable = transposable
        self.mask_every = mask_every
        self.backend = backend
        self.fp8 = bool(fp8)
        self.fp8_scaling = fp8_scaling
        if fp8 and fp8_scaling == "delayed":
            for name, value in _fp8.init_meta(amax_history_length).items():
                setattr(self, f"fp8_{name}", Fp8Meta(value))

    def __call__(self, inputs, *, sparse: bool | jax.Array | None = None,
                 rngs: nnx.Rngs | nnx.RngStream | jax.Array | None = None):
        """Apply the layer.

        Args:
          inputs: ``(..., in_features)``.
          sparse: run sparse (True) or dense (False). A traced boolean (e.g. from
            :func:`jax_sparse24.optim.is_sparse_phase` or a fine-tune schedule) selects at run
            time with ``lax.cond``. ``None``: sparse unless ``method == "dense"``.
          rngs: the MVUE randomness for this call instead of the layer's own stream: an
            ``nnx.Rngs`` (its ``"mvue"`` stream; none there: exact gradient), an
            ``nnx.RngStream`` or a key.
        """
        if jnp.shape(inputs)[-1:] != (self.in_features,):
            raise ValueError(f"Sparse24Linear: inputs must have {self.in_features} features (last axis), got "
                             f"shape {jnp.shape(inputs)}")
        kernel = _get(self.kernel)
        bias = None if self.bias is None else _get(self.bias)
        inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        return _layer.apply(inputs, kernel, bias, method=self.method,
                            mask=None if self.mask is None else _get(self.mask),
                            beta=None if self.beta is None else _get(self.beta),
                            transposable=self.transposable, key=self._mvue_key(rngs), backend=self.backend,
                            precision=self.precision, sparse=sparse, fp8=getattr(self, "fp8", False),
                            fp8_meta=self._fp8_meta(), owner="Sparse24Linear")

    def _fp8_meta(self):
        if getattr(self, "fp8_scaling", "current") != "delayed":
            return None
        return {name: _get(getattr(self, f"fp8_{name}")) for name in _fp8.META_NAMES}

    def _mvue_key(self, rngs):
        if not self.mvue or self.method == "dense":
            return None
        if rngs is None:
            rngs = self.mvue_rngs
        if rngs is None:
            return None
        if isinstance(rngs, nnx.Rngs):
            return rngs[MVUE_RNG]() if MVUE_RNG in rngs else None
        if isinstance(rngs, nnx.RngStream):
            return rngs()
        if isinstance(rngs, jax.Array):
            return rngs
        raise TypeError(f"Sparse24Linear: rngs must be an nnx.Rngs, nnx.RngStream or a key, got {type(rngs)}")


def _srste_layers(model) -> list[tuple[tuple, Sparse24Linear]]:
    """``(path, layer)`` of every ``srste`` :class:`Sparse24Linear` in ``model`` (shared ones once)."""
    return [(tuple(path), node) for path, node in nnx.iter_graph(model)
            if isinstance(node, Sparse24Linear) and node.method == "srste"]


def refresh_masks(model, *, step=None, skip_idle: bool = True):
    """Recompute every ``srste`` mask of ``model`` from its current kernel, in place; return the flip rate.

    The NNX form of :func:`jax_sparse24.masks.refresh_masks` (same computation). Call once per
    optimizer step (not per micro-batch) after the update. With ``step`` given a layer refreshes
    only when ``step % mask_every == 0`` (its own period; one ``lax.cond`` for the whole model
    skips the mask computation on steps where no layer refreshes, ``jit``-friendly: call it
    inside ``nnx.jit``); with ``step=None`` every mask is refreshed.

    Args:
      model: an NNX module (or graph of modules) containing :class:`Sparse24Linear` layers.
      step: the number of optimizer updates applied (an int, a scalar array, or a Variable such
        as ``nnx.Optimizer``'s ``step`` after ``update``), or ``None``.
      skip_idle: with ``step``, skip the mask computation under a ``lax.cond`` when no layer is
        due; ``False``: no conditional (a GPU step with a conditional waits for the host's read of
        its predicate, see :func:`jax_sparse24.masks.refresh_masks`) -- for a refresh in a program of
        its own that the host runs on due steps only (``mask_every`` periods: ``layer.mask_every``).

    Returns:
      The flip rate: the fraction of mask entries (over all refreshed layers) that changed; 0 when
      no layer refreshed.
    """
    layers = [layer for _, layer in _srste_layers(model)]
    if isinstance(step, nnx.Variable):
        step = _get(step)
    masks, rate = _layer.refresh([_get(layer.kernel) for layer in layers], [_get(layer.mask) for layer in layers],
                                 [layer.transposable for layer in layers], [layer.mask_every for layer in layers],
                                 step, skip_idle=skip_idle)
    for layer, mask in zip(layers, masks):
        _set(layer.mask, mask)
    return rate


def masks_for_params(model, params=None):
    """The ``srste`` masks of ``model`` laid out like its ``nnx.Param`` state: the ``masks=`` of ``masked_decay``.

    Returns ``params`` (default ``nnx.state(model, nnx.Param)``) with the mask at the ``kernel``
    of each ``srste`` :class:`Sparse24Linear` and ``None`` at every other leaf; pass it to
    ``optimizer.update(..., masks=...)`` or ``tx.update(..., masks=...)`` of a chain with
    :func:`jax_sparse24.optim.masked_decay`.

    Args:
      model: an NNX module containing :class:`Sparse24Linear` layers.
      params: the parameter state the optimizer works on, if not ``nnx.state(model, nnx.Param)``
        (e.g. another ``wrt`` filter); a tree of Variables or of arrays.
    """
    masks = {tuple(str(p) for p in path) + ("kernel",): _get(layer.mask) for path, layer in _srste_layers(model)}
    if params is None:
        params = nnx.state(model, nnx.Param)

    def pick(path, leaf):
        del leaf
        return masks.get(tuple(key_str(k) for k in path))

    return jax.tree_util.tree_map_with_path(pick, params, is_leaf=_is_variable)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable) or type(x).__name__ == "VariableState"  # flax 0.10: State of VariableState


def update_fp8_meta(model, grads):
    """Write the delayed-scaling part of ``grads`` (the gradient of the loss with respect to the
    :class:`Fp8Meta` variables: their new values) into ``model``; return the ``nnx.Param`` part for
    the optimizer::

        grads = nnx.grad(loss, argnums=nnx.DiffState(0, (nnx.Param, s24.nnx.Fp8Meta)))(model)
        optimizer.update(model, s24.nnx.update_fp8_meta(model, grads))

    A layer that got no gradient (its output did not reach the loss) keeps its state. For a model
    without delayed-scaling layers it only returns the ``nnx.Param`` part.

    Raises:
      ValueError: ``model`` has :class:`Fp8Meta` variables but ``grads`` has none (the loss was
        differentiated with respect to ``nnx.Param`` only: the state would never update).
    """
    old = nnx.state(model, Fp8Meta)
    new = nnx.filter_state(grads, Fp8Meta)
    if nnx.to_pure_dict(old) and not nnx.to_pure_dict(new):
        raise ValueError(
            "update_fp8_meta: the model has delayed-scaling fp8 layers (Fp8Meta) but grads holds none: "
            "differentiate with respect to them too, nnx.grad(loss, argnums=nnx.DiffState(0, (nnx.Param, "
            "s24.nnx.Fp8Meta)))(model); otherwise the amax histories never update")
    if nnx.to_pure_dict(new):
        merged = _fp8.keep_unupdated(nnx.to_pure_dict(old), nnx.to_pure_dict(new), prefix="fp8_")
        nnx.replace_by_pure_dict(old, merged)
        nnx.update(model, old)
    return nnx.filter_state(grads, nnx.Param)
