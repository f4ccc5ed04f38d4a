"""Rematerialisation (``jax.checkpoint``) policies that know the 2:4 GEMMs.

JAX's policies decide what a rematerialised function keeps by primitive: ``dots_with_no_batch_dims_saveable``
keeps the outputs of ``dot_general``. On a GPU the 2:4 GEMMs are XLA FFI custom calls, not ``dot_general``,
so under such a policy a dense layer's output is kept while a sparse layer's forward GEMM runs a second time
in the backward pass. :func:`sparse24_linear` (and the fp8 dense layer built on the same op,
``fp8_dense_linear``) names its output :data:`CHECKPOINT_NAME`
(``jax.ad_checkpoint.checkpoint_name``); :func:`checkpoint_policy` keeps those outputs besides whatever the
base policy keeps, so a sparse layer is rematerialised exactly as a dense one.
"""

from __future__ import annotations

from typing import Callable

import jax

__all__ = ["CHECKPOINT_NAME", "checkpoint_policy"]

#: the ``checkpoint_name`` of every ``sparse24_linear`` output (Sparse24Dense, the NNX layer, distillation; also
#: ``fp8_dense_linear``'s, which runs through the same op)
CHECKPOINT_NAME = "sparse24_linear"

_BASES = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots_with_batch_dims": jax.checkpoint_policies.dots_saveable,
    "nothing": jax.checkpoint_policies.nothing_saveable,
}


def checkpoint_policy(base: str | Callable = "dots") -> Callable:
    """A ``jax.checkpoint`` / ``flax.linen.remat`` policy that saves the 2:4 GEMM outputs and ``base``'s.

    Args:
      base: ``"dots"`` (JAX's ``dots_with_no_batch_dims_saveable``: every GEMM's output is kept, attention
        score matmuls are recomputed), ``"dots_with_batch_dims"`` (``dots_saveable``), ``"nothing"``
        (only the 2:4 outputs), or any JAX checkpoint policy (a callable).

    Example: ``nn.remat(Block, policy=jax_sparse24.checkpoint_policy("dots"))``.
    """
    if callable(base):
        policy = base
    elif isinstance(base, str) and base in _BASES:
        policy = _BASES[base]
    else:
        raise ValueError(f"checkpoint_policy: base must be one of {sorted(_BASES)} or a JAX checkpoint policy "
                         f"(a callable), got {base!r}")
    return jax.checkpoint_policies.save_from_both_policies(
        policy, jax.checkpoint_policies.save_only_these_names(CHECKPOINT_NAME))
