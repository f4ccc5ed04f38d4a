"""Dense: XLA's GEMM on the masked weight W̃ = W ⊙ M (the math of the sparse kernels), every platform.

What ``backend="auto"`` runs where no sparse kernel is measured faster (and on every CPU). Its fp8
GEMM is XLA's fp8 dot of the quantized operands (:func:`jax_sparse24._src.fp8.scaled_matmul`).
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_sparse24._src import fp8
from jax_sparse24._src.backends.base import Backend, masked_weight, register

__all__ = ["DENSE", "Dense"]


class Dense(Backend):
    name = "dense"
    fp8_label = "xla"

    def forward(self, x2, wm, precision=None):
        """y (T, O) = x (T, I) · W̃ (I, O)."""
        return jnp.dot(x2, wm, precision=precision)

    def input_grad(self, g2, wm, precision=None):
        """∇x (T, I) = ∇y (T, O) · W̃ᵀ."""
        return jnp.dot(g2, wm.T, precision=precision)

    def weight_grad(self, x2, g2, precision=None):
        """∇W (I, O) = xᵀ · G (G = ∇y, or its MVUE sample)."""
        return jnp.dot(x2.T, g2, precision=precision)

    def fp8_weight_gemm(self, *, transposed: bool):
        """``fn(b2, wc, mk, s_b, s_w)``: the fp8 GEMM of the forward (``transposed``: b2 · q(W̃)) or the
        input gradient (b2 · q(W̃)ᵀ) as XLA's fp8 dot, ``(s_b·s_w)`` applied to the accumulator."""

        def xla(b2, wc, mk, s_b, s_w):
            qw = fp8.quantize(masked_weight(wc, mk), s_w)  # (I, O)
            return fp8.scaled_matmul(fp8.quantize(b2, s_b), qw, s_b * s_w, transpose_b=not transposed)

        return xla

    def fp8_weight_grad(self, xp, gs, s_x, s_m):
        """``q(x)ᵀ·q(G) · (s_x·s_m)`` (G: the MVUE sample) with XLA's fp8 dot."""
        return fp8.scaled_matmul(fp8.quantize(xp, s_x).T, fp8.quantize(gs, s_m), s_x * s_m)


DENSE = register(Dense())
