"""Flax linen layers for 2:4 sparse training: :class:`Sparse24Dense`.

:class:`Sparse24Dense` is a drop-in for ``flax.linen.Dense``: same fields, same parameter tree
(``kernel`` of shape (in, out), ``bias``). Sparsity state — masks, the S-STE scale β, the mask
refresh period — lives in the non-parameter collection ``"sparsity"`` (:data:`jax_sparse24.masks.SPARSITY`), never
in ``params``, so optimizers and checkpoints of ``params`` are unchanged. A train step refreshes
the masks from the current params with :func:`jax_sparse24.masks.refresh_masks` (which returns the
flip rate) and hands them to :func:`jax_sparse24.optim.masked_decay` through
:func:`jax_sparse24.masks.masks_for_params`
(:class:`jax_sparse24.training.SparseTrainState` does both).

Typical use::

    model = MLP(...)                      # uses Sparse24Dense(features, method="srste")
    variables = model.init(key, x)        # {"params": ..., "sparsity": ...}
    y = model.apply(variables, x, rngs={"mvue": step_key})
    sparsity, flips = masks.refresh_masks(variables["params"], variables["sparsity"], step=step)

The module holds the layer; the functions over the collection live in :mod:`jax_sparse24.masks`
(:data:`~jax_sparse24.masks.SPARSITY`, masks, refresh, flip rates, scanned layouts) and the weight
preparation for gradient accumulation in :mod:`jax_sparse24.preparation`
(:func:`~jax_sparse24.preparation.prepare`, :data:`~jax_sparse24.preparation.PREPARED`); import them
from there.

Scanned layers: a stack of blocks under ``nn.scan`` (one compiled body for all layers) keeps every
collection stacked along a leading layer axis; scan them all and split the MVUE stream so that each
layer draws its own key::

    Stack = nn.scan(Block, length=n_layer,
                    variable_axes={"params": 0, SPARSITY: 0, PREPARED: 0, FP8_META: 0},
                    split_rngs={"params": True, MVUE_RNG: True})
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen.dtypes import promote_dtype

from jax_sparse24._src import fp8_math as _fp8
from jax_sparse24._src import layer as _layer
from jax_sparse24._src.validation import check_positive_int
from jax_sparse24 import masks as _masks
from jax_sparse24 import preparation as _preparation

__all__ = ["Sparse24Dense", "FP8_META", "METHODS", "MVUE_RNG"]

#: The collection of the delayed-scaling fp8 state (``fp8_scaling="delayed"``): Flax's
#: ``OVERWRITE_WITH_GRADIENT`` — the gradient of these variables is their new value.
FP8_META = _fp8.META_COLLECTION
#: Training methods of :class:`Sparse24Dense`.
METHODS = _layer.METHODS
#: Name of the RNG stream used for the MVUE weight gradient.
MVUE_RNG = "mvue"

default_kernel_init = nn.initializers.lecun_normal()


class Sparse24Dense(nn.Module):
    """A 2:4 sparse ``Dense`` layer for training (drop-in for ``flax.linen.Dense``).

    The weight used in the matmul is 2:4 along ``in`` (groups of 4 consecutive input features);
    gradients reach the dense ``kernel`` straight through. ``method`` selects the recipe:

    * ``"srste"`` — hard mask kept in ``sparsity/transposable_mask`` (or ``sparsity/mask`` with
      ``transposable=False``), recomputed from the kernel by :func:`jax_sparse24.masks.refresh_masks` every
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
      mask_every: ``srste`` mask refresh period in optimizer steps (see :func:`jax_sparse24.masks.refresh_masks`).
      backend: GEMM backend, see :func:`jax_sparse24.sparse24_linear`.
      fp8: run the forward and input-gradient GEMMs in float8_e4m3fn with per-tensor current
        scaling (``sparse24_linear(..., fp8=True)``, docs/fp8.md) for every method: the 2:4 GEMMs
        of the method's effective weight, and in the dense phase (``method="dense"`` or
        ``sparse=False``) XLA's fp8 dot of the dense kernel. The MVUE weight gradient runs in fp8
        too where it runs sparse; an exact weight gradient (and the dense phase's) stays 16-bit.
        With the default current scaling it is stateless; :func:`jax_sparse24.preparation.prepare` skips fp8 layers (their
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
            name = _masks.TRANSPOSABLE_MASK if self.transposable else _masks.MASK
            self._require_sparsity(name)
            state["mask"] = self.variable(_masks.SPARSITY, name, lambda: _layer.init_mask(kernel, self.transposable)).value
            self.variable(_masks.SPARSITY, _masks.MASK_EVERY, lambda: jnp.asarray(self.mask_every, jnp.int32))
        elif self.method == "soft":
            self._require_sparsity(_masks.BETA)
            state["beta"] = self.variable(_masks.SPARSITY, _masks.BETA, lambda: _layer.init_beta(kernel)).value

        inputs, kernel_c, bias_c = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        key = None
        if self.mvue and self.method != "dense" and self.has_rng(MVUE_RNG) and not self.is_initializing():
            key = self.make_rng(MVUE_RNG)

        # Prepared weight (gradient accumulation, see `prepare`): made in the prepare pass, read in
        # the micro-batch passes.
        prepared = None
        if self.method != "dense" and sparse is not False and not self.fp8 and not self.is_initializing():
            prepared = _preparation.layer_prepared(self, inputs, kernel_c, method=self.method, mask=state.get("mask"),
                                      beta=state.get("beta"), transposable=self.transposable, backend=self.backend)

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
        if self.is_initializing() or self.has_variable(_masks.SPARSITY, name):
            return
        if self.is_mutable_collection(_masks.SPARSITY):
            return
        raise ValueError(
            f"Sparse24Dense {self.name or ''} (method={self.method!r}) needs '{_masks.SPARSITY}/{name}': pass "
            f"the '{_masks.SPARSITY}' collection from model.init(...) to apply, e.g. "
            "model.apply({'params': params, 'sparsity': sparsity}, x)"
        )
