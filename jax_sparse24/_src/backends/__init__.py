"""The GEMM backends of a 2:4 linear layer: one module and one object per backend.

=================  =====================================================================
``cutlass``        :mod:`.cutlass` — the SM90 sparse tensor-core GEMM of the extension
``cusparselt``     :mod:`.cusparselt` — cuSPARSELt's sparse GEMM
``cutlass`` (fp8)  :mod:`.cutlass_fp8` — the sparse fp8 GEMM (``fp8=True``)
``dense``          :mod:`.dense` — XLA's GEMM on the masked weight (fp8: XLA's fp8 dot)
``reference``      :mod:`.reference` — plain ``jnp``, the definition
=================  =====================================================================

The interface is :class:`~.base.Backend`; which one a GEMM runs is the planner's decision
(:func:`jax_sparse24._src.autotune.resolve`, which returns one of these objects). To add a backend,
write its module (a :class:`~.base.Backend` subclass and ``register(...)`` of its object) and import it
below: the order of the imports is the order of ``jax_sparse24.BACKENDS``.
"""

from jax_sparse24._src.backends.base import (OK, Backend, Compression, Verdict, bool_mask, get, masked_weight, names,
                                            operand_mk, pad_rows, register, registered)
from jax_sparse24._src.backends.cutlass import CUTLASS
from jax_sparse24._src.backends.cusparselt import CUSPARSELT
from jax_sparse24._src.backends.dense import DENSE
from jax_sparse24._src.backends.reference import REFERENCE
from jax_sparse24._src.backends.cutlass_fp8 import CUTLASS_FP8

__all__ = ["Backend", "Compression", "Verdict", "OK", "register", "get", "names", "registered", "masked_weight",
           "bool_mask", "operand_mk", "pad_rows", "CUTLASS", "CUSPARSELT", "DENSE", "REFERENCE", "CUTLASS_FP8"]
