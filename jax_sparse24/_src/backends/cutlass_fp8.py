"""CUTLASS fp8: the SM90 2:4 sparse fp8 GEMM (:mod:`~jax_sparse24._src.cuda_fp8_ops`), for
``sparse24_linear(..., fp8=True)`` with ``backend="cutlass"`` or ``"auto"``.

Operand: q(W̃)ᵀ (forward) or q(W̃) (input gradient) in CUTLASS's fp8 sparse layout, written by the
fused quantize + mask + compress kernel; the weight gradient's q(MVUE(∇y))ᵀ by the fused MVUE +
quantize + compress kernel, with q(x)ᵀ from the quantize-transpose kernel. The dense operand is
quantized by XLA; ``alpha`` (the product of the scales) is applied in the GEMM's epilogue. Needs the
fp8 kernels in the build and m % 8, n % 16, k % 32 (:func:`~jax_sparse24._src.cuda_fp8_ops.cutlass_alignment_fp8`).
"""

from __future__ import annotations

import dataclasses

from jax_sparse24._src import cuda_fp8_ops as cf
from jax_sparse24._src import ffi, fp8_math, partitioning
from jax_sparse24._src.backends.base import Backend, Verdict, pad_rows, register

__all__ = ["CUTLASS_FP8", "CutlassFp8"]


class CutlassFp8(Backend):
    name = "cutlass"
    sparse = True
    fp8 = True
    fp8_label = "cutlass"
    operand_keys = ("values", "meta")

    def can_run(self, m: int, n: int, k: int, dtype=None, *, gemm: str = "forward") -> Verdict:
        """``gemm="weight_grad"``: m = O, n = I, k = the tokens padded to 32 (the MVUE compressor's and the
        quantize-transpose kernel's grids too)."""
        reason = self._gemm_reason(m, n, k)
        if reason is None and gemm == "weight_grad" and not cf.fp8_weight_grad_supports(m, n, k):
            reason = (f"the fp8 weight-gradient kernels take at most {cf.QUANTIZE_TRANSPOSE_MAX_ROWS} (padded) "
                      f"tokens per call, got {k}")
        return Verdict(reason)

    @staticmethod
    def _gemm_reason(m: int, n: int, k: int) -> str | None:
        if ffi.extension() is None:
            return ffi.extension_error()
        if not cf.fp8_kernels_built():
            return "the loaded extension was built without the fp8 kernels"
        if not cf.fp8_gemm_supports(m, n, k):
            am, an, ak = cf.cutlass_alignment_fp8()
            return f"the fp8 sparse GEMM needs m % {am}, n % {an}, k % {ak} == 0, got m={m}, n={n}, k={k}"
        return None

    def sharding_rule(self, kind: str, **kwargs) -> partitioning.Rule:
        """:func:`~jax_sparse24._src.partitioning.gemm_rule` of ``kind`` (transposable) with the two scales
        appended, replicated (``packed_weight=True``: the local function takes a weight gathered packed)."""
        base = partitioning.gemm_rule(kind, transposable=True, **kwargs)
        return dataclasses.replace(base, name=base.name.replace("sparse24", "sparse24 fp8"),
                                   operands=base.operands + ((), ()))

    # --- GEMMs (CUDA lowerings) -------------------------------------------------------------------
    def weight_gemm(self, *, m: int, n: int, k: int, transposed: bool, dtype=None, config_of=None,
                    packed: bool = False):
        """``fn(b2, wc, mk, s_b, s_w)``: D (n, m) = (s_b·s_w) · q(b2)·q(A)ᵀ, A = W̃ᵀ (``transposed``) or W̃
        (one kernel configuration: ``dtype`` and ``config_of`` are not used).
        ``packed``: ``fn(b2, values, bits, s_b, s_w)``, W̃ in :mod:`~jax_sparse24._src.packed24`'s encoding."""
        compress = cf.fp8_packed_compress if packed else cf.fp8_masked_compress

        def cuda(b2, wc, mk, s_b, s_w):
            values, meta = compress(wc, mk, s_w, transposed=transposed)
            return cf.cutlass_spmm_fp8(values, meta, fp8_math.quantize(b2, s_b), s_b * s_w, m=m, k=k)

        return cuda

    def mvue_weight_grad(self, *, o: int, i: int | None = None, tl: int | None = None, tokens: int, align: int, dtype=None,
                         config: int = -1):
        """``fn(key, x2, g2, s_x, s_m)``: ∇W (I, O) = q(x)ᵀ (I, Tp) · q(MVUE(∇y)) (Tp, O) · (s_x·s_m), tokens
        padded to ``align`` (``tokens`` after padding; ``i``, ``tl``, ``dtype``, ``config`` are not used)."""

        def kernel(key, x2, g2, s_x, s_m):
            xp, gp = pad_rows(x2, align), pad_rows(g2, align)
            values, meta = cf.fp8_mvue24_compress(key, gp, s_m)  # q(MVUE(∇y))ᵀ (O, Tp)
            # A = q(MVUE(∇y))ᵀ (O, Tp), b = q(x)ᵀ (I, Tp)
            return cf.cutlass_spmm_fp8(values, meta, cf.fp8_quantize_transpose(xp, s_x), s_x * s_m, m=o, k=tokens)

        return kernel


CUTLASS_FP8 = register(CutlassFp8())
