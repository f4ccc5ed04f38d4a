"""The CUTLASS SM90 2:4 sparse GEMM and its compressor (CUDA only).

Formulation::

    d (N, M) = b (N, K) @ A.T        with A (M, K) 2:4 along K, given compressed

i.e. D = A·B with A row-major M×K (K-major) and B, D read/written as the column-major K×N / M×N
matrices that the row-major arrays ``b`` (N, K) and ``d`` (N, M) already are. For a layer
``y = x @ w̃`` (x: (T, I), w̃: (I, O), 2:4 along I): ``A = w̃.T`` (M = O, K = I), ``b = x``,
``d = y``. For the input gradient ``∇x = ∇y @ w̃.T`` (w̃ 2:4 along O, transposable mask):
``A = w̃`` (M = I, K = O), ``b = ∇y``, ``d = ∇x``. Nothing is transposed on the device.

These functions only lower on CUDA (the ``jax_sparse24_cutlass_*`` FFI targets); callers pick them
with ``lax.platform_dependent`` (see :func:`jax_sparse24._src.ffi.per_platform`). Every argument is
checked at trace time and a violation raises ``ValueError`` naming the constraint; the C++
handlers check again.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import ffi as _ffi

__all__ = [
    "cutlass_alignment",
    "cutlass_compress",
    "cutlass_compressed_shapes",
    "cutlass_configs",
    "cutlass_configs_kn",
    "cutlass_default_config",
    "cutlass_default_config_kn",
    "cutlass_spmm",
    "cutlass_spmm_kn",
    "cutlass_supports",
    "cutlass_supports_kn",
]

#: The extension's dtype codes of a compressed operand (``cutlass_compressed_shapes``, the compressor).
_DTYPE_CODES = {jnp.dtype(jnp.bfloat16): 0, jnp.dtype(jnp.float16): 1, jnp.dtype(jnp.float8_e4m3fn): 2}
#: dtypes of the 16-bit sparse GEMMs of this module (fp8: :mod:`jax_sparse24._src.cuda_fp8_ops`).
_GEMM_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _dtype_code(dtype, op: str, *, gemm: bool = True) -> int:
    """The extension's code of ``dtype``; ``gemm``: only the 16-bit GEMM dtypes (float8_e4m3fn is a
    compressor/shape dtype here; its GEMM is ``cuda_fp8_ops.cutlass_spmm_fp8``)."""
    d = jnp.dtype(dtype)
    if gemm and d not in _GEMM_DTYPES:
        raise ValueError(f"{op}: the CUTLASS sparse GEMM supports bfloat16 and float16, got dtype {d}"
                         + (" (fp8 operands: jax_sparse24._src.cuda_fp8_ops.cutlass_spmm_fp8)"
                            if d == jnp.dtype(jnp.float8_e4m3fn) else ""))
    if d not in _DTYPE_CODES:
        raise ValueError(f"{op}: supports bfloat16, float16 and float8_e4m3fn, got dtype {d}")
    return _DTYPE_CODES[d]


@functools.lru_cache(maxsize=None)
def cutlass_configs() -> tuple[str, ...]:
    """Names of the compiled kernel configurations; the index is the ``config`` argument."""
    return tuple(_ffi.require_extension().cutlass_configs())


@functools.lru_cache(maxsize=None)
def cutlass_configs_kn() -> tuple[str, ...]:
    """Names of the compiled "kn" configurations (``b`` stored (k, n): :func:`cutlass_spmm_kn`).

    Empty in the minimal (CI) build.
    """
    return tuple(_ffi.require_extension().cutlass_configs_kn())


@functools.lru_cache(maxsize=None)
def cutlass_default_config_kn(m: int, n: int, k: int) -> int:
    """Config id :func:`cutlass_spmm_kn` runs for ``config=-1`` (-1 when none is compiled)."""
    return int(_ffi.require_extension().cutlass_default_config_kn(int(m), int(n), int(k)))


@functools.lru_cache(maxsize=None)
def cutlass_alignment() -> tuple[int, int, int]:
    """``(m, n, k)`` divisibility the CUTLASS sparse GEMM requires."""
    return tuple(int(v) for v in _ffi.require_extension().cutlass_alignment())


@functools.lru_cache(maxsize=None)
def cutlass_default_config(m: int, n: int, k: int) -> int:
    """Config id the measured table picks for D(m×n) = A(m×k, 2:4)·B(k×n) (what ``config=-1`` runs)."""
    return int(_ffi.require_extension().cutlass_default_config(int(m), int(n), int(k)))


@functools.lru_cache(maxsize=None)
def _compressed_shapes(m: int, k: int, code: int):
    ext = _ffi.require_extension()
    try:
        values, meta = ext.cutlass_compressed_shapes(m, k, code)
    except ValueError as e:
        raise ValueError(f"cutlass_compressed_shapes(m={m}, k={k}): {e}") from None
    return tuple(int(v) for v in values), tuple(int(v) for v in meta)


def cutlass_compressed_shapes(m: int, k: int, dtype) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes ``(values_shape, meta_shape)`` of the compressed form of an (m, k) 2:4 operand.

    ``values`` has the operand's dtype, ``meta`` is uint8. Both are opaque blocked layouts that only
    the CUTLASS kernels read (the metadata is padded to 64 rows and 128 logical columns). Example:
    m=3072, k=768, bfloat16 -> ((3072, 384), (3072, 96)). ``dtype`` float8_e4m3fn: the fp8 layout
    (metadata ``(round_up(m, 64), round_up(k, 128) / 8)``).

    Raises:
      ValueError: unsupported dtype, a dtype not compiled in this build, or misaligned m / k.
    """
    return _compressed_shapes(int(m), int(k), _dtype_code(dtype, "cutlass_compressed_shapes", gemm=False))


def cutlass_supports(m: int, n: int, k: int, dtype) -> bool:
    """True when the extension is built and the kernels handle this (m, n, k, dtype).

    Does not check for a GPU: the dispatch (``lax.platform_dependent``) does.
    """
    if _ffi.extension() is None or jnp.dtype(dtype) not in _GEMM_DTYPES:
        return False
    am, an, ak = cutlass_alignment()
    if min(m, n, k) <= 0 or m % am or n % an or k % ak or max(m, n, k) >= 2**31 - 256:
        return False
    try:
        cutlass_compressed_shapes(m, k, dtype)
    except ValueError:  # e.g. float16 in a minimal build
        return False
    return True


def cutlass_supports_kn(m: int, n: int, k: int, dtype) -> bool:
    """:func:`cutlass_supports` for the "kn" formulation (also needs a compiled "kn" configuration)."""
    return cutlass_supports(m, n, k, dtype) and len(cutlass_configs_kn()) > 0


def cutlass_compress(a):
    """Compress an (m, k) operand that is already 2:4 along k into CUTLASS's SM90 layout.

    Args:
      a: (m, k) bfloat16, float16 or float8_e4m3fn array in which every group of 4 consecutive
        elements along k has at most two nonzeros (pass ``w * mask``). A group with more than two
        nonzeros gives an undefined result (not checked: that would cost a pass over ``a``). The
        float8_e4m3fn layout (for ``cuda_fp8_ops.cutlass_spmm_fp8``) needs k % 32 == 0 and m % 8 == 0
        and an extension built with the fp8 kernels.

    Returns:
      ``(values, meta)`` with the shapes of :func:`cutlass_compressed_shapes`.
    """
    op = "cutlass_compress"
    if np.ndim(a) != 2:
        raise ValueError(f"{op}: `a` must be 2-D (m, k), got shape {tuple(np.shape(a))}")
    m, k = (int(v) for v in np.shape(a))
    dtype = jnp.result_type(a)
    code = _dtype_code(dtype, op, gemm=False)
    if code == _DTYPE_CODES[jnp.dtype(jnp.float8_e4m3fn)] and (k % 32 or m % 8):
        raise ValueError(f"{op}: a float8_e4m3fn operand needs k % 32 == 0 and m % 8 == 0, got m={m}, k={k}")
    values_shape, meta_shape = _compressed_shapes(m, k, code)
    out_types = (
        jax.ShapeDtypeStruct(values_shape, dtype),
        jax.ShapeDtypeStruct(meta_shape, jnp.uint8),
    )
    values, meta = _ffi.ffi_call("jax_sparse24_cutlass_compress", out_types, a)
    return values, meta


#: Tile orders of the persistent scheduler: ``raster`` name -> the handler's code.
RASTERS = {"heuristic": 0, "m": 1, "n": 2}
#: Allowed ``swizzle`` values (output tiles per swizzle band of the scheduler).
SWIZZLES = (1, 2, 4, 8)


def _check_tile_order(op, raster, swizzle):
    if raster not in RASTERS:
        raise ValueError(f"{op}: raster must be one of {sorted(RASTERS)}, got {raster!r}")
    if isinstance(swizzle, bool) or not isinstance(swizzle, (int, np.integer)) or swizzle not in SWIZZLES:
        raise ValueError(f"{op}: swizzle must be one of {SWIZZLES}, got {swizzle!r}")
    return RASTERS[raster], int(swizzle)


def _check_spmm(op, values, meta, b, m, k, n, config, names):
    dtype = jnp.result_type(b)
    code = _dtype_code(dtype, op)
    if jnp.result_type(values) != dtype:
        raise ValueError(
            f"{op}: `values` and `b` must have the same dtype, got {jnp.result_type(values)} and {dtype}"
        )
    if jnp.result_type(meta) != jnp.uint8:
        raise ValueError(f"{op}: `meta` must be uint8, got {jnp.result_type(meta)}")
    am, an, ak = cutlass_alignment()
    if m <= 0 or n <= 0 or k <= 0 or m % am or n % an or k % ak:
        raise ValueError(
            f"{op}: the CUTLASS sparse GEMM needs m % {am} == 0, n % {an} == 0, k % {ak} == 0 "
            f"(all positive), got m={m}, n={n}, k={k}"
        )
    values_shape, meta_shape = _compressed_shapes(m, k, code)
    if tuple(np.shape(values)) != values_shape:
        raise ValueError(
            f"{op}: `values` must have the compressed shape {values_shape} for m={m}, k={k}, "
            f"got {tuple(np.shape(values))}"
        )
    if tuple(np.shape(meta)) != meta_shape:
        raise ValueError(
            f"{op}: `meta` must have the compressed shape {meta_shape} for m={m}, k={k}, "
            f"got {tuple(np.shape(meta))}"
        )
    config = int(config)
    if not names:
        raise ValueError(f"{op}: no configuration of this formulation is compiled in this (minimal) build")
    if not -1 <= config < len(names):
        raise ValueError(
            f"{op}: config must be -1 (default) or in [0, {len(names)}) (compiled: {list(names)}), "
            f"got {config}"
        )
    return dtype, config


def _spmm_call(target: str, values, meta, b, dtype, m: int, n: int, k: int, config: int, raster: int,
               swizzle: int):
    """The custom call of both sparse-GEMM formulations (arguments already checked): d (n, m)."""
    return _ffi.ffi_call(target, jax.ShapeDtypeStruct((n, m), dtype), values, meta, b,
                         m=np.int64(m), n=np.int64(n), k=np.int64(k), config=np.int64(config),
                         raster=np.int64(raster), swizzle=np.int64(swizzle))


def cutlass_spmm(values, meta, b, *, m: int, k: int, config: int = -1, raster: str = "heuristic",
                 swizzle: int = 1):
    """``d (n, m) = b (n, k) @ A.T`` with A (m, k) 2:4 along k, given as ``cutlass_compress(A)``.

    Args:
      values, meta: the compressed A (:func:`cutlass_compress`).
      b: (n, k) array of A's dtype (bfloat16 or float16), read in place as a K-major K×N matrix.
      m, k: A's logical shape.
      config: kernel configuration id (index into :func:`cutlass_configs`), or -1 for the
        measured default for this shape (:func:`cutlass_default_config`).
      raster, swizzle: order in which the persistent kernel walks the output tiles (a tuning knob:
        L2 reuse of the operands; the result is the same). ``raster`` "heuristic" (CUTLASS's
        choice from the tile counts), "m" or "n"; ``swizzle`` 1, 2, 4 or 8 tiles per band. The
        defaults are CUTLASS's.

    Returns:
      (n, m) array of b's dtype (fp32 accumulation).
    """
    op = "cutlass_spmm"
    if np.ndim(b) != 2:
        raise ValueError(f"{op}: `b` must be 2-D (n, k), got shape {tuple(np.shape(b))}")
    n, kb = (int(v) for v in np.shape(b))
    m, k = int(m), int(k)
    if kb != k:
        raise ValueError(f"{op}: `b` must have shape (n, k) with k={k}, got shape {(n, kb)}")
    dtype, config = _check_spmm(op, values, meta, b, m, k, n, config, cutlass_configs())
    r, s = _check_tile_order(op, raster, swizzle)
    return _spmm_call("jax_sparse24_cutlass_spmm", values, meta, b, dtype, m, n, k, config, r, s)


def cutlass_spmm_kn(values, meta, b, *, m: int, k: int, config: int = -1, raster: str = "heuristic",
                    swizzle: int = 1):
    """``d (n, m) = b (k, n).T @ A.T`` with A (m, k) 2:4 along k — ``b`` stored (k, n), N-major.

    The weight-gradient formulation: ``∇W (I, O) = xᵀ · G`` with ``G = MVUE(∇y)`` (T, O) 2:4 along
    T is ``cutlass_spmm_kn(*compress(Gᵀ), x, m=O, k=T)`` (``b = x`` (T, I) read in place,
    ``d = ∇W`` in Flax layout). Configurations: :func:`cutlass_configs_kn`; ``raster`` and
    ``swizzle`` as in :func:`cutlass_spmm`.

    Returns:
      (n, m) array of b's dtype (fp32 accumulation).
    """
    op = "cutlass_spmm_kn"
    if np.ndim(b) != 2:
        raise ValueError(f"{op}: `b` must be 2-D (k, n), got shape {tuple(np.shape(b))}")
    kb, n = (int(v) for v in np.shape(b))
    m, k = int(m), int(k)
    if kb != k:
        raise ValueError(f"{op}: `b` must have shape (k, n) with k={k}, got shape {(kb, n)}")
    dtype, config = _check_spmm(op, values, meta, b, m, k, n, config, cutlass_configs_kn())
    r, s = _check_tile_order(op, raster, swizzle)
    return _spmm_call("jax_sparse24_cutlass_spmm_kn", values, meta, b, dtype, m, n, k, config, r, s)
