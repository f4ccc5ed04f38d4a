"""CUTLASS: the SM90 2:4 sparse tensor-core GEMM of the extension (:mod:`~jax_sparse24._src.cuda_spmm_ops`).

Operand: CUTLASS's compressed A (``values``, ``meta``), written from W and the mask in one fused pass
(:func:`~jax_sparse24._src.cuda_compress_ops.masked_compress`), or from ``∇y`` with the MVUE sample
drawn in the same pass (:func:`~jax_sparse24._src.cuda_compress_ops.mvue24_compress`). bfloat16 and
float16; the alignment is the build's (:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_alignment`).
The kernel configuration of a GEMM comes from the planner's measured table (``config_of``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse24._src import cuda_compress_ops as cc
from jax_sparse24._src import cuda_spmm_ops as cs
from jax_sparse24._src import ffi
from jax_sparse24._src.backends.base import OK, Backend, Compression, Verdict, operand_mk, pad_rows, register

__all__ = ["CUTLASS", "Cutlass"]


class Cutlass(Backend):
    name = "cutlass"
    sparse = True
    fp8_label = "cutlass"
    operand_keys = ("values", "meta")
    operand_dims = (("pv0", "pv1"), ("pm0", "pm1"))
    compress_layout = "cutlass"

    def can_run(self, m: int, n: int, k: int, dtype=None, *, gemm: str = "forward") -> Verdict:
        if gemm == "weight_grad":
            if ffi.extension() is not None and self.supports(m, n, k, dtype, gemm=gemm):
                return OK
            return Verdict(ffi.extension_error() or (
                f"the sparse weight-gradient GEMM does not support m=O={m}, n=I={n}, k=T={k}, "
                f"dtype={jnp.dtype(dtype)} (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: "
                "jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())"))
        if ffi.extension() is not None and self.supports(m, n, k, dtype):
            return OK
        return Verdict(ffi.extension_error() or (
            f"the CUTLASS sparse GEMM does not support m={m}, n={n}, k={k}, dtype={jnp.dtype(dtype)} "
            "(bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())"))

    def weight_grad_kernels_built(self) -> bool:
        """Whether the loaded extension has a weight-gradient ("kn") configuration (a minimal build has none)."""
        return len(cs.cutlass_configs_kn()) > 0

    def supports(self, m: int, n: int, k: int, dtype, *, gemm: str = "forward") -> bool:
        """The kernel takes D(m×n) = A(m×k)·B(k×n) in ``dtype`` (the extension built; no GPU check);
        ``gemm="weight_grad"``: the "kn" GEMM (B stored (k, n))."""
        if gemm == "weight_grad":
            return cs.cutlass_supports_kn(m, n, k, dtype)
        return cs.cutlass_supports(m, n, k, dtype)

    # --- operand layout ---------------------------------------------------------------------------
    def compress(self, a):
        """CUTLASS's compressed A ``(values, meta)`` of a 2:4 (M, K) array (groups along K)."""
        return cs.cutlass_compress(a)

    def operand_shapes(self, name: str, m: int, k: int, tokens: int, dtype) -> tuple:
        """Shapes of a prepared (M, K) operand's arrays, in :attr:`operand_keys` order (any ``name``,
        any ``tokens``)."""
        vs, ms = cs.cutlass_compressed_shapes(m, k, dtype)
        return jax.ShapeDtypeStruct(vs, dtype), jax.ShapeDtypeStruct(ms, jnp.uint8)

    def compressions(self, names: tuple, i: int, o: int, tokens: int, dtype) -> list:
        """One pass of the fused compressor over W writes the operands of every GEMM of ``names``."""
        shapes = [sd for n in names for sd in self.operand_shapes(n, *operand_mk(n, i, o), tokens, dtype)]
        return [Compression(self.compress_layout, tuple(names), tuple(shapes))]

    def operand_dtype(self, entry):
        """The compute dtype a prepared operand was made for (its values' dtype)."""
        return jnp.result_type(entry["values"])

    def check_operand(self, entry, name: str, m: int, k: int, dtype, *, w_shape, op: str) -> None:
        """Trace-time check of a prepared (M, K) operand for ``w`` of ``w_shape`` in ``dtype`` (ValueError)."""
        vs, ms = cs.cutlass_compressed_shapes(m, k, dtype)
        values, meta = entry["values"], entry["meta"]
        if (tuple(jnp.shape(values)), jnp.result_type(values)) != (tuple(vs), dtype) or (
                tuple(jnp.shape(meta)), jnp.result_type(meta)) != (tuple(ms), jnp.dtype(jnp.uint8)):
            raise ValueError(
                f"{op}: prepared[{name!r}] does not match w {tuple(w_shape)} in {dtype.name}: values "
                f"{tuple(jnp.shape(values))} {jnp.result_type(values).name} (want {tuple(vs)} {dtype.name}), meta "
                f"{tuple(jnp.shape(meta))} {jnp.result_type(meta).name} (want {tuple(ms)} uint8)")

    # --- GEMMs (CUDA lowerings) -------------------------------------------------------------------
    def spmm(self, values, meta, b, *, m: int, k: int, config: int = -1):
        """D (n, m) = b (n, k) · Aᵀ with A given compressed."""
        return cs.cutlass_spmm(values, meta, b, m=m, k=k, config=config)

    def weight_gemm(self, *, m: int, n: int, k: int, transposed: bool, dtype, config_of, packed: bool = False):
        """``fn(b2, wc, mk)``: D (n, m) = b2 · Aᵀ with A = W̃ᵀ (``transposed``, the forward) or W̃ (the
        input gradient) compressed from W and the mask in one pass; ``config_of(m, n, k, dtype)``
        names the kernel configuration. ``packed``: ``fn(b2, values, bits)``, W̃ in
        :mod:`~jax_sparse24._src.packed24`'s encoding (compressed from it in one pass)."""
        compress = cc.packed_compress if packed else cc.masked_compress

        def sparse(b2, wc, mk):
            values, meta = compress(wc, mk, transposed=transposed)  # one pass over W and M (or their encoding)
            return cs.cutlass_spmm(values, meta, b2, m=m, k=k, config=config_of(m, n, k, dtype))

        return sparse

    def prepared_gemm(self, *, name: str, m: int, n: int, k: int, dtype, config_of):
        """``fn(b2, values, meta)``: the GEMM of ``name`` (``"forward"``, ``"input_grad"``) on a prepared operand."""

        def sparse(b2, values, meta):
            return cs.cutlass_spmm(values, meta, b2, m=m, k=k, config=config_of(m, n, k, dtype))  # (T, m)

        return sparse

    def mvue_weight_grad(self, *, o: int, i: int, tl: int, tokens: int, align: int, dtype, config: int = -1):
        """``fn(key, x2, g2)`` on (``tl`` tokens, I) / (``tl``, O) shards: ∇W (I, O) = xᵀ·MVUE(∇y) — the MVUE
        sample drawn and compressed in one pass over ∇y (A = MVUE(∇y)ᵀ (O, T)), B = x read N-major in
        place; tokens padded to ``align`` (``tokens`` after padding)."""

        def sparse(key, x2, g2):
            values, meta = cc.mvue24_compress(key, pad_rows(g2, align), transposed=True)
            return cs.cutlass_spmm_kn(values, meta, pad_rows(x2, align), m=o, k=tokens, config=config)  # (I, O)

        return sparse


CUTLASS = register(Cutlass())
