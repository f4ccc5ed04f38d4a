"""cuSPARSELt 2:4 sparse GEMM (CUDA only): the second sparse backend, ``backend="cusparselt"``.

Same formulation as the CUTLASS kernels — every array row-major, ``d (n, m) = A (m×k, 2:4 along
k) · B`` — with the operands read in place in either orientation:

* ``a_layout``: :data:`A_MK` (A stored (m, k), e.g. ``W̃`` for ``∇x``) or :data:`A_KM` (A stored
  (k, m), e.g. ``W̃`` (I, O) for ``y`` or ``MVUE(∇y)`` (T, O) for ``∇W``);
* ``b_layout``: :data:`B_NK` (B stored (n, k): ``x`` for ``y``, ``∇y`` for ``∇x``) or :data:`B_KN`
  (B stored (k, n): ``x`` (T, I) for ``∇W``).

:func:`cusparselt_compress` turns the dense 2:4 operand into cuSPARSELt's opaque compressed bytes
(``cusparseLtSpMMACompress``), :func:`cusparselt_spmm` multiplies. One handle per device and one
plan per (shape, dtype, layouts) are created once and cached in the extension; the algorithm is
chosen once per plan by ``cusparseLtMatmulSearch`` (first call).

:func:`fused_compress_ok` says whether our fused one-pass compressors
(:mod:`jax_sparse24._src.cuda_compress_ops` with ``layout="cusparselt"``) write this library's
compressed operand for a plan; the GEMM paths then use them instead of ``cusparseLtSpMMACompress``
(0.1–0.3 TB/s). The library is loaded at first use
from the ``nvidia-cusparselt-cu13`` wheel; without it, requesting the backend raises
``RuntimeError`` naming what is missing.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import ffi as _ffi

__all__ = [
    "A_KM",
    "A_MK",
    "B_KN",
    "B_NK",
    "cusparselt_available",
    "cusparselt_compress",
    "cusparselt_compressed_size",
    "cusparselt_error",
    "cusparselt_plans",
    "cusparselt_spmm",
    "cusparselt_supports",
    "fused_compress_ok",
    "require_cusparselt",
]

A_MK, A_KM = 0, 1
B_NK, B_KN = 0, 1
ALIGN = 16  # m, n, k multiples of 16

_DTYPE_CODES = {jnp.dtype(jnp.bfloat16): 0, jnp.dtype(jnp.float16): 1}

#: Set to ``1`` to allow float16 GEMMs (for example with another cuSPARSELt version); see
#: :func:`float16_gemm_error`.
FLOAT16_ENV = "JAX_SPARSE24_CUSPARSELT_FLOAT16"


def float16_gemm_error(dtype) -> str | None:
    """Why a float16 cuSPARSELt GEMM is refused (``None`` for other dtypes or with :data:`FLOAT16_ENV`).

    On the H100 with nvidia-cusparselt-cu13 0.8.1, float16 GEMMs return wrong values (garbage or
    NaN, the right shape) for some plans, on operands the library compressed itself — e.g.
    (m, n, k) = (384, 272, 256) with A stored (k, m) and (256, 272, 384) with A stored (m, k)
    (tests/test_gpu_spmm.py, run with the variable set); bfloat16 is right on every plan tested.
    float16 compression (``cusparselt_compress``) is right and stays available.
    """
    if jnp.dtype(dtype) != jnp.dtype(jnp.float16) or os.environ.get(FLOAT16_ENV, "") == "1":
        return None
    return (f"cuSPARSELt float16 GEMMs are disabled: cuSPARSELt 0.8.1 returned wrong values for float16 on some "
            f"shapes on the H100 (bfloat16 is right); use bfloat16, or backend='cutlass' for float16 "
            f"(set {FLOAT16_ENV}=1 to try another cuSPARSELt version)")


def _wheel_lib_dirs() -> list[str]:
    try:
        import nvidia.cusparselt as m  # namespace package of the nvidia-cusparselt-cu13 wheel
    except ImportError:
        return []
    return [os.path.join(p, "lib") for p in getattr(m, "__path__", [])]


@functools.lru_cache(maxsize=None)
def _load() -> tuple[bool, str]:
    ext = _ffi.extension()
    if ext is None:
        return False, _ffi.extension_error() or "the CUDA extension is not built"
    if not hasattr(ext, "cusparselt_load"):
        return False, "this build of the extension has no cuSPARSELt backend"
    msg = ""
    for hint in _wheel_lib_dirs() + [""]:
        ok, msg = ext.cusparselt_load(hint)
        if ok:
            return True, msg
    return False, msg


def cusparselt_available() -> bool:
    """True when the extension is built and libcusparseLt loads (does not check for a GPU)."""
    return _load()[0]


def cusparselt_error() -> str | None:
    """Why the backend is unavailable (``None`` when it is)."""
    ok, msg = _load()
    return None if ok else msg


def require_cusparselt():
    if not cusparselt_available():
        raise RuntimeError(f"backend='cusparselt' is unavailable: {cusparselt_error()}")


def cusparselt_supports(m: int, n: int, k: int, dtype) -> bool:
    """Shape/dtype check of the backend (bfloat16 — float16 only with :data:`FLOAT16_ENV`, see
    :func:`float16_gemm_error` — m, n, k positive multiples of 16) and availability."""
    if jnp.dtype(dtype) not in _DTYPE_CODES or float16_gemm_error(dtype):
        return False
    if min(m, n, k) <= 0 or m % ALIGN or n % ALIGN or k % ALIGN:
        return False
    return cusparselt_available()


def _gpu_device_id() -> int:
    devs = [d for d in jax.local_devices() if d.platform == "gpu"]
    if not devs:
        raise RuntimeError("backend='cusparselt' needs a CUDA GPU")
    return int(getattr(devs[0], "local_hardware_id", devs[0].id))


@functools.lru_cache(maxsize=None)
def _compressed_size(m, n, k, code, a_layout, b_layout) -> int:
    require_cusparselt()
    ext = _ffi.require_extension()
    try:
        return int(ext.cusparselt_compressed_size(_gpu_device_id(), m, n, k, code, a_layout, b_layout))
    except ValueError as e:
        raise ValueError(f"cusparselt (m={m}, n={n}, k={k}, a_layout={a_layout}, b_layout={b_layout}): {e}") from None


def cusparselt_compressed_size(m: int, n: int, k: int, dtype, a_layout: int, b_layout: int) -> int:
    """Bytes of cuSPARSELt's compressed A for this plan (creates and caches the plan on the first GPU)."""
    return _compressed_size(int(m), int(n), int(k), _code(dtype), int(a_layout), int(b_layout))


def cusparselt_plans():
    """The cached plans: ``(device, m, n, k, dtype, a_layout, b_layout, searched, alg_config_id)``."""
    return list(_ffi.require_extension().cusparselt_plans())


def _code(dtype) -> int:
    d = jnp.dtype(dtype)
    if d not in _DTYPE_CODES:
        raise ValueError(f"cusparselt: bfloat16 and float16 only, got {d}")
    return _DTYPE_CODES[d]


def _check_dims(op, m, n, k, a_layout, b_layout):
    if min(m, n, k) <= 0 or m % ALIGN or n % ALIGN or k % ALIGN:
        raise ValueError(f"{op}: m, n, k must be positive multiples of {ALIGN}, got m={m}, n={n}, k={k}")
    if a_layout not in (A_MK, A_KM) or b_layout not in (B_NK, B_KN):
        raise ValueError(f"{op}: a_layout must be A_MK/A_KM and b_layout B_NK/B_KN, got {a_layout}, {b_layout}")


def _attrs(m, n, k, a_layout, b_layout):
    return dict(m=np.int64(m), n=np.int64(n), k=np.int64(k), a_layout=np.int64(a_layout),
                b_layout=np.int64(b_layout))


def cusparselt_compress(a, *, m: int, n: int, k: int, a_layout: int, b_layout: int = B_NK):
    """Compress the dense 2:4 operand ``a`` (2:4 along k) for :func:`cusparselt_spmm` with the same plan.

    Args:
      a: (m, k) for ``A_MK`` or (k, m) for ``A_KM``, bfloat16/float16, at most 2 nonzeros per group
        of 4 along k.
      m, n, k, a_layout, b_layout: the plan (n and b_layout too: cuSPARSELt's compressed form belongs
        to a plan).

    Returns:
      1-D uint8 array (:func:`cusparselt_compressed_size` bytes).
    """
    op = "cusparselt_compress"
    m, n, k, a_layout, b_layout = int(m), int(n), int(k), int(a_layout), int(b_layout)
    _check_dims(op, m, n, k, a_layout, b_layout)
    want = (m, k) if a_layout == A_MK else (k, m)
    if tuple(np.shape(a)) != want:
        raise ValueError(f"{op}: `a` must have shape {want} for m={m}, k={k}, a_layout={a_layout}, got {np.shape(a)}")
    size = cusparselt_compressed_size(m, n, k, jnp.result_type(a), a_layout, b_layout)
    return _ffi.ffi_call("jax_sparse24_cusparselt_compress", jax.ShapeDtypeStruct((size,), jnp.uint8), a,
                         **_attrs(m, n, k, a_layout, b_layout))


def cusparselt_spmm(compressed, b, *, m: int, n: int, k: int, a_layout: int, b_layout: int = B_NK):
    """``d (n, m) = A·B`` with A given by :func:`cusparselt_compress` (same m, n, k and layouts).

    Args:
      b: (n, k) for ``B_NK`` or (k, n) for ``B_KN``, A's dtype.

    Returns:
      (n, m) array of b's dtype (fp32 accumulation).
    """
    op = "cusparselt_spmm"
    m, n, k, a_layout, b_layout = int(m), int(n), int(k), int(a_layout), int(b_layout)
    _check_dims(op, m, n, k, a_layout, b_layout)
    want = (n, k) if b_layout == B_NK else (k, n)
    if tuple(np.shape(b)) != want:
        raise ValueError(f"{op}: `b` must have shape {want} for n={n}, k={k}, b_layout={b_layout}, got {np.shape(b)}")
    dtype = jnp.result_type(b)
    refused = float16_gemm_error(dtype)
    if refused:
        raise ValueError(f"{op}: {refused}")
    size = cusparselt_compressed_size(m, n, k, dtype, a_layout, b_layout)
    if tuple(np.shape(compressed)) != (size,) or jnp.result_type(compressed) != jnp.uint8:
        raise ValueError(f"{op}: `compressed` must be uint8 of shape ({size},) (cusparselt_compress of the same "
                         f"plan), got {jnp.result_type(compressed)} {np.shape(compressed)}")
    return _ffi.ffi_call("jax_sparse24_cusparselt_spmm", jax.ShapeDtypeStruct((n, m), dtype), compressed, b,
                         **_attrs(m, n, k, a_layout, b_layout))


@functools.lru_cache(maxsize=None)
def _fused_compress_check(m: int, n: int, k: int, dtype_name: str, b_layout: int) -> bool:
    from jax_sparse24._src import cuda_compress_ops as cc

    dtype = jnp.dtype(dtype_name)
    if m % 64 or k % 32 or cusparselt_compressed_size(m, n, k, dtype, A_MK, b_layout) != cc.lt_compressed_bytes(m, k):
        return False
    with jax.ensure_compile_time_eval():
        # a 2:4 operand with exactly two nonzeros (|a| in [1, 2)) in every group: no corner cases
        # whose encoding may legitimately differ between compressors
        ka, kp, kd = jax.random.split(jax.random.key(2024), 3)
        mag = 1.0 + jax.random.uniform(ka, (m, k // 4, 4))
        sign = jnp.where(jax.random.bernoulli(kp, 0.5, (m, k // 4, 4)), 1.0, -1.0)
        first = jax.random.randint(kp, (m, k // 4, 1), 0, 4)
        second = (first + jax.random.randint(kd, (m, k // 4, 1), 1, 4)) % 4
        lane = jnp.arange(4)
        mask = ((lane == first) | (lane == second)).reshape(m, k)
        a = (sign * mag).reshape(m, k).astype(dtype)
        theirs = cusparselt_compress(a * mask, m=m, n=n, k=k, a_layout=A_MK, b_layout=b_layout)
        ours = cc.masked_compress(a, mask, transposed=False, layout="cusparselt")
        return bool(jnp.array_equal(theirs, ours))


_warned: set = set()


def fused_compress_ok(m: int, n: int, k: int, dtype, b_layout: int = B_NK) -> bool:
    """True when our fused compressors produce cuSPARSELt's compressed ``A`` (m, k), stored (m, k)
    (``A_MK``), for the plan (m, n, k, dtype, ``b_layout``) bit for bit (bfloat16 only for now).

    cuSPARSELt does not document its compressed format. Ours follows what ``cusparseLtSpMMACompress``
    writes (``xla_ffi/compress_layout.h``), and this function checks it once per plan on the GPU:
    both compressors run on the same random 2:4 operand and the bytes are compared (at trace time, a
    few milliseconds). On a mismatch (another cuSPARSELt version) it warns once and returns False,
    and the GEMM paths fall back to ``cusparseLtSpMMACompress``.
    """
    require_cusparselt()
    name = jnp.dtype(dtype).name
    if name != "bfloat16":
        # float16 GEMMs are refused by default (float16_gemm_error: wrong values on some plans with
        # cuSPARSELt 0.8.1), and where they are allowed they keep the library's compressor.
        return False
    ok = _fused_compress_check(int(m), int(n), int(k), name, int(b_layout))
    if not ok and (m % 64 == 0 and k % 32 == 0) and "layout" not in _warned:
        import warnings

        _warned.add("layout")
        warnings.warn(f"cuSPARSELt's compressed operand (m={m}, k={k}, {name}) differs from the layout "
                      "jax_sparse24's fused compressors write (another cuSPARSELt version?): falling back to "
                      "cusparseLtSpMMACompress, which is slower", RuntimeWarning, stacklevel=2)
    return ok
