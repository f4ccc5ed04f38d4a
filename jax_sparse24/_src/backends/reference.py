"""Reference: plain ``jnp`` on the masked weight, every platform — the definition every other backend's
GEMM is tested against (the same math as :mod:`~jax_sparse24._src.backends.dense`)."""

from __future__ import annotations

from jax_sparse24._src.backends.base import register
from jax_sparse24._src.backends.dense import Dense

__all__ = ["REFERENCE", "Reference"]


class Reference(Dense):
    name = "reference"


REFERENCE = register(Reference())
