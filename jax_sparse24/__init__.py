"""jax_sparse24: 2:4 sparse training of transformers in JAX.

Every op is defined once in plain ``jax.numpy`` (the CPU path and the test oracle) and, when the
CUDA extension is built, also lowered to XLA FFI kernels for Hopper GPUs.

Public API:

* masks and estimators: :func:`nm_mask`, :func:`mask24`, :func:`transposable_mask24`,
  :func:`soft_threshold24`, :func:`soft_threshold_beta`, :func:`mvue24`, :func:`flip_rate`;
* the sparse linear op: :func:`sparse24_linear` (``jax.custom_vjp``; a mask that is not 2:4 raises
  :class:`MaskCheckError`, under ``jit`` from the device check), :func:`prepare_weight` (its
  weight work once per optimizer step), :func:`linear_plan`,
  :func:`checkpoint_policy` (``jax.checkpoint`` policies that keep the 2:4 GEMM outputs); ``fp8=True`` runs its forward and
  input-gradient GEMMs in float8_e4m3fn (:mod:`jax_sparse24.fp8`: the quantization math);
* compressed arrays: :class:`Sparse24Array`, :func:`to_sparse`, :func:`matmul` (a dense layer with a
  compressed weight: ``matmul(x, to_sparse(w, axis=0)) + bias``);
* :mod:`jax_sparse24.nn` (Flax linen ``Sparse24Dense``; :mod:`jax_sparse24.masks`: its ``"sparsity"``
  collection; :mod:`jax_sparse24.preparation`: its weights prepared once per step), :mod:`jax_sparse24.nnx` (Flax NNX
  ``Sparse24Linear``), :mod:`jax_sparse24.optim` (optax transforms),
  :mod:`jax_sparse24.prune` (ASP-style N:M pruning of trained models, channel permutation),
  :mod:`jax_sparse24.distill` (AST distillation), :mod:`jax_sparse24.sharding` (meshes and
  parameter shardings), :mod:`jax_sparse24.swap` (layer swapping for existing Flax models),
  :mod:`jax_sparse24.training` (``SparseTrainState``: a Flax-style train state that does the masked
  decay, mask refresh, MVUE key, prepared weights and phase switches of a sparse train step).
"""

from jax_sparse24._src.ffi import cuda_kernels_available
from jax_sparse24._src.linear import BACKENDS, linear_plan, prepare_weight, sparse24_linear
from jax_sparse24._src.ops import flip_rate, mask24, mvue24, nm_mask, soft_threshold24, transposable_mask24
from jax_sparse24._src.remat import CHECKPOINT_NAME, checkpoint_policy
from jax_sparse24._src.reference_ops import MVUE_EPS, soft_threshold_beta, transposable_patterns
from jax_sparse24._src.sparse_array import Sparse24Array, matmul, to_sparse
from jax_sparse24._src.validation import MaskCheckError

from jax_sparse24 import distill, fp8, masks, nn, nnx, optim, preparation, prune, sharding, swap, training  # noqa: E402,E501  (public submodules)

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "CHECKPOINT_NAME",
    "MVUE_EPS",
    "MaskCheckError",
    "Sparse24Array",
    "checkpoint_policy",
    "cuda_kernels_available",
    "flip_rate",
    "linear_plan",
    "mask24",
    "matmul",
    "mvue24",
    "nm_mask",
    "distill",
    "fp8",
    "masks",
    "nn",
    "nnx",
    "optim",
    "preparation",
    "prepare_weight",
    "prune",
    "sharding",
    "soft_threshold24",
    "swap",
    "soft_threshold_beta",
    "sparse24_linear",
    "to_sparse",
    "training",
    "transposable_mask24",
    "transposable_patterns",
]

