"""Dense: XLA's GEMM on the masked weight W̃ = W ⊙ M (the math of the sparse kernels), every platform.

What ``backend="auto"`` runs where no sparse kernel is measured faster (and on every CPU). Its fp8
GEMM is XLA's fp8 dot of the quantized operands (:func:`jax_sparse24._src.fp8_math.scaled_matmul`). It has
no kernels and no prepared operands: every answer is :class:`~.base.Backend`'s.
"""

from __future__ import annotations

from jax_sparse24._src.backends.base import Backend, register

__all__ = ["DENSE", "Dense"]


class Dense(Backend):
    name = "dense"
    fp8_label = "xla"


DENSE = register(Dense())
