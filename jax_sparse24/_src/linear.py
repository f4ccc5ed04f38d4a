"""``sparse24_linear``: the 2:4 sparse linear layer as a ``jax.custom_vjp`` op.

Math (the transposable SR-STE recipe), with ``W̃ = W ⊙ M``:

* forward ``y = x·W̃ + b``            (W̃ is 2:4 along ``in``)
* input grad ``∇x = ∇y·W̃ᵀ``          (2:4 along ``out`` when ``M`` is transposable)
* weight grad ``∇W = xᵀ·MVUE(∇y)``   (MVUE groups along the token axis) or ``xᵀ·∇y`` without a
  key; dense and straight-through to the dense master weight ``W``.
* bias grad ``Σ_tokens ∇y``.

The GEMMs go through :mod:`jax_sparse24._src.gemm` (per call) and
:mod:`jax_sparse24._src.prepared_weight` (a weight compressed once for many calls), which run the
sparse CUDA kernel or a dense GEMM on the masked weight of the backend object the planner returns
(:func:`jax_sparse24._src.autotune.resolve`, per requested backend and shape; the backends are in
:mod:`jax_sparse24._src.backends`); on a CPU they are dense ``jnp.dot``. With ``fp8=True`` the forward,
the input gradient and a sparse (MVUE) weight gradient are :mod:`jax_sparse24._src.fp8_gemm`'s
(float8_e4m3fn operands with per-tensor current scaling, math in :mod:`jax_sparse24._src.fp8_math`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jax_sparse24._src import autotune, fp8_gemm, gemm, prepared_weight
from jax_sparse24._src import fp8_math
from jax_sparse24._src import partitioning
from jax_sparse24._src.remat import CHECKPOINT_NAME
from jax_sparse24._src import validation as v

__all__ = ["sparse24_linear", "fp8_dense_linear", "prepare_weight", "linear_plan", "BACKENDS"]

BACKENDS = autotune.BACKENDS


class _Config(NamedTuple):
    backend: str
    precision: object
    transposable: bool
    fp8: bool = False


def _flatten_tokens(x):
    return x.reshape(-1, x.shape[-1])


def _check_linear_args(op: str, x, w, bias) -> None:
    """Float ``x`` (..., in) and ``w`` (in, out); ``bias`` None or (out,). ValueError naming ``op``."""
    v.check_float(x, "x", op)
    v.check_float(w, "w", op)
    v.check_rank(w, 2, op, "w")
    if np.ndim(x) < 1 or np.shape(x)[-1] != np.shape(w)[0]:
        raise ValueError(f"{op}: x's last axis must equal w's in dimension, got x {np.shape(x)} and w {np.shape(w)}")
    if bias is not None and np.shape(bias) != (np.shape(w)[1],):
        raise ValueError(f"{op}: bias must have shape ({np.shape(w)[1]},), got {np.shape(bias)}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _linear(x, w, mask, bias, key, prepared, meta, cfg: _Config):
    y, _ = _linear_fwd(x, w, mask, bias, key, prepared, meta, cfg)
    return y


def _linear_fwd(x, w, mask, bias, key, prepared, meta, cfg: _Config):
    x2 = _flatten_tokens(x)
    scales = None
    if cfg.fp8:
        delayed, amaxes = None, None
        if meta is not None:
            # delayed scaling: quantize with the scales of the amax histories; record this call's amaxes
            dtype = jnp.result_type(x2, w)
            delayed = (fp8_math.delayed_scale(meta["input_scale"], meta["input_amax_history"]),
                       fp8_math.delayed_scale(meta["kernel_scale"], meta["kernel_amax_history"]))
            amaxes = {"input": fp8_math.amax(x2.astype(dtype)), "kernel": fp8_gemm.weight_amax(w, mask, dtype)}
        y2, s_x, s_w = fp8_gemm.forward(x2, w, mask, backend=cfg.backend, scales=delayed)
        scales = (s_x, s_w, amaxes)
        y2 = y2.astype(jnp.result_type(x2, w))
    elif prepared is None:
        y2 = gemm.forward(x2, w, mask, backend=cfg.backend, precision=cfg.precision)
    elif "forward" in prepared:
        y2 = prepared_weight.forward_prepared(x2, w, mask, prepared["forward"], precision=cfg.precision)
    else:
        wm = prepared["masked"]
        y2 = jnp.dot(x2.astype(wm.dtype), wm, precision=cfg.precision)
    if bias is not None:
        y2 = y2 + bias.astype(y2.dtype)
    # named so that checkpoint_policy keeps it: the GPU GEMM is a custom call, which JAX's dots policies recompute
    y = checkpoint_name(y2.reshape(x.shape[:-1] + (w.shape[1],)), CHECKPOINT_NAME)
    return y, (x, w, mask, bias, key, prepared, meta, scales)


def _linear_bwd(cfg: _Config, res, g):
    x, w, mask, bias, key, prepared, meta, scales = res
    x2 = _flatten_tokens(x)
    g2 = g.reshape(-1, g.shape[-1])
    s_g = None
    if cfg.fp8:
        s_x, s_w, amaxes = scales
        if meta is not None:
            s_g = fp8_math.delayed_scale(meta["output_grad_scale"], meta["output_grad_amax_history"])
        dx2 = fp8_gemm.input_grad(g2, w, mask, s_w, transposable=cfg.transposable, backend=cfg.backend, s_g=s_g)
    elif prepared is None:
        dx2 = gemm.input_grad(g2, w, mask, transposable=cfg.transposable, backend=cfg.backend,
                              precision=cfg.precision)
    elif "input_grad" in prepared:
        dx2 = prepared_weight.input_grad_prepared(g2, w, mask, prepared["input_grad"],
                                                  precision=cfg.precision)
    else:
        wm = prepared["masked"]
        dx2 = jnp.dot(g2.astype(wm.dtype), wm.T, precision=cfg.precision)
    dx = dx2.reshape(x.shape).astype(x.dtype)
    if cfg.fp8 and key is not None:
        # the MVUE sample through the sparse fp8 GEMM where that pays, else the 16-bit path below
        dw = fp8_gemm.weight_grad_mvue(key, x2, g2, s_x, backend=cfg.backend, precision=cfg.precision, s_g=s_g)
    elif key is not None:
        # MVUE groups of 4 along the token axis (gemm.weight_grad_mvue pads T with zero rows, which
        # changes nothing). With the sparse backend one fused pass draws MVUE(∇y) and compresses it
        # for the sparse weight-gradient GEMM; otherwise ops.mvue24 then the dense GEMM.
        dw = gemm.weight_grad_mvue(key, x2, g2, backend=cfg.backend, precision=cfg.precision)
    else:
        dw = gemm.weight_grad(x2, g2, backend=cfg.backend, precision=cfg.precision)
    dw = dw.astype(w.dtype)
    db = None if bias is None else jnp.sum(g2, axis=0).astype(bias.dtype)
    new_meta = None
    if meta is not None:
        # the "gradient" of the delayed-scaling state is its new value (Flax's overwrite-with-gradient)
        amaxes = dict(amaxes, output_grad=fp8_math.amax(g2.astype(jnp.result_type(g2, w))))
        new_meta = fp8_math.meta_update(meta, {"input": s_x, "kernel": s_w, "output_grad": s_g}, amaxes)
    # with Explicit mesh axes the cotangents must carry their primals' shardings
    dx, dw, db = (partitioning.like_primal(c, p) for c, p in ((dx, x), (dw, w), (db, bias)))
    return dx, dw, None, db, None, None, new_meta


_linear.defvjp(_linear_fwd, _linear_bwd)


def sparse24_linear(x, w, mask, bias=None, *, key=None, backend: str = "auto", precision=None,
                    transposable: bool | None = None, prepared: dict | None = None, fp8: bool = False,
                    fp8_meta: dict | None = None, check_mask: bool | str = True):
    """2:4 sparse linear layer ``y = x·(w ⊙ mask) + bias`` with the sparse-training backward.

    Gradients (a ``jax.custom_vjp``): ``∇x = ∇y·(w⊙mask)ᵀ``; ``∇w = xᵀ·MVUE(∇y)`` with MVUE
    groups along the token axis when ``key`` is given, else ``xᵀ·∇y`` — dense, passed straight
    through to ``w``; ``∇bias = Σ ∇y``; no gradient for ``mask`` or ``key``.

    Args:
      x: input ``(..., in)``; all leading axes are tokens.
      w: dense weight ``(in, out)`` (Flax layout), ``in % 4 == 0``.
      mask: ``bool`` (or 0/1) mask of ``w``'s shape, 2:4 along ``in`` (axis 0; also along ``out`` with
        ``transposable=True``). Checked, see ``check_mask``: the sparse kernels keep at most two
        elements of each group of 4, so a mask that is not 2:4 would give a wrong product there.
      bias: optional ``(out,)``.
      key: optional PRNG key; enables the MVUE weight gradient.
      backend: ``"auto"`` (sparse CUDA kernel where it beats dense for the shape, else dense on
        the masked weight), ``"cutlass"`` (force the sparse kernel; error if unavailable),
        ``"dense"`` (dense GEMM on the masked weight) or ``"reference"`` (plain ``jnp``).
      precision: ``lax.Precision`` for the dense GEMMs.
      transposable: whether ``mask`` is also 2:4 along ``out`` (lets ``∇x`` use the sparse
        kernel; then checked along ``out`` too). ``None``: found out when the mask is concrete,
        else assumed False.
      prepared: optional :func:`prepare_weight` of this ``(w, mask)``: the forward and
        input-gradient GEMMs then use its compressed (or masked dense) weight instead of
        compressing ``w ⊙ mask`` on this call, and its plan replaces ``backend``'s choice for
        those two GEMMs. It must come from the *current* ``w`` and ``mask`` (prepare once per
        optimizer step, reuse across the micro-batches of that step); gradients still reach ``w``.
        Not with ``fp8=True`` (ValueError).
      fp8: run the forward and input-gradient GEMMs in float8_e4m3fn (docs/fp8_math.md): ``x``, ``∇y``
        and ``W̃ = w ⊙ mask`` quantized with per-tensor current scaling (``s = amax/448``), float32
        accumulation, the scales applied to the accumulator, the GEMM result rounded to bfloat16
        and cast to the compute dtype. On a GPU with the fp8 kernels: the sparse fp8 kernel where
        the shape is aligned (and, for ``∇x``, the mask transposable), else XLA's fp8 dot of the
        same quantized operands; on a CPU that XLA math. With a ``key``, the MVUE weight gradient
        runs in fp8 too (``q(MVUE(∇y))`` with twice ``∇y``'s scale, the sparse fp8 kernel) where the
        16-bit one would run sparse (``auto``; ``cutlass``: wherever the fp8 kernels can run, else
        RuntimeError); otherwise the weight gradient is the 16-bit one. (``cutlass`` checks the
        global shapes; under ``NamedSharding`` a shard the kernels cannot take runs XLA's fp8 math.)
        ``backend``: ``auto``/``cutlass`` as above (``cutlass`` raises where the fp8 kernel cannot
        run), ``dense``/``reference``: XLA's fp8 math (with a key the fp8 MVUE gradient too),
        ``cusparselt``: ValueError. The bias and the straight-through to ``w`` are as without ``fp8``.
      fp8_meta: with ``fp8=True``, delayed scaling instead of current scaling (docs/fp8_math.md): the
        layer's state ``{input,kernel,output_grad}_{scale,amax_history}`` (:func:`jax_sparse24.fp8.init_meta`,
        Flax's fp8 names). ``x``, ``W̃`` and ``∇y`` are quantized with the scales of their amax
        histories, and the *gradient* with respect to ``fp8_meta`` is its new value (the scales used,
        each history with this call's amax): write it over the state after the step, as Flax's
        ``OVERWRITE_WITH_GRADIENT`` collection is handled (never an optimizer update).
      check_mask: check that ``mask`` is 2:4 (along ``in``, and along ``out`` with
        ``transposable=True``). A concrete mask is checked at trace time (``ValueError``); a traced
        one (under ``jit``, e.g. a mask passed as an argument) on the device: one fused reduction
        over the mask and a host callback that fails the computation with the same message
        (``jax.errors.JaxRuntimeError``) — no result is returned from a wrong mask. Masks the
        library makes inside a model (``Sparse24Dense``, ``Sparse24Linear``: their ``sparsity``
        collection, refreshed by :func:`jax_sparse24.masks.refresh_masks`) are trusted and not
        rechecked. The callback costs a host round trip per call on a GPU (on an H200, the
        ``value_and_grad`` of 12 GPT-2-sized FFN layers ran 2.2x slower with it, of 8 LLaMA-1B-sized
        ones 1.4x: ``benchmarks/bench_mask_check.py``); ``"nan"`` checks a traced mask on the device
        without it: the output is all NaN when the mask is not 2:4 (a loss that turns NaN, no
        message), else unchanged. ``False`` skips the traced check: a mask that is not 2:4 then
        gives an undefined result on the sparse kernels, and on any backend where an FSDP-sharded
        weight is gathered packed (:func:`jax_sparse24.sharding.weight_gather`).

    Returns:
      ``(..., out)`` array.

    >>> import jax, jax.numpy as jnp, jax_sparse24 as s24
    >>> w = jax.random.normal(jax.random.key(0), (8, 4))
    >>> x = jax.random.normal(jax.random.key(1), (3, 8))
    >>> m = s24.mask24(w, axis=0)
    >>> y = s24.sparse24_linear(x, w, m)
    >>> bool(jnp.allclose(y, x @ (w * m)))
    True
    """
    op = "sparse24_linear"
    _check_linear_args(op, x, w, bias)
    v.check_divisible(w, 0, 4, op, what="w axis (in)")
    v.check_same_shape(w, mask, op, ("w", "mask"))
    if not isinstance(fp8, (bool, np.bool_)):
        raise ValueError(f"{op}: fp8 must be a Python bool, got {fp8!r}")
    autotune.check_request(backend, op, fp8=bool(fp8))
    if fp8_meta is not None:
        if not fp8:
            raise ValueError(f"{op}: fp8_meta (delayed scaling) needs fp8=True")
        fp8_meta = fp8_math.check_meta(fp8_meta, op)
    if fp8:
        if prepared is not None:
            raise ValueError(f"{op}: fp8=True does not take prepared= weights in this version (the fp8 weight "
                             "operand is quantized and compressed on every call); pass prepared=None")
    if not (isinstance(check_mask, (bool, np.bool_)) or (isinstance(check_mask, str) and check_mask == "nan")):
        raise ValueError(f"{op}: check_mask must be True, False or 'nan', got {check_mask!r}")
    if transposable is None:
        transposable = _is_transposable(mask, np.shape(w))
    bad = check_mask24(mask, op, transposable=bool(transposable),
                       on_device=check_mask if isinstance(check_mask, str) else bool(check_mask))
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        mask = mask != 0
    cfg = _Config(backend, precision, bool(transposable), bool(fp8))
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    if prepared is not None:
        prepared_weight.check_prepared(prepared, w, jnp.result_type(x, w), op)
    if fp8_meta is not None:
        _check_meta_outside_shard_map(op)
    # Inside shard_map: operands varying over different mesh axes (x over data, w over model)
    # are cast to the union first, so the custom_vjp's cotangents match their primals.
    x, w, mask, bias = partitioning.vary_to_union(x, w, mask, bias)
    y = _linear(x, w, mask, bias, key, prepared, fp8_meta, cfg)
    return y if bad is None else jnp.where(bad, jnp.asarray(jnp.nan, y.dtype), y)


_MASK_HINT = (" Make masks with s24.mask24(w, axis=0) (2:4 along in) or s24.transposable_mask24(w) (along in "
              "and out); check_mask=False skips this check.")


def check_mask24(mask, op: str, *, transposable: bool, on_device: bool | str = True, name: str = "mask"):
    """The weight mask of a sparse linear op is 2:4 along ``in`` (axis 0) and, when ``transposable``,
    along ``out`` (axis 1): now if concrete, on the device if traced and ``on_device``
    (:func:`jax_sparse24._src.validation.check_nm_mask`). With ``on_device="nan"`` and a traced mask:
    returns the traced scalar that is True when the mask breaks the pattern; else None."""
    bad = v.check_nm_mask(mask, 2, 4, 0, op, name, on_device=on_device, axis_name="in", hint=_MASK_HINT)
    if transposable:
        if np.shape(mask)[1] % 4:
            raise ValueError(f"{op}: transposable=True needs `{name}`'s out axis divisible by 4 (2:4 along out), "
                             f"got shape {np.shape(mask)}")
        bad_out = v.check_nm_mask(mask, 2, 4, 1, op, name, on_device=on_device,
                                  axis_name="out, needed by transposable=True", hint=_MASK_HINT)
        if bad_out is not None:
            bad = bad_out if bad is None else bad | bad_out
    return bad


def _check_meta_outside_shard_map(op: str) -> None:
    """Delayed scaling needs the whole tensors' amaxes and one new state: under ``jit`` +
    ``NamedSharding`` XLA reduces across the shards, but inside ``shard_map`` each shard would record
    its own amax and JAX would sum the replicated state's per-shard "gradients". The mesh's manual
    axes say so with or without ``check_vma`` (the operands' varying axes only with it)."""
    axes = partitioning.manual_axes()
    if axes:
        raise ValueError(f"{op}: fp8_meta (delayed scaling) is not supported inside shard_map (manual mesh axes "
                         f"{sorted(axes)}): use jit with NamedSharding, or current scaling (fp8_meta=None)")


def fp8_dense_linear(x, w, bias=None, *, precision=None, fp8_meta: dict | None = None):
    """``x·w + bias`` with the fp8 GEMMs of ``sparse24_linear(..., fp8=True)`` on a dense weight.

    The dense phase of an fp8 layer (``Sparse24Dense(fp8=True)`` with ``method="dense"`` or
    ``sparse=False``), and the fp8 dense baseline: the same float8_e4m3fn forward and input
    gradient with current scaling (an all-ones mask, XLA's fp8 dot on every platform), the exact
    16-bit weight gradient ``xᵀ·∇y``. ``fp8_meta``: delayed scaling, as in :func:`sparse24_linear`.
    """
    op = "fp8_dense_linear"
    _check_linear_args(op, x, w, bias)
    if fp8_meta is not None:
        fp8_meta = fp8_math.check_meta(fp8_meta, op)
        _check_meta_outside_shard_map(op)
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    ones = jnp.ones(np.shape(w), jnp.bool_)
    x, w, ones, bias = partitioning.vary_to_union(x, w, ones, bias)
    return _linear(x, w, ones, bias, None, None, fp8_meta, _Config("dense", precision, False, True))


def prepare_weight(w, mask, *, tokens: int, dtype=None, backend: str = "auto", transposable: bool | None = None,
                   reuse: int = 1, check_mask: bool = True) -> dict:
    """Do the weight work of :func:`sparse24_linear` once, for many calls with the same ``(w, mask)``.

    Within an optimizer step the weight and mask are fixed, but a gradient-accumulation loop calls
    the layer once per micro-batch, and each call would mask and compress ``W̃ = w ⊙ mask`` again
    (XLA does not hoist that out of a ``lax.scan``). Prepare it before the loop and pass
    ``prepared=`` to every call::

        pw = prepare_weight(w, mask, tokens=micro_tokens, dtype=jnp.bfloat16, reuse=n_micro)
        def micro_step(carry, xb):      # inside lax.scan
            loss, g = jax.value_and_grad(loss_fn)(w, xb, pw)   # sparse24_linear(..., prepared=pw)

    With ``backend="auto"`` each of the forward and input-gradient GEMMs runs sparse where the
    measured table says the sparse GEMM, with the preparation's cost (a share of a per-call
    compression, :data:`~jax_sparse24._src.autotune.PREPARE_COST_SHARE`) spread over ``reuse`` calls,
    beats XLA's dense GEMM for ``tokens`` rows; the prepared weight then holds the compressed operand
    (``W̃ᵀ`` for the forward, ``W̃`` for ``∇x``) of the faster sparse backend — CUTLASS's, or
    cuSPARSELt's written by our fused compressor (bfloat16) — else the masked dense ``W̃`` in ``dtype``.
    The weight gradient is unchanged (it depends on the call's ``∇y``).

    No gradient flows through the result (gradients reach ``w`` through ``sparse24_linear``), so
    it may be built inside or outside the differentiated function. The compressed operands cover
    the whole weight: under sharding, prepared GEMMs keep the weight replicated (data
    parallelism); a tensor-parallel weight is gathered for them.

    Args:
      w: dense weight ``(in, out)``.
      mask: its 2:4 mask (along ``in``; also along ``out`` for a sparse ``∇x``).
      tokens: rows of ``x`` per call (all leading axes; per device under data parallelism).
      dtype: compute dtype of the calls (``None``: ``w``'s dtype). Must equal the calls' ``x``/``w``
        result dtype.
      backend: as in :func:`sparse24_linear`. ``"cusparselt"``: the sparse GEMMs' operands in
        cuSPARSELt's format, planned for ``tokens`` rows.
      transposable: as in :func:`sparse24_linear` (``None``: checked when the mask is concrete).
      reuse: number of calls that share this preparation (e.g. micro-batches per step).
      check_mask: as in :func:`sparse24_linear` (a traced mask is checked on the device).

    Returns:
      a dict (a pytree; keys ``"forward"``, ``"input_grad"`` with ``{"values", "meta"}`` (CUTLASS) or
      ``{"cusparselt"}`` (one uint8 buffer), and/or ``"masked"``) to pass as
      ``sparse24_linear(..., prepared=)``.

    >>> import jax, jax.numpy as jnp, jax_sparse24 as s24
    >>> w = jax.random.normal(jax.random.key(0), (8, 4))
    >>> m = s24.mask24(w, axis=0)
    >>> pw = s24.prepare_weight(w, m, tokens=3)
    >>> x = jax.random.normal(jax.random.key(1), (3, 8))
    >>> bool(jnp.allclose(s24.sparse24_linear(x, w, m, prepared=pw), x @ (w * m)))
    True
    """
    return prepared_weight.prepare_many([plan_weight(w, mask, tokens=tokens, dtype=dtype, backend=backend,
                                                     transposable=transposable, reuse=reuse,
                                                     check_mask=check_mask)])[0]


def plan_weight(w, mask, *, tokens: int, dtype=None, backend: str = "auto", transposable: bool | None = None,
                reuse: int = 1, batched: bool = False, check_mask: bool = True) -> prepared_weight.WeightPlan:
    """:func:`prepare_weight`'s argument checks and plan, without the work: the plans of many weights
    run together with :func:`jax_sparse24._src.prepared_weight.prepare_many` (``preparation.prepare``;
    ``batched``: plan for that batched preparation's lower cost per weight)."""
    op = "prepare_weight"
    v.check_float(w, "w", op)
    v.check_rank(w, 2, op, "w")
    v.check_divisible(w, 0, 4, op, what="w axis (in)")
    v.check_same_shape(w, mask, op, ("w", "mask"))
    autotune.check_request(backend, op)
    v.check_positive_int(tokens, "tokens", op)
    v.check_positive_int(reuse, "reuse", op)
    dtype = jnp.dtype(jnp.result_type(w) if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{op}: dtype must be a floating dtype, got {dtype.name}")
    if transposable is None:
        transposable = _is_transposable(mask, np.shape(w))
    check_mask24(mask, op, transposable=bool(transposable), on_device=bool(check_mask))
    return prepared_weight.plan(jnp.asarray(w), mask, tokens=int(tokens), dtype=dtype, backend=backend,
                                transposable=bool(transposable), reuse=int(reuse), batched=bool(batched))


def _is_transposable(mask, shape) -> bool:
    """Whether a concrete ``mask`` is also 2:4 along ``out`` (False when traced)."""
    if v.is_concrete(mask) and shape[1] % 4 == 0:
        arr = np.asarray(mask) != 0
        return bool(arr.reshape(arr.shape[0], -1, 4).sum(-1).max(initial=0) <= 2)
    return False


def linear_plan(tokens: int, features_in: int, features_out: int, dtype=jnp.bfloat16, *, backend: str = "auto",
                transposable: bool = True, mvue: bool = True, reuse: int | None = None, batched: bool = False,
                fp8: bool = False) -> dict:
    """Which kernel each GEMM of :func:`sparse24_linear` runs for this layer shape on this machine.

    The same choices the op makes at trace time (``backend="auto"``: the measured table
    ``spmm_autotune.json``), without tracing anything — to see whether a model is large enough for
    the sparse kernels (``docs/performance.md``). Under ``jit`` + sharding the op decides on the
    local shard shapes: pass those (e.g. ``tokens`` per device).

    Args:
      tokens: rows of ``x`` per call (all leading axes together).
      features_in, features_out: the weight's ``(in, out)``.
      dtype: compute dtype of the GEMMs.
      backend, transposable: as in :func:`sparse24_linear`.
      mvue: whether a ``key`` is passed (the MVUE weight gradient); without one it is exact dense.
      reuse: plan for a :func:`prepare_weight` shared by ``reuse`` calls (its preparation paid
        once); ``None``: the weight compressed on every call.
      batched: with ``reuse``: the preparation runs batched with the other layers' (``preparation.prepare``'s
        default on one device), which costs less per weight
        (:data:`~jax_sparse24._src.autotune.PREPARE_COST_SHARE`).
      fp8: plan the fp8 GEMMs (``sparse24_linear(..., fp8=True)``): forward and input gradient are
        then ``"cutlass (fp8)"`` (the sparse fp8 kernel) or ``"xla (fp8)"`` (XLA's fp8 dot); the
        weight gradient ``"cutlass (fp8, MVUE)"``, ``"xla (fp8, MVUE)"`` or one of the 16-bit
        labels below (:func:`jax_sparse24._src.autotune.fp8_weight_grad_backend`).

    Returns:
      ``{"forward": k, "input_grad": k, "weight_grad": k}`` with ``k`` one of ``"cutlass"``,
      ``"cusparselt"``, ``"dense"``, ``"reference"``, and for the weight gradient also
      ``"dense (exact)"`` (``xᵀ·∇y``) or ``"<k> (MVUE)"``. Sparse kernels run on CUDA devices only;
      elsewhere every GEMM is the dense reference (``auto`` then plans ``"dense"``).

    >>> plan = linear_plan(8192, 1024, 4096)
    >>> sorted(plan)
    ['forward', 'input_grad', 'weight_grad']
    """
    op = "linear_plan"
    autotune.check_request(backend, op)
    for name, n in (("tokens", tokens), ("features_in", features_in), ("features_out", features_out)):
        v.check_positive_int(n, name, op)
    v.check_positive_int(reuse, "reuse", op, allow_none=True)
    if batched and reuse is None:
        raise ValueError(f"{op}: batched=True plans a prepared weight: pass reuse (calls per preparation, e.g. 1)")
    if features_in % 4:
        raise ValueError(f"{op}: features_in must be a multiple of 4 (2:4 groups), got {features_in}")
    t, i, o = int(tokens), int(features_in), int(features_out)
    if fp8:
        if reuse is not None:
            raise ValueError(f"{op}: fp8=True has no prepared weights (reuse must be None)")
        forward, input_grad = (f"{k} (fp8)" for k in fp8_gemm.plan(backend, t, i, o, transposable=transposable))
    else:
        forward, input_grad = autotune.weight_gemms_plan(backend, t, i, o, dtype, transposable=transposable,
                                                         reuse=None if reuse is None else int(reuse),
                                                         batched=bool(batched))
    fp8_wgrad = autotune.fp8_weight_grad_backend(backend, t, i, o, dtype, mvue=mvue) if fp8 else None
    if fp8_wgrad is not None:
        weight_grad = f"{fp8_wgrad.fp8_label} (fp8, MVUE)"
    elif not mvue:
        weight_grad = autotune.exact_weight_grad_label(backend)
    else:
        weight_grad = autotune.weight_grad_path(backend, o, i, t, dtype).label
    return {"forward": forward, "input_grad": input_grad, "weight_grad": weight_grad}
