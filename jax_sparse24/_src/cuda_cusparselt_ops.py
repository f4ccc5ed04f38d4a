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
(0.1–0.3 TB/s). The library is loaded at first use from the ``nvidia-cusparselt-cu13`` wheel
(:func:`library_candidates`: either wheel layout, then the system) and its version read
(:func:`cusparselt_version`; supported: :data:`SUPPORTED_VERSIONS`); without it, requesting the
backend raises ``RuntimeError`` naming every place searched.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import os
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import cuda_compress_ops as _cc
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
    "cusparselt_library",
    "cusparselt_version",
    "library_candidates",
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


# --- Finding the library and its version -------------------------------------------------------
#: The pip distribution of the library (pyproject.toml's ``gpu`` extra pins its supported range).
WHEEL = "nvidia-cusparselt-cu13"
LIB_NAME = "libcusparseLt.so.0"
#: Where the wheels put the library, relative to site-packages: 0.8.x, then 0.10.x (the shared
#: ``nvidia/cu13`` tree of the CUDA 13 wheels).
WHEEL_LIB_DIRS = ("nvidia/cusparselt/lib", "nvidia/cu13/lib")
#: A file or directory to load the library from before any other place.
LIB_ENV = "JAX_SPARSE24_CUSPARSELT_LIB"
#: Versions supported, ``[low, high)``: 0.8.0 had H100 regressions fixed in 0.8.1; 0.10 keeps the
#: API subset used here (``xla_ffi/spmm_cusparselt.cu``). Same range as pyproject.toml's ``gpu`` extra.
SUPPORTED_VERSIONS = ((0, 8, 1), (0, 11, 0))


@dataclasses.dataclass(frozen=True)
class LibraryCandidate:
    """One place :func:`library_candidates` looks for ``libcusparseLt.so.0``."""

    path: str  #: a file, or the bare soname for the dynamic loader's own search
    source: str  #: where the path comes from (environment variable, wheel, system)
    version: str | None = None  #: the wheel's version (its metadata) when the file belongs to one


def parse_version(text) -> tuple[int, int, int]:
    """``"0.10.0"`` -> ``(0, 10, 0)`` (missing parts are 0; a local/pre-release suffix is ignored)."""
    parts = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if parts is None:
        raise ValueError(f"not a cuSPARSELt version: {text!r}")
    return tuple(int(p or 0) for p in parts.groups())  # type: ignore[return-value]


def version_string(v) -> str:
    return ".".join(str(p) for p in v)


def version_supported(v) -> bool:
    """Whether version ``v`` (string or tuple) lies in :data:`SUPPORTED_VERSIONS`."""
    lo, hi = SUPPORTED_VERSIONS
    return lo <= (parse_version(v) if isinstance(v, str) else tuple(v)) < hi


def library_candidates(paths=None, environ=None) -> list[LibraryCandidate]:
    """Where ``libcusparseLt.so.0`` is looked for, in order.

    1. ``$JAX_SPARSE24_CUSPARSELT_LIB`` (a file, or a directory holding the library);
    2. the installed ``nvidia-cusparselt-cu13`` wheel: the library file its RECORD lists, whatever
       the layout, with the wheel's version;
    3. the wheels' known layouts (:data:`WHEEL_LIB_DIRS`: 0.8.x ``nvidia/cusparselt/lib``, 0.10.x
       ``nvidia/cu13/lib``) under every ``paths`` entry (e.g. a wheel unpacked without metadata);
    4. the dynamic loader's search (``LD_LIBRARY_PATH``, ``ld.so.cache``).

    ``paths``: the directories to search (default ``sys.path``); ``environ``: default ``os.environ``.
    """
    paths = list(sys.path if paths is None else paths)
    environ = os.environ if environ is None else environ
    out: list[LibraryCandidate] = []
    seen: set = set()

    def add(path, source, version=None, *, must_exist=True):
        key = os.path.realpath(path) if os.sep in path else path
        if key in seen or (must_exist and not os.path.isfile(path)):
            return
        seen.add(key)
        out.append(LibraryCandidate(path, source, version))

    env = environ.get(LIB_ENV, "")
    if env:
        add(os.path.join(env, LIB_NAME) if os.path.isdir(env) else env, f"${LIB_ENV}", must_exist=False)
    for dist in importlib.metadata.distributions(name=WHEEL, path=paths):
        files = [f for f in (dist.files or ()) if os.path.basename(str(f)).startswith("libcusparseLt.so")]
        files.sort(key=lambda f: os.path.basename(str(f)) != LIB_NAME)  # the soname first
        for f in files:
            add(str(dist.locate_file(f)), f"{WHEEL} {dist.version} (wheel)", dist.version)
    for root in paths:
        for rel in WHEEL_LIB_DIRS:
            add(os.path.join(root or ".", *rel.split("/"), LIB_NAME), f"{rel} under {root or '.'}")
    add(LIB_NAME, "system (LD_LIBRARY_PATH, ld.so.cache)", must_exist=False)
    return out


def read_library_version(path: str) -> tuple[int, int, int] | None:
    """The version of the cuSPARSELt library at ``path`` (``cusparseLtGetProperty``; no GPU needed),
    or None when it cannot be loaded or read."""
    try:
        lib = ctypes.CDLL(path)
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int(-1)
            if lib.cusparseLtGetProperty(prop, ctypes.byref(v)) != 0 or v.value < 0:
                return None
            parts.append(v.value)
        return tuple(parts)  # type: ignore[return-value]
    except (OSError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class _Loaded:
    ok: bool
    message: str  # the path loaded, or why nothing was
    version: tuple | None = None
    version_source: str = ""
    candidate: LibraryCandidate | None = None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


@functools.lru_cache(maxsize=None)
def _load() -> _Loaded:
    ext = _ffi.extension()
    if ext is None:
        return _Loaded(False, _ffi.extension_error() or "the CUDA extension is not built")
    if not hasattr(ext, "cusparselt_load"):
        return _Loaded(False, "this build of the extension has no cuSPARSELt backend")
    candidates = library_candidates()
    msg = ""
    for c in candidates:
        ok, msg = ext.cusparselt_load(c.path)
        if not ok:
            continue
        loaded = msg
        cand = next((x for x in candidates if _same_file(x.path, loaded)), None)
        version, how = read_library_version(loaded), "cusparseLtGetProperty"
        if version is None and cand is not None and cand.version:
            version, how = parse_version(cand.version), f"{WHEEL} metadata"
        state = _Loaded(True, loaded, version, how if version else "", cand)
        _warn_unsupported(state)
        return state
    searched = "".join(f"\n  {c.path} ({c.source})" for c in candidates)
    return _Loaded(False, f"{msg}\nSearched, in order:{searched}\nInstall a supported version: "
                          f"pip install '{WHEEL}>={version_string(SUPPORTED_VERSIONS[0])},"
                          f"<{version_string(SUPPORTED_VERSIONS[1])}' (or the package's [gpu] extra)")


_warned: set = set()


def _warn_once(key: str, message: str, stacklevel: int = 3) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _warn_unsupported(state: _Loaded) -> None:
    lo, hi = (version_string(v) for v in SUPPORTED_VERSIONS)
    if state.version is None:
        _warn_once("version", f"jax_sparse24: could not read the version of the cuSPARSELt library {state.message}; "
                              f"supported: >={lo},<{hi}")
    elif not version_supported(state.version):
        _warn_once("version", f"jax_sparse24: cuSPARSELt {version_string(state.version)} ({state.message}) is outside "
                              f"the supported range >={lo},<{hi} (0.8.0 has H100 performance regressions; newer "
                              f"versions are untested): backend='cusparselt' may be slow or fail")


def cusparselt_available() -> bool:
    """True when the extension is built and libcusparseLt loads (does not check for a GPU)."""
    return _load().ok


def cusparselt_error() -> str | None:
    """Why the backend is unavailable (``None`` when it is)."""
    state = _load()
    return None if state.ok else state.message


def cusparselt_version() -> str | None:
    """Version of the loaded library (``"0.10.0"``; ``None`` when not loaded or unreadable)."""
    state = _load()
    return version_string(state.version) if state.ok and state.version else None


def cusparselt_library() -> dict:
    """What was loaded: ``{"loaded", "path" (or the error), "version", "version_source", "source"}``."""
    state = _load()
    return {"loaded": state.ok, "path" if state.ok else "error": state.message,
            "version": version_string(state.version) if state.version else None,
            "version_source": state.version_source or None,
            "source": state.candidate.source if state.candidate else None}


def table_version_matches(table_version: str | None) -> bool:
    """Whether measurements made with cuSPARSELt ``table_version`` (the autotune table's
    ``cusparselt_version``) hold for the loaded library: same major.minor. Algorithm ids and
    per-shape speed change between versions (0.8.0 had H100 regressions), so on a mismatch this warns
    once and returns False; ``backend="auto"`` then leaves cuSPARSELt out. A table without a version
    (made before it was recorded) matches."""
    if not table_version:
        return True
    loaded = cusparselt_version()
    if loaded is not None and parse_version(loaded)[:2] == parse_version(table_version)[:2]:
        return True
    _warn_once("table", f"jax_sparse24: the autotune table (spmm_autotune.json) measured cuSPARSELt {table_version}, "
                        f"but {'version ' + loaded if loaded else 'a library of unknown version'} is loaded "
                        f"({_load().message}): backend='auto' does not pick cuSPARSELt from those measurements "
                        "(CUTLASS or dense instead; backend='cusparselt' still runs it). Re-measure with "
                        "benchmarks/bench_spmm.py and bench_layer.py and rebuild the table with "
                        "benchmarks/make_autotune_table.py to use it.", stacklevel=4)
    return False


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
def _compressed_size(m, n, k, code, a_layout, b_layout, version) -> int:  # keyed on the library version
    require_cusparselt()
    ext = _ffi.require_extension()
    try:
        return int(ext.cusparselt_compressed_size(_gpu_device_id(), m, n, k, code, a_layout, b_layout))
    except ValueError as e:
        raise ValueError(f"cusparselt (m={m}, n={n}, k={k}, a_layout={a_layout}, b_layout={b_layout}): {e}") from None


def cusparselt_compressed_size(m: int, n: int, k: int, dtype, a_layout: int, b_layout: int) -> int:
    """Bytes of cuSPARSELt's compressed A for this plan (creates and caches the plan on the first GPU)."""
    return _compressed_size(int(m), int(n), int(k), _code(dtype), int(a_layout), int(b_layout), cusparselt_version())


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


#: The plans (m, n, k) on which :func:`fused_compress_ok` compares our compressor's bytes with
#: cuSPARSELt's: one 64-row tile, several row tiles with a k that is not a power of two, and a long k.
LAYOUT_PROBES = ((64, 64, 64), (192, 128, 160), (256, 64, 1024))


def _random_24_operand(key, m: int, k: int, dtype):
    """A random 2:4 operand with exactly two nonzeros (|a| in [1, 2)) in every group along k: no
    corner cases whose encoding may legitimately differ between compressors. Returns (a, mask)."""
    ka, kp, kd = jax.random.split(key, 3)
    mag = 1.0 + jax.random.uniform(ka, (m, k // 4, 4))
    sign = jnp.where(jax.random.bernoulli(kp, 0.5, (m, k // 4, 4)), 1.0, -1.0)
    first = jax.random.randint(kp, (m, k // 4, 1), 0, 4)
    second = (first + jax.random.randint(kd, (m, k // 4, 1), 1, 4)) % 4
    lane = jnp.arange(4)
    mask = ((lane == first) | (lane == second)).reshape(m, k)
    return (sign * mag).reshape(m, k).astype(dtype), mask


@functools.partial(jax.jit, static_argnames=("dtype_name", "b_layout"))
def _compressors_agree(key, *, dtype_name: str, b_layout: int):
    """One program: for every plan of :data:`LAYOUT_PROBES`, a random 2:4 operand compressed by
    cuSPARSELt and by ours; whether all bytes are equal."""
    agree = jnp.bool_(True)
    for j, (m, n, k) in enumerate(LAYOUT_PROBES):
        a, mask = _random_24_operand(jax.random.fold_in(key, j), m, k, jnp.dtype(dtype_name))
        theirs = cusparselt_compress(a * mask, m=m, n=n, k=k, a_layout=A_MK, b_layout=b_layout)
        ours = _cc.masked_compress(a, mask, transposed=False, layout="cusparselt")
        agree = agree & jnp.array_equal(theirs, ours)
    return agree


def _layout_fits(m: int, n: int, k: int, dtype_name: str, b_layout: int) -> bool:
    """The plan's shape suits our layout (m a multiple of 64, k of 32) and cuSPARSELt's compressed
    operand for it has our layout's size."""
    return (m % 64 == 0 and k % 32 == 0
            and cusparselt_compressed_size(m, n, k, jnp.dtype(dtype_name), A_MK, b_layout) == _cc.lt_compressed_bytes(m, k))


@functools.lru_cache(maxsize=None)
def _fused_layout_check(dtype_name: str, b_layout: int, version) -> bool:
    """Our compressor's bytes == the library's on :data:`LAYOUT_PROBES` (once per process, dtype,
    ``b_layout`` and library version; one small jitted program)."""
    if not all(_layout_fits(m, n, k, dtype_name, b_layout) for m, n, k in LAYOUT_PROBES):
        return False
    with jax.ensure_compile_time_eval():
        return bool(_compressors_agree(jax.random.key(2024), dtype_name=dtype_name, b_layout=b_layout))


@functools.lru_cache(maxsize=None)
def _fused_compress_check(m: int, n: int, k: int, dtype_name: str, b_layout: int, version) -> bool:
    """Our compressed operand is cuSPARSELt's for this plan: the plan fits our layout
    (:func:`_layout_fits`) and the bytes agree on the probe plans (:func:`_fused_layout_check`).

    This runs at trace time, often inside the partitioner's callback while XLA compiles a sharded
    program, so per plan it only asks the library for the compressed size; the bytes are compared
    once per process on the probes (``tests/test_gpu_compress.py`` compares them on every plan shape
    the library uses)."""
    return _layout_fits(m, n, k, dtype_name, b_layout) and _fused_layout_check(dtype_name, b_layout, version)


def fused_compress_ok(m: int, n: int, k: int, dtype, b_layout: int = B_NK) -> bool:
    """True when our fused compressors produce cuSPARSELt's compressed ``A`` (m, k), stored (m, k)
    (``A_MK``), for the plan (m, n, k, dtype, ``b_layout``) bit for bit (bfloat16 only for now).

    cuSPARSELt does not document its compressed format. Ours follows what ``cusparseLtSpMMACompress``
    writes (``xla_ffi/compress_layout.h``), and this function checks it on the GPU: the plan's
    compressed size must be ours, and both compressors run on random 2:4 operands of a few probe
    plans (:data:`LAYOUT_PROBES`, once per process) whose bytes must agree. On a mismatch (another
    cuSPARSELt version) it warns once and returns False, and the GEMM paths fall back to
    ``cusparseLtSpMMACompress``.
    """
    require_cusparselt()
    name = jnp.dtype(dtype).name
    if name != "bfloat16":
        # float16 GEMMs are refused by default (float16_gemm_error: wrong values on some plans with
        # cuSPARSELt 0.8.1), and where they are allowed they keep the library's compressor.
        return False
    ok = _fused_compress_check(int(m), int(n), int(k), name, int(b_layout), cusparselt_version())
    if not ok and (m % 64 == 0 and k % 32 == 0) and "layout" not in _warned:
        _warned.add("layout")
        warnings.warn(f"cuSPARSELt's compressed operand (m={m}, k={k}, {name}) differs from the layout "
                      "jax_sparse24's fused compressors write (another cuSPARSELt version?): falling back to "
                      "cusparseLtSpMMACompress, which is slower", RuntimeWarning, stacklevel=2)
    return ok
