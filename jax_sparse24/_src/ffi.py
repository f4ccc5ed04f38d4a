"""Loading the optional CUDA extension and dispatching an op to its CUDA or reference lowering.

The extension ``jax_sparse24._sparse24_ffi`` (built from ``xla_ffi/``) hands XLA FFI handlers to
Python as capsules; they are registered for platform ``"CUDA"`` the first time they are needed.
Every op has exactly one definition — the reference in ``reference_ops.py`` — and, where a kernel
exists, a CUDA lowering of the same math. :func:`per_platform` picks between them at lowering
time with ``lax.platform_dependent``, so a jitted function lowers to the kernel on a GPU and to
the reference on a CPU from the same trace.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
from jax import lax

__all__ = [
    "extension",
    "extension_error",
    "cuda_kernels_available",
    "per_platform",
    "ffi_call",
    "require_extension",
]

#: Set to :data:`KERNELS_OFF` to never use the CUDA kernels (debugging, A/B comparisons).
BACKEND_ENV = "JAX_SPARSE24_BACKEND"
#: The value of :data:`BACKEND_ENV` that turns the CUDA lowerings off: every op lowers to its reference.
KERNELS_OFF = "reference"


@functools.lru_cache(maxsize=None)
def _load():
    try:
        from jax_sparse24 import _sparse24_ffi  # type: ignore[attr-defined]
    except ImportError as e:  # not built (no nvcc at install time) or not loadable
        return None, f"the CUDA extension jax_sparse24._sparse24_ffi is not available ({e})"
    for name, capsule in _sparse24_ffi.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    return _sparse24_ffi, None


def extension():
    """The loaded extension module with its FFI targets registered, or ``None``."""
    return _load()[0]


def extension_error() -> str | None:
    """Why the extension is unavailable (``None`` when it loaded)."""
    return _load()[1]


def require_extension():
    """The extension, or a ``RuntimeError`` saying why it is missing and how to build it."""
    ext, err = _load()
    if ext is None:
        raise RuntimeError(
            f"jax_sparse24: {err}. Reinstall on a machine with nvcc 13 and a CUDA-enabled jaxlib: "
            "JAX_SPARSE24_CUDA=ON pip install -e '.[gpu]' (see docs/gpu.md)."
        )
    return ext


@functools.lru_cache(maxsize=None)
def _gpu_present() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def cuda_kernels_available() -> bool:
    """True when the extension is built, a CUDA device is visible and kernels are not disabled."""
    if os.environ.get(BACKEND_ENV, "").lower() == KERNELS_OFF:
        return False
    return _gpu_present() and extension() is not None


def per_platform(reference_fn: Callable[..., Any], cuda_fn: Callable[..., Any] | None, *args, barrier: bool = False):
    """Apply ``reference_fn`` on CPU (and any non-CUDA platform) and ``cuda_fn`` on CUDA.

    ``cuda_fn`` is ``None`` when no kernel handles these arguments (shape, dtype, or the extension
    is missing); then the reference runs everywhere. Both functions must compute the same math.

    ``barrier=True`` passes the CUDA result through ``lax.optimization_barrier``, for the GEMMs whose output a
    layer returns (forward, input gradient): XLA's GPU dynamic-slice fusion clones a custom call into the
    ``dynamic-update-slice`` that writes its result into a stacked buffer (a scan's saved residuals) and keeps
    the original for its other users, so the kernel runs twice. Every 2:4 forward GEMM whose output a remat
    policy keeps (``checkpoint_policy``) ran twice so: LLaMA-7B's srste step under ``--remat dots`` ran 15
    sparse GEMMs per layer instead of 12 (``scripts/probe_remat_hlo.py`` counts them). Not for results with a
    single user, such as a scanned weight gradient, whose fusion into its stacked buffer saves a copy.
    """
    if cuda_fn is None or not cuda_kernels_available():
        return reference_fn(*args)
    if barrier:
        cuda_fn = _behind_barrier(cuda_fn)
    return lax.platform_dependent(*args, default=reference_fn, cuda=cuda_fn)


def _behind_barrier(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args):
        return lax.optimization_barrier(fn(*args))

    return wrapped


def ffi_call(target: str, result_shape_dtypes, *args, vmap_method: str | None = "sequential", **attrs):
    """``jax.ffi.ffi_call`` of one of our targets (registering the extension first).

    Inside ``shard_map`` (``check_vma=True``) the operands are cast to vary over the union of their
    manual axes and the results are typed as varying over it too: ``jax.ffi.ffi_call`` returns
    results that vary over no axis, so the CUDA branch of ``lax.platform_dependent`` would not type
    like the reference branch (a trace-time ``TypeError``), and a kernel's output is a per-shard value.
    """
    require_extension()
    args = vary_to_union(*args)
    out = jax.ffi.ffi_call(target, result_shape_dtypes, vmap_method=vmap_method)(*args, **attrs)
    axes = frozenset().union(*(_varying_axes(a) for a in args if a is not None))
    return jax.tree.map(lambda y: _vary(y, axes), out) if axes else out


def _varying_axes(x) -> frozenset:
    """Manual mesh axes ``x`` varies over inside ``shard_map`` (empty outside)."""
    try:
        aval = jax.typeof(x)
    except Exception:  # pragma: no cover
        return frozenset()
    vma = getattr(aval, "vma", None)  # jax 0.6–0.9
    if vma is None:  # jax 0.10+: ManualAxisType
        mat = getattr(aval, "manual_axis_type", None)
        vma = getattr(mat, "varying", None)
    return frozenset(vma or ())


def _vary(x, axes: frozenset):
    """``x`` cast to vary over ``axes`` too (``pcast(..., to='varying')``)."""
    missing = tuple(sorted(axes - _varying_axes(x)))
    if not missing:
        return x
    if hasattr(lax, "pcast"):  # jax 0.10+
        return lax.pcast(x, missing, to="varying")
    return lax.pvary(x, missing)  # pragma: no cover - jax < 0.10


def vary_to_union(*xs):
    """Inside ``shard_map``: cast each array to vary over the union of the arrays' varying mesh axes.

    A ``custom_vjp`` op (``sparse24_linear``) whose operands vary over different manual axes
    (tokens over ``data``, the weight over ``model``) would return a weight cotangent varying over
    ``data`` too, which JAX rejects. Casting the operands first (``pcast(..., to='varying')``, the
    implicit broadcast JAX inserts for primitive ops) makes the cotangents match, and JAX's
    transpose of the cast is the ``psum`` over ``data`` — the data-parallel gradient reduction.
    ``None`` entries pass through; outside ``shard_map`` this is the identity.
    """
    axes = frozenset().union(*(_varying_axes(x) for x in xs if x is not None))
    if not axes:
        return xs
    return tuple(None if x is None else _vary(x, axes) for x in xs)
