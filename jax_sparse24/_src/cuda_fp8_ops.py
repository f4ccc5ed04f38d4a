"""The fp8 (float8_e4m3fn) 2:4 kernels (CUDA only): fused quantize + mask + compress, and the
CUTLASS SM90 sparse fp8 GEMM.

Math: :mod:`jax_sparse24._src.fp8_math` (the single definition). Formulation as for the 16-bit GEMM
(:mod:`jax_sparse24._src.cuda_spmm_ops`)::

    d (N, M) = alpha · (b (N, K) @ A.T)      A (M, K) 2:4 along K, float8_e4m3fn, given compressed

with float32 accumulation and a bfloat16 ``d``. For a layer ``y = x·W̃`` the forward is
``A = q(W̃)ᵀ`` (M = O, K = I), ``b = q(x)``, ``alpha = s_x·s_w``; the input gradient
``A = q(W̃)`` (M = I, K = O; needs a transposable mask), ``b = q(∇y)``, ``alpha = s_g·s_w``; the weight
gradient ``A = q(MVUE(∇y))ᵀ`` (M = O, K = T), ``b = q(x)ᵀ`` (N = I: written by :func:`fp8_quantize_transpose`), ``alpha = s_m·s_x``.

* :func:`fp8_masked_compress` — ``quantize(x ⊙ mask, s)`` compressed into CUTLASS's SM90 fp8 layout
  in one pass over ``x`` and ``mask`` (bit-identical to ``cutlass_compress(quantize(x⊙mask, s))``,
  CUTLASS's own compressor on float8_e4m3fn: the oracle of the GPU tests);
* :func:`fp8_packed_compress` — :func:`fp8_masked_compress` of a weight held in
  :mod:`~jax_sparse24._src.packed24`'s encoding (an FSDP weight gathered packed), read as it is;
* :func:`fp8_mvue24_compress` — ``quantize(MVUE(g), s)`` of an output gradient ``g (T, O)`` compressed as
  the weight-gradient GEMM's A operand ``q(MVUE(g))ᵀ`` (groups along the token axis) in one pass, with
  the element-wise MVUE kernel's draws (bit-identical to
  ``fp8_masked_compress(mvue24_cuda(key, g, axis=0), ones, s, transposed=True)``);
* :func:`fp8_quantize_transpose` — ``quantize(x, s).T`` in one pass (the weight-gradient GEMM's dense
  operand ``q(x)ᵀ``; XLA's transpose fusions wrote it at a fraction of memory speed);
* :func:`cutlass_spmm_fp8` — the sparse fp8 GEMM.

Every argument is checked at trace time and a violation raises ``ValueError`` naming the
constraint (the C++ handlers check again). Scales are traced values: their finiteness is not
checked here (``fp8.scale_from_amax`` never makes a bad one). These functions lower only on CUDA;
callers pick them with :func:`jax_sparse24._src.ffi.per_platform`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import cuda_mask_ops, packed24
from jax_sparse24._src import cuda_spmm_ops as _spmm
from jax_sparse24._src import ffi as _ffi
from jax_sparse24._src.fp8_math import FP8_DTYPE, GEMM_OUT_DTYPE, check_scale

__all__ = [
    "INPUT_DTYPES",
    "fp8_kernels_built",
    "cutlass_alignment_fp8",
    "cutlass_configs_fp8",
    "fp8_compressed_shapes",
    "fp8_compress_supports",
    "fp8_gemm_supports",
    "fp8_weight_grad_supports",
    "fp8_masked_compress",
    "fp8_packed_compress",
    "fp8_mvue24_compress",
    "fp8_quantize_transpose",
    "cutlass_spmm_fp8",
]

_T_COMPRESS = "jax_sparse24_fp8_masked_compress"
_T_PACKED = "jax_sparse24_fp8_packed_compress"
_T_SPMM = "jax_sparse24_cutlass_spmm_fp8"
_T_MVUE = "jax_sparse24_fp8_mvue24_compress"
_T_QT = "jax_sparse24_fp8_quantize_transpose"
#: dtypes :func:`fp8_masked_compress` quantizes from.
INPUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
#: The compressor's own shape rule (also the GEMM's m and k alignment).
_COMPRESS_M, _COMPRESS_K = 8, 32
#: Grid limits of the kernels (CUDA's 65535 blocks in grid.y): the compressors tile K by 128 along
#: grid.y (fp8_compress_kernels.cu kTileK), the quantize-transpose tiles x's rows by 64 (kQtTile).
COMPRESS_MAX_K = 65535 * 128
QUANTIZE_TRANSPOSE_MAX_ROWS = 65535 * 64


def fp8_kernels_built() -> bool:
    """True when the extension is loaded and was built with at least one fp8 GEMM configuration."""
    ext = _ffi.extension()
    if ext is None or not hasattr(ext, "cutlass_configs_fp8"):
        return False
    return len(cutlass_configs_fp8()) > 0


@functools.lru_cache(maxsize=None)
def cutlass_configs_fp8() -> tuple[str, ...]:
    """Names of the compiled fp8 GEMM configurations; the index is ``cutlass_spmm_fp8``'s ``config``."""
    ext = _ffi.require_extension()
    if not hasattr(ext, "cutlass_configs_fp8"):
        return ()
    return tuple(ext.cutlass_configs_fp8())


@functools.lru_cache(maxsize=None)
def cutlass_alignment_fp8() -> tuple[int, int, int]:
    """``(m, n, k)`` divisibility the fp8 sparse GEMM requires (``(8, 16, 32)``)."""
    ext = _ffi.require_extension()
    if not hasattr(ext, "cutlass_alignment_fp8"):
        raise ValueError("the loaded jax_sparse24 extension has no fp8 kernels (rebuild it from this checkout)")
    return tuple(int(v) for v in ext.cutlass_alignment_fp8())


def fp8_compressed_shapes(m: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(values_shape, meta_shape)`` of a compressed (m, k) float8_e4m3fn operand: values (m, k/2),
    meta (round_up(m, 64), round_up(k, 128)/8) uint8."""
    return _spmm.cutlass_compressed_shapes(m, k, FP8_DTYPE)


def _operand_mk(shape, transposed: bool) -> tuple[int, int]:
    r, c = shape
    return (c, r) if transposed else (r, c)


def _compress_reason(shape, dtype, transposed: bool, name: str = "x") -> str | None:
    if len(shape) != 2:
        return f"{name} must be 2-D (rows, cols), got shape {tuple(shape)}"
    if jnp.dtype(dtype) not in INPUT_DTYPES:
        return f"{name} must be bfloat16, float16 or float32, got {jnp.dtype(dtype)}"
    m, k = _operand_mk(shape, transposed)
    a = f"{name}.T" if transposed else name
    if m <= 0 or k <= 0 or m % _COMPRESS_M or k % _COMPRESS_K:
        return (f"the fp8 operand A = {a} needs M % {_COMPRESS_M} == 0 and K % {_COMPRESS_K} == 0 (M, K > 0), "
                f"got M={m}, K={k} ({name} of shape {tuple(shape)}, transposed={bool(transposed)})")
    if k > COMPRESS_MAX_K:
        return (f"the fp8 operand A = {a} needs K <= {COMPRESS_MAX_K} (the compressor's grid), got K={k} "
                f"({name} of shape {tuple(shape)}, transposed={bool(transposed)})")
    return None


def _quantize_transpose_reason(r: int, c: int) -> str | None:
    if r % 16 or c % 8:
        return f"x needs rows % 16 == 0 and columns % 8 == 0, got shape {(r, c)}"
    if r > QUANTIZE_TRANSPOSE_MAX_ROWS:
        return f"x needs rows <= {QUANTIZE_TRANSPOSE_MAX_ROWS} (the kernel's grid), got shape {(r, c)}"
    return None


def fp8_compress_supports(shape, dtype, *, transposed: bool) -> bool:
    """True when the fp8 kernels are built and :func:`fp8_masked_compress` takes an (R, C) ``x`` of ``dtype``."""
    if not fp8_kernels_built() or _compress_reason(tuple(shape), dtype, transposed) is not None:
        return False
    try:
        fp8_compressed_shapes(*_operand_mk(tuple(shape), transposed))
    except ValueError:
        return False
    return True


def fp8_gemm_supports(m: int, n: int, k: int) -> bool:
    """True when the fp8 kernels are built and the fp8 GEMM takes D(m×n) = A(m×k, 2:4)·B(k×n)."""
    if not fp8_kernels_built():
        return False
    am, an, ak = cutlass_alignment_fp8()
    if min(m, n, k) <= 0 or m % am or n % an or k % ak or max(m, n, k) >= 2**31 - 256:
        return False
    try:
        fp8_compressed_shapes(m, k)
    except ValueError:
        return False
    return True


def fp8_weight_grad_supports(o: int, i: int, tokens: int) -> bool:
    """True when the fp8 MVUE weight gradient's kernels take ``∇W (I, O)`` over ``tokens`` (already
    padded to a multiple of 32): the sparse GEMM D(O×I) with K = tokens, the MVUE compressor of ``∇y``
    (tokens, O) and the quantize-transpose of ``x`` (tokens, I) — within their grids."""
    return (fp8_gemm_supports(o, i, tokens) and _compress_reason((tokens, o), jnp.float32, True) is None
            and _quantize_transpose_reason(tokens, i) is None)


def _check_mask(mask, x, op: str):
    if tuple(np.shape(mask)) != tuple(np.shape(x)):
        raise ValueError(f"{op}: mask must have x's shape {tuple(np.shape(x))}, got {tuple(np.shape(mask))}")
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        if not (jnp.issubdtype(mask.dtype, jnp.integer) or jnp.issubdtype(mask.dtype, jnp.floating)):
            raise ValueError(f"{op}: mask must be bool (or 0/1 numbers), got dtype {mask.dtype}")
        mask = mask != 0
    return mask


def fp8_masked_compress(x, mask, scale, *, transposed: bool = False):
    """``quantize(x ⊙ mask, scale)`` in float8_e4m3fn, compressed as the fp8 GEMM's A operand, in one pass.

    Args:
      x: (R, C) bfloat16, float16 or float32.
      mask: (R, C) bool (or 0/1), 2:4 along the compressed axis (C, or R when ``transposed``).
        A group with more than two kept elements keeps its first two (not a 2:4 mask: undefined math).
      scale: float32 scalar (array, read on the device): ``s`` of :func:`jax_sparse24._src.fp8_math.quantize`
        — the kernel multiplies by the correctly rounded float32 ``1/s``.
      transposed: False: ``A = q(x⊙mask)`` (M = R, K = C); True: ``A = q(x⊙mask).T`` (M = C, K = R),
        read in x's layout (e.g. ``W (I, O)`` -> the forward operand ``q(W̃)ᵀ``).

    Returns:
      ``(values, meta)``: values (M, K/2) float8_e4m3fn, meta uint8 of :func:`fp8_compressed_shapes`.

    Raises:
      ValueError: x not 2-D or of another dtype, M % 8 or K % 32 nonzero, a mask of another shape, a
        non-scalar or non-float scale, or an extension without the fp8 kernels.
    """
    op = "fp8_masked_compress"
    shape, dtype = tuple(int(s) for s in np.shape(x)), jnp.result_type(x)
    reason = _compress_reason(shape, dtype, transposed)
    if reason is not None:
        raise ValueError(f"{op}: {reason}")
    x = jnp.asarray(x)
    mask = _check_mask(mask, x, op)
    scale = check_scale(scale, op)
    return _compressed_call(op, _T_COMPRESS, _operand_mk(shape, transposed), x, mask, scale,
                            transposed=np.bool_(bool(transposed)))


def fp8_packed_compress(values, bits, scale, *, transposed: bool = False):
    """:func:`fp8_masked_compress` of the weight ``W (R, C)`` that :func:`~jax_sparse24._src.packed24.pack24`
    encoded as ``(values (R/2, C), bits (R/8, C) uint8)``, in one pass over the encoding (``W`` is never
    unpacked in memory): bit for bit ``fp8_masked_compress(*unpack24(values, bits), scale,
    transposed=transposed)``. ``transposed=False`` compresses along ``C`` (the input gradient's operand:
    needs a transposable mask)."""
    op = "fp8_packed_compress"
    values, bits = jnp.asarray(values), jnp.asarray(bits)
    shape = packed24.unpacked_shape(values, bits, op)
    reason = _compress_reason(shape, values.dtype, transposed)
    if reason is not None:
        raise ValueError(f"{op}: for the unpacked weight x of shape {shape}: {reason}")
    scale = check_scale(scale, op)
    return _compressed_call(op, _T_PACKED, _operand_mk(shape, transposed), values, bits, scale,
                            transposed=np.bool_(bool(transposed)))


def _compressed_call(op: str, target: str, mk, *operands, **attrs):
    """``(values, meta)`` of the fp8 compressor FFI ``target`` for an A operand of logical shape ``mk``."""
    try:
        values_shape, meta_shape = fp8_compressed_shapes(*mk)
    except ValueError as e:
        raise ValueError(f"{op}: {e} (is the extension built with the fp8 kernels?)") from None
    out_types = (jax.ShapeDtypeStruct(values_shape, FP8_DTYPE), jax.ShapeDtypeStruct(meta_shape, jnp.uint8))
    values, meta = _ffi.ffi_call(target, out_types, *operands, **attrs)
    return values, meta


def fp8_mvue24_compress(key, g, scale):
    """``quantize(MVUE(g), scale)`` compressed as ``A = q(MVUE(g))ᵀ`` (M = C, K = R), in one pass over ``g``.

    The unbiased MVUE 2:4 sample of ``g`` with its groups of 4 along ``g``'s rows (the token axis of
    an output gradient ``∇y (T, O)``), drawn with the same Philox stream and group numbering as
    ``mvue24_cuda(key, g, axis=0)``; each kept value is rounded to ``g``'s dtype (as that op writes
    it) and then quantized: the result is bit-identical to
    ``fp8_masked_compress(mvue24_cuda(key, g, axis=0), ones, scale, transposed=True)``.

    Args:
      key: a single PRNG key (typed or raw uint32 key data).
      g: (R, C) bfloat16, float16 or float32; R % 32 == 0 and C % 8 == 0.
      scale: float32 scalar (array, read on the device). The sample's values reach up to twice
        ``max |g|`` (:data:`jax_sparse24._src.fp8_math.MVUE_SCALE_FACTOR`); larger ones saturate at ±448.

    Returns:
      ``(values, meta)``: values (C, R/2) float8_e4m3fn, meta uint8 of :func:`fp8_compressed_shapes` (C, R).
    """
    op = "fp8_mvue24_compress"
    shape, dtype = tuple(int(s) for s in np.shape(g)), jnp.result_type(g)
    reason = _compress_reason(shape, dtype, True, "g")
    if reason is not None:
        raise ValueError(f"{op}: {reason}")
    try:
        words = cuda_mask_ops._key_words(key)
    except ValueError as e:
        raise ValueError(str(e).replace("mvue24_cuda", op)) from None
    scale = check_scale(scale, op)
    return _compressed_call(op, _T_MVUE, _operand_mk(shape, True), words, jnp.asarray(g), scale)


def fp8_quantize_transpose(x, scale):
    """``quantize(x, scale).T`` (C, R) float8_e4m3fn in one pass over ``x`` (R, C): bit-identical to
    :func:`jax_sparse24._src.fp8_math.quantize` then a transpose.

    Args:
      x: (R, C) bfloat16, float16 or float32; R % 16 == 0, C % 8 == 0, R <= :data:`QUANTIZE_TRANSPOSE_MAX_ROWS`.
      scale: float32 scalar (array, read on the device).
    """
    op = "fp8_quantize_transpose"
    if np.ndim(x) != 2:
        raise ValueError(f"{op}: x must be 2-D (rows, cols), got shape {tuple(np.shape(x))}")
    r, c = (int(v) for v in np.shape(x))
    dtype = jnp.result_type(x)
    if jnp.dtype(dtype) not in INPUT_DTYPES:
        raise ValueError(f"{op}: x must be bfloat16, float16 or float32, got {jnp.dtype(dtype)}")
    reason = _quantize_transpose_reason(r, c)
    if reason is not None:
        raise ValueError(f"{op}: {reason}")
    scale = check_scale(scale, op)
    _ffi.require_extension()
    return _ffi.ffi_call(_T_QT, jax.ShapeDtypeStruct((c, r), FP8_DTYPE), jnp.asarray(x), scale)


def cutlass_spmm_fp8(values, meta, b, alpha, *, m: int, k: int, config: int = -1):
    """``d (n, m) = alpha · (b (n, k) @ A.T)`` in bfloat16, A (m, k) 2:4 float8_e4m3fn given compressed.

    Args:
      values, meta: the compressed A (:func:`fp8_masked_compress`, or ``cutlass_compress`` of a
        float8_e4m3fn array).
      b: (n, k) float8_e4m3fn (e.g. ``fp8.quantize(x, s_x)``), read in place as a K-major K×N matrix.
      alpha: float32 scalar (array, read on the device), ``s_a·s_b``.
      m, k: A's logical shape. Alignment: m % 8, n % 16, k % 32 (:func:`cutlass_alignment_fp8`).
      config: index into :func:`cutlass_configs_fp8`, or -1 for the extension's default.

    Returns:
      (n, m) bfloat16, float32 accumulation, ``alpha`` applied to the accumulator before the rounding.
    """
    op = "cutlass_spmm_fp8"
    if np.ndim(b) != 2:
        raise ValueError(f"{op}: `b` must be 2-D (n, k), got shape {tuple(np.shape(b))}")
    n, kb = (int(v) for v in np.shape(b))
    if isinstance(m, bool) or isinstance(k, bool) or int(m) != m or int(k) != k:
        raise ValueError(f"{op}: m and k must be integers, got m={m!r}, k={k!r}")
    m, k = int(m), int(k)
    if kb != k:
        raise ValueError(f"{op}: `b` must have shape (n, k) with k={k}, got shape {(n, kb)}")
    for name, arr in (("values", values), ("b", b)):
        if jnp.result_type(arr) != FP8_DTYPE:
            raise ValueError(f"{op}: `{name}` must be float8_e4m3fn, got {jnp.result_type(arr)}")
    if jnp.result_type(meta) != jnp.uint8:
        raise ValueError(f"{op}: `meta` must be uint8, got {jnp.result_type(meta)}")
    alpha = check_scale(alpha, op, "alpha")
    am, an, ak = cutlass_alignment_fp8()
    if m <= 0 or n <= 0 or k <= 0 or m % am or n % an or k % ak:
        raise ValueError(f"{op}: the fp8 sparse GEMM needs m % {am} == 0, n % {an} == 0, k % {ak} == 0 (all "
                         f"positive), got m={m}, n={n}, k={k}")
    values_shape, meta_shape = fp8_compressed_shapes(m, k)
    if tuple(np.shape(values)) != values_shape:
        raise ValueError(f"{op}: `values` must have the compressed shape {values_shape} for m={m}, k={k}, "
                         f"got {tuple(np.shape(values))}")
    if tuple(np.shape(meta)) != meta_shape:
        raise ValueError(f"{op}: `meta` must have the compressed shape {meta_shape} for m={m}, k={k}, "
                         f"got {tuple(np.shape(meta))}")
    names = cutlass_configs_fp8()
    if not names:
        raise ValueError(f"{op}: no fp8 GEMM configuration is compiled in this build")
    if isinstance(config, bool) or int(config) != config or not -1 <= int(config) < len(names):
        raise ValueError(f"{op}: config must be -1 (default) or in [0, {len(names)}) (compiled: {list(names)}), "
                         f"got {config!r}")
    return _ffi.ffi_call(_T_SPMM, jax.ShapeDtypeStruct((n, m), GEMM_OUT_DTYPE), values, meta, b, alpha,
                         m=np.int64(m), n=np.int64(n), k=np.int64(k), config=np.int64(int(config)))
