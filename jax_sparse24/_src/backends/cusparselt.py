"""cuSPARSELt: the library's 2:4 sparse GEMM (:mod:`~jax_sparse24._src.cuda_cusparselt_ops`).

One handle per device, plans cached, the algorithm chosen once by ``cusparseLtMatmulSearch``. Operand:
one uint8 buffer in the library's compressed layout, written by our fused compressors where
:func:`~jax_sparse24._src.cuda_cusparselt_ops.fused_compress_ok` (bfloat16, m a multiple of 64, k of
32, the layout checked against the library once per plan), else by ``cusparseLtSpMMACompress``.
bfloat16 (float16 GEMMs are refused: :func:`~jax_sparse24._src.cuda_cusparselt_ops.float16_gemm_error`);
m, n, k multiples of 16.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse24._src import cuda_compress_ops as cc
from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import cuda_mask_ops, ffi, packed24
from jax_sparse24._src.backends.base import (OK, Backend, Compression, Verdict, masked_weight, operand_mk, pad_rows,
                                            register)

__all__ = ["CUSPARSELT", "CuSparseLt"]


class CuSparseLt(Backend):
    name = "cusparselt"
    sparse = True
    operand_keys = ("cusparselt",)
    operand_dims = (("pb",),)
    compress_layout = "cusparselt"

    def can_run(self, m: int, n: int, k: int, dtype=None, *, gemm: str = "forward") -> Verdict:
        if ffi.extension() is None:
            return Verdict(f"{ffi.extension_error()}")
        if not self.supports(m, n, k, dtype, gemm=gemm):
            return Verdict(lt.cusparselt_error() or lt.float16_gemm_error(dtype) or (
                f"cuSPARSELt needs bfloat16 and m, n, k multiples of {lt.ALIGN}, got m={m}, n={n}, k={k}, "
                f"dtype={jnp.dtype(dtype)}"))
        return OK

    def supports(self, m: int, n: int, k: int, dtype, *, gemm: str = "forward") -> bool:
        """The library loads and takes this shape and dtype (no GPU check; any ``gemm``)."""
        return lt.cusparselt_supports(m, n, k, dtype)

    def fused_operand_ok(self, m: int, n: int, k: int, dtype, *, b_kn: bool = False) -> bool:
        """Our fused compressor writes this plan's operand bit for bit (B stored (k, n) with ``b_kn``)."""
        return lt.fused_compress_ok(m, n, k, dtype, lt.B_KN if b_kn else lt.B_NK)

    def table_version_matches(self, version) -> bool:
        """The measured table's cuSPARSELt ``version`` holds for the loaded library (warns once if not)."""
        return lt.table_version_matches(version)

    # --- operand layout ---------------------------------------------------------------------------
    #: A's layout (stored (M, K)) in which our fused compressors write the operand.
    FUSED_A_LAYOUT = lt.A_MK

    def prepared_a_layout(self, name: str, dtype) -> int:
        """A's layout of a prepared operand — the per-call path's: bfloat16 A stored (M, K) (our fused
        compressor, or the library's on the transposed W̃ where the layout check fails); float16
        (library compressor) W̃ as stored, (K, M) for the forward."""
        if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) or name != "forward":
            return lt.A_MK
        return lt.A_KM

    def operand_shapes(self, name: str, m: int, k: int, tokens: int, dtype) -> tuple:
        """Shape of a prepared (M, K) operand's buffer (planned for ``tokens`` rows, A in
        :meth:`prepared_a_layout`)."""
        a_layout = self.prepared_a_layout(name, dtype)
        return (jax.ShapeDtypeStruct((lt.cusparselt_compressed_size(m, tokens, k, dtype, a_layout, lt.B_NK),),
                                     jnp.uint8),)

    def compressions(self, names: tuple, i: int, o: int, tokens: int, dtype) -> list:
        """One pass of our fused compressor where it writes every operand (its layout check passes:
        bfloat16), else one per GEMM (fused, or the library's compressor on the masked weight)."""
        plans = {n: operand_mk(n, i, o) for n in names}
        fused = {n: self.prepared_a_layout(n, dtype) == self.FUSED_A_LAYOUT
                 and self.fused_operand_ok(m, tokens, k, dtype) for n, (m, k) in plans.items()}
        shape = {n: self.operand_shapes(n, m, k, tokens, dtype)[0] for n, (m, k) in plans.items()}
        if len(names) == 2 and all(fused.values()):
            return [Compression(self.compress_layout, tuple(names), tuple(shape[n] for n in names))]
        return [Compression(self.compress_layout if fused[n] else None, (n,), (shape[n],)) for n in names]

    def operand_dtype(self, entry):
        """None: a prepared buffer does not record its compute dtype (the layer's is used)."""
        return None

    def check_operand(self, entry, name: str, m: int, k: int, dtype, *, w_shape, op: str) -> None:
        """Trace-time check of a prepared operand (ValueError); the exact byte count belongs to the plan
        and is checked by ``cusparselt_spmm`` on the GPU."""
        buf = entry["cusparselt"]
        if jnp.ndim(buf) != 1 or jnp.result_type(buf) != jnp.uint8:
            raise ValueError(f"{op}: prepared[{name!r}]['cusparselt'] must be a 1-D uint8 buffer, got "
                             f"{tuple(jnp.shape(buf))} {jnp.result_type(buf).name}")
        if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise ValueError(f"{op}: a cuSPARSELt prepared weight computes in bfloat16/float16, the layer in "
                             f"{dtype.name}")

    def library_compress(self, name: str, wc, mk, *, m: int, k: int, tokens: int, dtype):
        """``cusparseLtSpMMACompress`` of the masked weight: the forward's A stored (K, M) = W̃ as is, or
        (M, K) = W̃ᵀ; the input gradient's A = W̃ stored (M, K)."""
        layout = self.prepared_a_layout(name, dtype)
        a = masked_weight(wc, mk)
        if name == "forward" and layout == lt.A_MK:
            a = a.T
        return lt.cusparselt_compress(a, m=m, n=tokens, k=k, a_layout=layout, b_layout=lt.B_NK)

    # --- GEMMs (CUDA lowerings) -------------------------------------------------------------------
    def weight_gemm(self, *, m: int, n: int, k: int, transposed: bool, dtype, config_of=None, packed: bool = False):
        """``fn(b2, wc, mk)``: D (n, m) = b2 · Aᵀ with A = W̃ᵀ (``transposed``, the forward) or W̃.
        ``packed``: ``fn(b2, values, bits)``, W̃ in :mod:`~jax_sparse24._src.packed24`'s encoding."""
        if lt.fused_compress_ok(m, n, k, dtype):
            compress = cc.packed_compress if packed else cc.masked_compress

            def sparse(b2, wc, mk):  # our compressor writes cuSPARSELt's operand, A stored (M, K)
                ca = compress(wc, mk, transposed=transposed, layout="cusparselt")
                return lt.cusparselt_spmm(ca, b2, m=m, n=n, k=k, a_layout=lt.A_MK, b_layout=lt.B_NK)
            return sparse
        # the library's compressor on W̃ as stored (I, O): (K, M) for the forward, (M, K) for ∇x
        a_layout = lt.A_KM if transposed else lt.A_MK
        dense_weight = packed24.unpacked_weight if packed else masked_weight

        def sparse(b2, wc, mk):
            ca = lt.cusparselt_compress(dense_weight(wc, mk), m=m, n=n, k=k, a_layout=a_layout, b_layout=lt.B_NK)
            return lt.cusparselt_spmm(ca, b2, m=m, n=n, k=k, a_layout=a_layout, b_layout=lt.B_NK)

        return sparse

    def prepared_gemm(self, *, name: str, m: int, n: int, k: int, dtype, config_of=None):
        """``fn(b2, buffer)``: the GEMM of ``name`` on a prepared operand, B = b2 (T, K)."""
        a_layout = self.prepared_a_layout(name, dtype)

        def sparse(b2, buffer):
            return lt.cusparselt_spmm(buffer, b2, m=m, n=n, k=k, a_layout=a_layout, b_layout=lt.B_NK)

        return sparse

    def mvue_weight_grad(self, *, o: int, i: int, tl: int, tokens: int, align: int, dtype, config: int = -1):
        """``fn(key, x2, g2)``: ∇W (I, O) = xᵀ·MVUE(∇y) on cuSPARSELt, A = MVUE(∇y) (T, O) = (K, M):
        drawn and compressed in one pass where our compressor's layout holds (K padded to 32), else the
        MVUE kernel then the library's compressor (K padded to ``align``, ``tokens`` in all)."""

        def sparse_lt(key, x2, g2):
            tl32 = tl + (-tl) % 32  # the fused compressor's cuSPARSELt layout needs K % 32
            if lt.fused_compress_ok(o, i, tl32, dtype, lt.B_KN):
                # one pass: MVUE(∇y)ᵀ (O, T) = (M, K) drawn and compressed (same draws as mvue24_cuda)
                ca = cc.mvue24_compress(key, pad_rows(g2, 32), transposed=True, layout="cusparselt")
                return lt.cusparselt_spmm(ca, pad_rows(x2, 32), m=o, n=i, k=tl32, a_layout=lt.A_MK,
                                          b_layout=lt.B_KN)  # (I, O)
            gs = cuda_mask_ops.mvue24_cuda(key, pad_rows(g2, align), axis=0)
            ca = lt.cusparselt_compress(gs, m=o, n=i, k=tokens, a_layout=lt.A_KM, b_layout=lt.B_KN)
            return lt.cusparselt_spmm(ca, pad_rows(x2, align), m=o, n=i, k=tokens, a_layout=lt.A_KM,
                                      b_layout=lt.B_KN)  # (I, O)

        return sparse_lt


CUSPARSELT = register(CuSparseLt())
