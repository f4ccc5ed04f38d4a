"""The planner: which backend each GEMM of a 2:4 linear layer runs — :func:`resolve`, the one place
that decides, returns a backend object of :mod:`jax_sparse24._src.backends` — and the measured table
``backend="auto"`` reads (the GEMMs run in :mod:`jax_sparse24._src.gemm`, prepared weights in
:mod:`jax_sparse24._src.prepared_weight`, the fp8 GEMMs in :mod:`jax_sparse24._src.fp8_gemm`).

Requests (:data:`BACKENDS`): a backend's name runs that backend where it can run the GEMM
(:meth:`~jax_sparse24._src.backends.base.Backend.can_run`; a RuntimeError with its reason where it
cannot), and ``auto`` resolves per GEMM and shape from the measured table (``spmm_autotune.json``,
next to this file, made by ``benchmarks/make_autotune_table.py``):

* forward and input gradient (:func:`choose`, D(m×n) = A(m×k, 2:4)·B(k×n)): the nearest measured
  shape (log distance, same dtype) gives CUTLASS's speedup over XLA's dense GEMM with the per-call
  compression counted (or, for a weight prepared once for ``reuse`` calls, the preparation's
  share of it: :func:`amortized_speedup`), the compression's cost rescaled to the call's tokens;
  ``cutlass`` where it exceeds :data:`MIN_GAIN`, ``cusparselt`` where
  the table measured it (operand from our fused compressor) faster still, near this shape
  (:data:`CUSPARSELT_RADIUS`) and for the loaded library version (bfloat16), else ``dense``;
  :func:`weight_gemms_plan` is that choice for both GEMMs of a layer;
* MVUE weight gradient (:func:`choose_weight_grad`, the table's ``entries_kn``): the fused MVUE +
  compress + sparse GEMM against XLA's exact dense ``xᵀ·∇y``; :func:`weight_grad_path` says which
  path ``gemm.weight_grad_mvue`` takes (:class:`WeightGradPath`; the exact gradient with ``auto`` where no
  sparse path wins); :func:`fp8_weight_grad_backend` the fp8 one;
* fp8 (``fp8=True``, no measured table): the sparse fp8 kernel wherever it can run, else XLA's fp8 dot;
* :func:`cutlass_config` / :func:`lookup_weight_grad`: the CUTLASS configuration the table names.

:func:`choose`, :func:`choose_weight_grad` and :func:`weight_gemms_plan` are :func:`resolve` by name.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import NamedTuple

import jax.numpy as jnp

from jax_sparse24._src import backends, cuda_spmm_ops, ffi
from jax_sparse24._src.backends import CUSPARSELT, CUTLASS, DENSE, REFERENCE, Backend

__all__ = ["BACKENDS", "AUTO", "GEMMS", "resolve", "check_request", "fp8_refusal", "fp8_backends_for", "has_fp8_backend",
           "dense_for", "WeightGradPath", "fp8_weight_grad_backend", "FP8_WGRAD_TOKEN_ALIGN", "exact_weight_grad_label",
           "weight_gemms_backends", "kernel_config", "MIN_GAIN",
           "PREPARE_COST_SHARE", "CUSPARSELT_RADIUS", "WGRAD_TOKEN_ALIGN", "lookup", "lookup_weight_grad",
           "amortized_speedup", "cutlass_config", "choose", "choose_weight_grad", "weight_grad_path",
           "weight_gemms_plan"]

#: The request that lets the planner choose.
AUTO = "auto"
#: What ``backend=`` takes: ``auto`` and the registered backends' names.
BACKENDS = (AUTO,) + backends.names()

#: Measured per-shape table (``spmm_autotune.json``, made from ``benchmarks/results/spmm.json`` by
#: ``benchmarks/make_autotune_table.py``): the fastest configuration per (M, N, K, dtype) and its
#: speedup over the faster XLA dense GEMM with the per-call compression counted.
_TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spmm_autotune.json")


@functools.lru_cache(maxsize=None)
def _table():
    try:
        with open(_TABLE_PATH) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"entries": [], "configs": []}


def _nearest(section: str, m: int, n: int, k: int, dtype):
    """The entry of table ``section`` (``"entries"``, ``"entries_kn"``) nearest to (m, n, k) (log
    distance, same dtype), or None."""
    name = jnp.dtype(dtype).name
    entries = [e for e in _table().get(section, []) if e["dtype"] == name]
    if not entries:
        return None
    return min(entries, key=lambda e: sum(abs(math.log(a / b)) for a, b in zip((e["m"], e["n"], e["k"]), (m, n, k))))


def _nearest_entry(m: int, n: int, k: int, dtype):
    """The forward / input-gradient entry of the nearest measured shape, or None."""
    return _nearest("entries", m, n, k, dtype)


def lookup(m: int, n: int, k: int, dtype):
    """Nearest measured shape (log distance, same dtype): ``(speedup_with_compress, config_id)`` or None."""
    e = _nearest_entry(m, n, k, dtype)
    return None if e is None else (e["speedup_with_compress"], _config_id(e["config"]))


#: Cost of preparing one 2:4 operand of a weight (:func:`~jax_sparse24._src.prepared_weight.prepare_many`),
#: relative to the per-call compression the table's ``speedup_with_compress`` counts, by how the
#: preparation runs. Measured on the H100 at GPT-2's 48 weights (kernel time, ``bench_layer.py --sections
#: prepare``): a per-call compression of one operand 6.4 µs per weight; the batched pass over all layers
#: 2.5 µs per weight for one operand (0.39), 1.8 µs per operand for both (0.28). Per layer, a preparation
#: is one compressor launch per operand like a per-call one (1.0; one launch writing both operands
#: of a layer, 4.0 µs per operand, is not counted). The planner decides each GEMM on its own, so it
#: takes the one-operand shares; and the per-call cost in the layer table is larger than its kernel
#: (launch gaps), so these kernel-time ratios are on the safe side.
PREPARE_COST_SHARE = {"per_layer": 1.0, "batched": 0.39}


def _amortized(s_g, s_c, reuse: int, share: float = 1.0, token_ratio: float = 1.0) -> float:
    """Time per call ``1/s_g + share·token_ratio·(1/s_c - 1/s_g)/reuse`` (dense GEMM = 1) as a speedup."""
    c = (1.0 / s_c - 1.0 / s_g) * share * token_ratio
    return 1.0 / (1.0 / s_g + c / max(int(reuse), 1))


def amortized_speedup(m: int, n: int, k: int, dtype, reuse: int, *, backend: str = "cutlass",
                      batched: bool = False):
    """Speedup of the sparse GEMM over XLA's dense one for a weight prepared once for ``reuse`` calls.

    From the nearest measured shape: with ``s_g`` the GEMM-only speedup and ``s_c`` the speedup
    with the compression paid on every call, the time per call is
    ``1/s_g + share · (n_table / n) · (1/s_c - 1/s_g) / reuse`` (in units of the dense GEMM):
    the compression of a prepared weight costs :data:`PREPARE_COST_SHARE` of a per-call one
    (``batched``: prepared together with other layers, ``preparation.prepare``'s default), and it does not
    grow with the tokens ``n`` while the GEMM does. ``backend``: ``"cutlass"`` or ``"cusparselt"``
    (operand from our fused compressor). ``None`` without a table entry (or without a cuSPARSELt
    measurement).
    """
    e = _nearest_entry(m, n, k, dtype)
    return None if e is None else _entry_amortized(e, n, reuse, backend, batched)


def _entry_amortized(e, n: int, reuse: int | None, backend: str, batched: bool = False):
    """:func:`amortized_speedup` from the table entry ``e``; ``reuse=None``: the compression paid on
    every call (share 1). Either way the compression's cost is scaled to ``n`` tokens (it does not
    grow with them, the GEMM does), so per-call and prepared plans follow one cost model."""
    share = 1.0 if reuse is None else PREPARE_COST_SHARE["batched" if batched else "per_layer"]
    reuse = 1 if reuse is None else reuse
    ratio = e["n"] / n
    if backend == CUSPARSELT.name:
        s_c = e.get("cusparselt_speedup_with_compress")
        if not s_c:
            return None
        return _amortized(e.get("cusparselt_gemm_speedup") or s_c, s_c, reuse, share, ratio)
    s_c = e["speedup_with_compress"]
    s_g = e.get("gemm_speedup") or s_c  # layer-only entries of older tables lack the GEMM-only ratio
    return _amortized(s_g, s_c, reuse, share, ratio)


def _config_id(name: str) -> int:
    """Id of a configuration in *this* build (-1: the build's default table if not compiled)."""
    names = cuda_spmm_ops.cutlass_configs()
    return names.index(name) if name in names else -1


def cutlass_config(m: int, n: int, k: int, dtype) -> int:
    """Id of the CUTLASS configuration the table names for the nearest measured shape of
    D(m×n) = A(m×k, 2:4)·B(k×n) in this build (-1: the build's default)."""
    hit = lookup(m, n, k, dtype)
    return -1 if hit is None else hit[1]


def _nearest_entry_kn(m: int, n: int, k: int, dtype):
    """The ``entries_kn`` entry of the nearest measured weight-gradient shape (same dtype), or None."""
    return _nearest("entries_kn", m, n, k, dtype)


def lookup_weight_grad(m: int, n: int, k: int, dtype):
    """Nearest measured weight-gradient shape (``entries_kn`` of the table): ``(speedup, config_id)`` or None.

    Keyed on the sparse GEMM of the weight gradient (M = O, N = I, K = T); the speedup counts the
    fused MVUE + compress pass against XLA's exact dense ``xᵀ·∇y`` (what ``auto`` runs otherwise).
    """
    e = _nearest_entry_kn(m, n, k, dtype)
    if e is None:
        return None
    names = cuda_spmm_ops.cutlass_configs_kn()
    return e["speedup_with_compress"], (names.index(e["config"]) if e["config"] in names else -1)


#: ``auto`` takes a sparse path only where the table's speedup exceeds this: run-to-run noise of a
#: dense GEMM at GPT-2 FFN shapes on the H100 is about ±3% (``bench_layer.py``'s dense-vs-dense control).
MIN_GAIN = 1.03


def _fused_lt_available(m: int, n: int, k: int, dtype, *, b_kn: bool = False) -> bool:
    """cuSPARSELt with our fused compressor writing its operand can run here (bfloat16, the library
    loaded, the table measured this library version, the layout check of
    :func:`~jax_sparse24._src.cuda_cusparselt_ops.fused_compress_ok`)."""
    if jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
        return False
    if not CUSPARSELT.supports(m, n, k, dtype):  # loadable, shape and dtype
        return False
    # the table's cuSPARSELt measurements hold for the loaded library version (else: warn once, no)
    if not CUSPARSELT.table_version_matches(_table().get("cusparselt_version")):
        return False
    return CUSPARSELT.fused_operand_ok(m, n, k, dtype, b_kn=b_kn)


#: ``auto`` takes cuSPARSELt only where the nearest measured shape is within this factor in every
#: dimension: its advantage does not carry to other sizes — at gpt2-medium with 4 micro-batches of
#: 2048 tokens, cuSPARSELt chosen from the 8192-token measurements made every 2:4 recipe 4–5% slower
#: than CUTLASS there (measured on an H100).
CUSPARSELT_RADIUS = 1.5


def _near(entry, m: int, n: int, k: int, factor: float = CUSPARSELT_RADIUS) -> bool:
    return all(max(a / b, b / a) <= factor for a, b in zip((entry["m"], entry["n"], entry["k"]), (m, n, k)))


def _cusparselt_wins(entry, s_lt, s_cutlass: float, m: int, n: int, k: int, dtype, *, b_kn: bool = False) -> bool:
    """``auto``: cuSPARSELt (operand from our fused compressor) where its speedup ``s_lt`` (from the
    table ``entry``: per call, or amortized over a prepared weight's reuse; ``None`` when not
    measured) beats both CUTLASS's ``s_cutlass`` and the noise floor, the entry was measured near
    this shape (:data:`CUSPARSELT_RADIUS`), and that path is available here."""
    if not s_lt or s_lt <= max(s_cutlass, MIN_GAIN) or not _near(entry, m, n, k):
        return False
    return _fused_lt_available(m, n, k, dtype, b_kn=b_kn)


GEMMS = ("forward", "input_grad", "weight_grad")


def resolve(backend: str, gemm: str, m: int, n: int, k: int, dtype=None, *, reuse: int | None = None,
            batched: bool = False, fp8: bool = False) -> Backend:
    """The backend object that runs ``gemm`` for the request ``backend`` (:data:`BACKENDS`).

    ``gemm``: ``"forward"`` / ``"input_grad"``, D(m×n) = A(m×k, 2:4)·B(k×n) (a layer (i, o) at t
    tokens: (o, t, i) / (i, t, o)); ``"weight_grad"``, the MVUE weight gradient's sparse GEMM,
    D(m×n) = MVUE(∇y)ᵀ(m×k)·x(k×n) with m = O, n = I, k = padded tokens.

    A backend's name gives that backend where it can run (RuntimeError with its reason where not;
    ``dense`` and ``reference`` run everywhere). ``auto``: for the 16-bit GEMMs the measured table
    (:func:`choose`, :func:`choose_weight_grad`; ``reuse``/``batched``: a prepared weight's amortized
    cost); for ``fp8=True`` the sparse fp8 kernel wherever it can run on a CUDA device, else
    :data:`~jax_sparse24._src.backends.DENSE` (XLA's fp8 dot).
    """
    if gemm not in GEMMS:
        raise ValueError(f"resolve: gemm must be one of {GEMMS}, got {gemm!r}")
    if fp8:
        return _resolve_fp8(backend, gemm, m, n, k)
    if backend != AUTO:
        return _requested(backends.get(backend), gemm, m, n, k, dtype)
    if gemm == "weight_grad":
        return _auto_weight_grad(m, n, k, dtype)
    if not (CUTLASS.can_run(m, n, k, dtype) and ffi.cuda_kernels_available()):
        return DENSE
    e = _nearest_entry(m, n, k, dtype)
    if e is None:
        return DENSE
    s_cutlass = _entry_amortized(e, n, reuse, CUTLASS.name, batched)
    if _cusparselt_wins(e, _entry_amortized(e, n, reuse, CUSPARSELT.name, batched), s_cutlass, m, n, k, dtype):
        return CUSPARSELT
    return CUTLASS if s_cutlass > MIN_GAIN else DENSE


def _requested(b: Backend, gemm: str, m: int, n: int, k: int, dtype) -> Backend:
    """A backend asked for by name: itself where it can run the GEMM, else RuntimeError with the reason."""
    if not b.sparse:
        return b
    if b is CUTLASS and gemm == "weight_grad" and ffi.extension() is not None \
            and not CUTLASS.weight_grad_kernels_built():
        return DENSE  # a minimal build has no weight-gradient configuration: the dense path, as with auto
    verdict = b.can_run(m, n, k, dtype, gemm=gemm)
    if not verdict:
        raise RuntimeError(f"backend={b.name!r}: {verdict.reason}")
    return b


def _auto_weight_grad(m: int, n: int, k: int, dtype) -> Backend:
    """``auto`` for the MVUE weight gradient (the table's ``entries_kn``)."""
    if ffi.extension() is None or not ffi.cuda_kernels_available():
        return DENSE
    if not CUTLASS.weight_grad_kernels_built():
        return DENSE  # a minimal build has no weight-gradient configuration
    if not CUTLASS.supports(m, n, k, dtype, gemm="weight_grad"):
        return DENSE
    e = _nearest_entry_kn(m, n, k, dtype)
    if e is None:
        return DENSE
    if _cusparselt_wins(e, e.get("cusparselt_speedup_with_compress"), e["speedup_with_compress"], m, n,
                        k + (-k) % 32, dtype, b_kn=True):
        return CUSPARSELT
    return CUTLASS if e["speedup_with_compress"] > MIN_GAIN else DENSE


def fp8_backends_for(backend: str) -> tuple[Backend, ...]:
    """The fp8 backends a request may resolve to (``auto``: every registered sparse fp8 backend);
    ValueError (:func:`fp8_refusal`) for a backend without an fp8 variant."""
    if backend == AUTO:
        return tuple(b for b in backends.registered() if b.fp8)
    reason = fp8_refusal(backend)
    if reason is not None:
        raise ValueError(reason)
    return (backends.get(backend).fp8_variant(),)


def has_fp8_backend(name: str) -> bool:
    """Whether the backend ``name`` has an fp8 variant (:meth:`~jax_sparse24._src.backends.base.Backend.fp8_variant`)."""
    return backends.get(name).fp8_variant() is not None


def fp8_refusal(backend: str) -> str | None:
    """Why ``fp8=True`` cannot take the request ``backend`` (a backend without an fp8 variant), else None."""
    if backend == AUTO or has_fp8_backend(backend):
        return None
    usable = [AUTO] + [name for name in backends.names() if has_fp8_backend(name)]
    return (f"fp8=True: backend={backend!r} has no fp8 path in this version; use "
            f"{', '.join(repr(u) for u in usable[:-1])} or {usable[-1]!r}")


def check_request(backend, op: str, *, fp8: bool = False) -> None:
    """The one check of a ``backend=`` request: one of :data:`BACKENDS`, and with ``fp8`` one that has an
    fp8 path (:func:`fp8_refusal`); ValueError naming ``op`` and the constraint."""
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    reason = fp8_refusal(backend) if fp8 else None
    if reason is not None:
        raise ValueError(f"{op}: {reason}")


def _resolve_fp8(backend: str, gemm: str, m: int, n: int, k: int) -> Backend:
    candidates = fp8_backends_for(backend)
    if backend != AUTO:
        (requested,) = candidates
        if requested.sparse:
            verdict = requested.can_run(m, n, k, gemm=gemm)
            if not verdict:
                raise RuntimeError(f"backend={backend!r} with fp8=True: {verdict.reason}")
        return requested
    for b in candidates:
        if b.can_run(m, n, k, gemm=gemm) and ffi.cuda_kernels_available():
            return b
    return DENSE


def choose(backend: str, m: int, n: int, k: int, dtype, *, reuse: int | None = None, batched: bool = False) -> str:
    """The name of :func:`resolve`'s backend for D(m×n) = A(m×k, 2:4)·B(k×n): ``"cutlass"``,
    ``"cusparselt"`` or ``"dense"``/``"reference"``.

    ``reuse``: the 2:4 operand is prepared once and used by ``reuse`` calls (a prepared weight,
    :func:`~jax_sparse24._src.prepared_weight.prepare_many`; ``batched``: together with other
    layers); ``auto`` then counts the preparation's cost (:func:`amortized_speedup`, for CUTLASS
    and cuSPARSELt). ``None``: compressed on every call.
    """
    return resolve(backend, "forward", m, n, k, dtype, reuse=reuse, batched=batched).name


def choose_weight_grad(backend: str, m: int, n: int, k: int, dtype) -> str:
    """The name of :func:`resolve`'s backend for the MVUE weight gradient, D(m×n) = MVUE(∇y)ᵀ(m×k)·x(k×n)
    with m = O, n = I, k = padded tokens: ``"cutlass"`` (fused MVUE+compress, sparse GEMM),
    ``"cusparselt"`` or ``"dense"``/``"reference"``.

    ``auto`` picks ``cutlass`` only where the table's ``entries_kn`` show the fused MVUE + sparse
    GEMM faster than XLA's exact dense ``xᵀ·∇y``, and ``cusparselt`` where they show the fused MVUE
    (cuSPARSELt's layout) + cuSPARSELt GEMM faster than that and than CUTLASS (bfloat16)."""
    return resolve(backend, "weight_grad", m, n, k, dtype).name


#: Token padding of the sparse weight-gradient GEMM: its K (= tokens) must be a multiple of 16.
WGRAD_TOKEN_ALIGN = 16


class WeightGradPath(NamedTuple):
    """How :func:`~jax_sparse24._src.gemm.weight_grad_mvue` computes ``∇W``: ``backend`` runs it, on the
    MVUE sample of ``∇y`` when ``mvue`` (its fused MVUE + sparse GEMM where it has one, else the MVUE op
    then XLA's GEMM), else XLA's exact ``xᵀ·∇y``."""

    backend: Backend
    mvue: bool

    @property
    def label(self) -> str:
        """How :func:`~jax_sparse24._src.linear.linear_plan` names it: ``"dense (exact)"`` or ``"<name> (MVUE)"``."""
        return f"{self.backend.name} (MVUE)" if self.mvue else f"{self.backend.name} (exact)"


def exact_weight_grad_label(backend: str) -> str:
    """How :func:`~jax_sparse24._src.linear.linear_plan` names the exact weight gradient (no MVUE key) of
    the request ``backend``: ``"reference"`` for ``reference``, else ``"dense (exact)"``."""
    return REFERENCE.name if backend == REFERENCE.name else WeightGradPath(DENSE, mvue=False).label


def weight_grad_path(backend: str, o: int, i: int, t: int, dtype) -> WeightGradPath:
    """How :func:`~jax_sparse24._src.gemm.weight_grad_mvue` computes ``∇W (I, O)`` from ``t`` tokens:
    the MVUE sample on ``cutlass`` / ``cusparselt`` (fused MVUE + sparse GEMM) or on ``dense`` /
    ``reference`` (the MVUE op, then the dense GEMM); the exact gradient on ``dense`` (``auto`` where
    the sparse path is not measured faster: MVUE exists to feed it, so XLA's exact ``xᵀ·∇y`` is both
    faster and noise-free)."""
    chosen = resolve(backend, "weight_grad", o, i, t + (-t) % WGRAD_TOKEN_ALIGN, dtype)
    if not chosen.sparse and backend == AUTO:
        return WeightGradPath(DENSE, mvue=False)
    return WeightGradPath(chosen, mvue=True)


#: Token padding of the sparse fp8 weight-gradient GEMM (its K): the fp8 compressor's K alignment
#: (the 16-bit weight gradient pads to :data:`WGRAD_TOKEN_ALIGN`).
FP8_WGRAD_TOKEN_ALIGN = 32


def fp8_weight_grad_backend(backend: str, tokens: int, i: int, o: int, dtype, *, mvue: bool) -> Backend | None:
    """The backend of the fp8 layer's weight gradient, or None for the 16-bit one:

    * a sparse fp8 backend (``CUTLASS_FP8``): the MVUE sample through the fused fp8 compressor and the
      sparse fp8 GEMM — ``auto`` where the 16-bit planner runs the sparse MVUE gradient
      (:func:`weight_grad_path`: the sample pays there already, and the
      fp8 GEMM is the faster of the two) and the fp8 kernel can run; ``cutlass``: wherever it can
      run (RuntimeError where it cannot);
    * a backend without kernels (``dense`` / ``reference``): the same sample through XLA's fp8 dot
      (the sparse path's math, for tests and quality studies);
    * None: the 16-bit weight gradient of :mod:`jax_sparse24._src.gemm` — without an MVUE key, and
      with ``auto`` elsewhere. XLA's fp8 dot of ``q(x)ᵀ·q(∇y)`` is not used for the exact
      gradient: it needs both operands transposed (fp8 GEMMs read K-major operands) and made the
      fp8 dense LLaMA-7B-shaped step slower than the 16-bit gradient (140.3 against 132.2 ms,
      ``docs/fp8.md``).
    """
    if not mvue:
        return None
    tp = tokens + (-tokens) % FP8_WGRAD_TOKEN_ALIGN
    if backend != AUTO and has_fp8_backend(backend):
        # the requested backend's fp8 variant: XLA's fp8 dot, or the sparse fp8 backend (RuntimeError naming
        # the constraint where it cannot run)
        return resolve(backend, "weight_grad", o, i, tp, fp8=True)
    path = weight_grad_path(backend, o, i, tokens, dtype)
    if path.mvue and path.backend.sparse:
        chosen = resolve(AUTO, "weight_grad", o, i, tp, fp8=True)
        if chosen.sparse:
            return chosen
    return None


def weight_gemms_backends(backend: str, tokens: int, i: int, o: int, dtype, *, transposable: bool,
                          reuse: int | None = None, batched: bool = False) -> tuple[Backend, Backend]:
    """``(forward, input_grad)`` backends of a layer ``(i, o)`` at ``tokens`` rows (:func:`resolve`;
    ``reuse``: a weight prepared for that many calls, ``batched`` with other layers). Without a
    transposable mask ``∇x`` is dense (:func:`dense_for`)."""
    fwd = resolve(backend, "forward", o, tokens, i, dtype, reuse=reuse, batched=batched)
    dx = (resolve(backend, "input_grad", i, tokens, o, dtype, reuse=reuse, batched=batched) if transposable
          else dense_for(backend))
    return fwd, dx


def weight_gemms_plan(backend: str, tokens: int, i: int, o: int, dtype, *, transposable: bool,
                      reuse: int | None = None, batched: bool = False):
    """The names of :func:`weight_gemms_backends` (:func:`choose` for both GEMMs of a layer)."""
    fwd, dx = weight_gemms_backends(backend, tokens, i, o, dtype, transposable=transposable, reuse=reuse,
                                    batched=batched)
    return fwd.name, dx.name


def dense_for(backend: str) -> Backend:
    """The dense backend standing in for ``backend`` where a GEMM cannot be sparse (``∇x`` without a
    transposable mask): ``reference`` for ``reference``, else ``dense``."""
    return REFERENCE if backend == REFERENCE.name else DENSE


def kernel_config(chosen: Backend, m: int, n: int, k: int, dtype) -> int:
    """The kernel configuration of ``chosen``'s GEMM D(m×n) = A(m×k)·B(k×n) the table names
    (:func:`cutlass_config` for CUTLASS; -1, the backend's own choice, otherwise)."""
    return cutlass_config(m, n, k, dtype) if chosen is CUTLASS else -1
