"""fp8 (float8_e4m3fn) quantization and the fp8 GEMM: the single definition of the math.

Every fp8 path of the library — the CPU reference, the XLA fallback on a GPU, the CUDA kernels'
tests — computes what this module defines (docs/fp8.md).

* **Format**: ``float8_e4m3fn`` (:data:`FP8_DTYPE`), largest finite value 448 (:data:`FP8_MAX`),
  NaN but no infinity.
* **Scale**: one float32 scalar ``s`` per tensor with ``real ≈ q·s``. *Current scaling*
  (:func:`current_scale`): ``s = amax(|t|) / 448`` over the tensor actually quantized (for a 2:4
  weight: over ``W̃ = W ⊙ M``). ``amax == 0`` (an all-zero tensor) or a non-finite ``amax`` (the
  tensor holds an inf or a NaN) gives ``s = 1``: the quantization is then the identity with
  saturation at ±448 (an inf saturates to ±448, a NaN stays NaN).
  *Delayed scaling* (:func:`delayed_scale`, :func:`update_amax_history`; Flax's
  ``flax.linen.fp8_ops`` recipe): the scale comes from the largest amax of the previous calls kept in
  an amax history, ``s = max(history) / 448`` (the stored scale where that is 0 or not finite, e.g.
  at the first step), and the call writes its own amax into the history for the next one. Values
  above ``448·s`` saturate. State per tensor: :data:`META_NAMES`, in the layer's
  :data:`META_COLLECTION` collection.
* **Quantize** (:func:`quantize`): ``clip(t.astype(f32) * (1/s), -448, 448).astype(float8_e4m3fn)``
  — ``1/s`` is one correctly rounded float32 division, the product one float32 multiplication,
  the cast rounds to nearest even; NaN propagates (``clip`` keeps it, the cast keeps it). XLA's CPU
  lowering and the kernels follow this bit for bit; XLA's GPU lowering rounded 2 of 21M random
  float32 elements to the other fp8 neighbour on the H100 (``scripts/check_xla_quantize.py``).
* **fp8 GEMM** (:func:`scaled_matmul`): ``(Σ_k qa[., k]·qb[k, .] accumulated in float32) · alpha``
  with ``alpha = s_a·s_b`` (one float32 product), rounded once to bfloat16
  (:data:`GEMM_OUT_DTYPE`, what the sparse fp8 kernel writes). Products of two e4m3 values are
  exact in float32, so implementations differ only in the order of the float32 accumulation.

The fp8 2:4 linear layer (``sparse24_linear(..., fp8=True)``, :mod:`jax_sparse24._src.fp8_gemm`):

* forward ``y = scaled_matmul(q(x, s_x), q(W̃, s_w), s_x·s_w)``;
* input gradient ``∇x = scaled_matmul(q(∇y, s_g), q(W̃, s_w)ᵀ, s_g·s_w)`` (``∇y`` in e4m3 with its
  own current scale ``s_g``; ``s_w`` is the forward's);
* the sparse (MVUE) weight gradient ``∇W = scaled_matmul(q(x, s_x)ᵀ, q(MVUE(∇y), s_m), s_x·s_m)``
  with ``s_m = 2·s_g`` (:func:`mvue_scale`): the MVUE sample (each kept value rounded to the
  compute dtype) never exceeds twice ``max |∇y|`` (:data:`MVUE_SCALE_FACTOR`), so its scale comes
  from ``∇y``'s amax without a pass over the sample. ``s_x`` is the forward's. It is written in
  bfloat16 like every fp8 GEMM and cast to the weight's dtype. An exact weight gradient
  (``xᵀ·∇y``, no MVUE) stays in the compute dtype.

Operands are quantized from the compute dtype (``x`` and ``W`` promoted to their result dtype
first, as the 16-bit path does), so a bfloat16 model quantizes bfloat16 values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["FP8_DTYPE", "FP8_MAX", "GEMM_OUT_DTYPE", "MVUE_SCALE_FACTOR", "META_COLLECTION", "META_NAMES",
           "SCALINGS", "amax", "scale_from_amax", "current_scale", "mvue_scale", "delayed_scale",
           "update_amax_history", "check_history_length", "init_meta", "check_meta", "combine_meta", "keep_unupdated", "meta_update",
           "mvue_scale_from", "quantize", "dequantize",
           "scaled_matmul", "check_scale"]

#: The fp8 format of every operand (weights, activations, output gradients).
FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
#: Largest finite float8_e4m3fn value.
FP8_MAX = 448.0
#: dtype the fp8 GEMMs write (the kernel's epilogue: float32 accumulator · alpha, rounded once).
GEMM_OUT_DTYPE = jnp.dtype(jnp.bfloat16)
#: Bound of an MVUE 2:4 sample relative to its input: ``|MVUE(g)| <= 2·max|g|``. A kept value is
#: ``g_k / p_k`` with inclusion probability ``p_k = (a_k/S)(1 + Σ_{m≠k} f(a_m))``, ``a = |g|``,
#: ``S = Σ a`` over the group, ``f(u) = u/(S − u)``. ``f`` is convex, so with ``T = S − a_k``
#: Jensen gives ``Σ_{m≠k} f(a_m) >= 3·f(T/3)`` and ``a_k/p_k <= (a_k+T)(3a_k+2T)/(3a_k+5T)``, which
#: grows with ``a_k`` and ``T``; at ``a_k = M``, ``T = 3M`` (``M = max a``) it is ``2M``: reached for
#: four equal magnitudes, each kept with probability 1/2. The sample is rounded to the input dtype
#: (bfloat16 / float16: ``2M`` is representable and rounding is monotonic, so the bound holds; from
#: float32 the kernel's approximate reciprocal can exceed it by a few ulps, which quantize to 448).
MVUE_SCALE_FACTOR = 2.0


def amax(t):
    """``max |t|`` as a float32 scalar (NaN if ``t`` holds a NaN, 0 for an empty array)."""
    t = jnp.asarray(t)
    if t.size == 0:
        return jnp.zeros((), jnp.float32)
    return jnp.max(jnp.abs(t.astype(jnp.float32)))


def scale_from_amax(a):
    """``a / 448`` in float32; 1 where ``a`` is 0, negative or not finite (see the module docstring)."""
    a = jnp.asarray(a, jnp.float32)
    ok = jnp.isfinite(a) & (a > 0)
    return jnp.where(ok, a / jnp.float32(FP8_MAX), jnp.float32(1.0))


def current_scale(t):
    """The current-scaling scale of ``t``: ``scale_from_amax(amax(t))`` (float32 scalar)."""
    return scale_from_amax(amax(t))


#: The scaling recipes: per-call amax (``"current"``) or an amax history (``"delayed"``).
SCALINGS = ("current", "delayed")
#: The collection of the delayed-scaling state: Flax's ``OVERWRITE_WITH_GRADIENT`` (the "gradient"
#: of these variables is their new value, which the train state writes over them).
META_COLLECTION = "_overwrite_with_gradient"
#: The delayed-scaling state of one fp8 layer (Flax's ``Fp8DotGeneralBase`` names): a scale (shape
#: (1,)) and an amax history (shape (L,)) for the input ``x``, the kernel ``W̃`` and the output
#: gradient ``∇y``.
META_NAMES = ("input_scale", "input_amax_history", "kernel_scale", "kernel_amax_history",
              "output_grad_scale", "output_grad_amax_history")
_OPERANDS = ("input", "kernel", "output_grad")


def delayed_scale(scale, amax_history):
    """The delayed-scaling scale (float32 scalar): ``max(amax_history) / 448`` over the history's
    finite entries — Flax's ``compute_scale`` for a finite history — else ``scale`` (the stored one,
    e.g. at the first step, whose history is all zeros), else 1 where the stored scale is 0 or not
    finite (a state zeroed by a step that gave its layer no gradient).

    Unlike Flax, an inf or NaN amax in the history is skipped instead of making the stored scale
    stick for the whole history window (one overflowing step would otherwise freeze the scale for
    ``len(history)`` steps).
    """
    h = jnp.asarray(amax_history, jnp.float32)
    a = jnp.max(jnp.where(jnp.isfinite(h), h, jnp.float32(0)))
    prev = check_scale(jnp.reshape(scale, ()), "delayed_scale", "scale")
    prev = jnp.where(jnp.isfinite(prev) & (prev > 0), prev, jnp.float32(1))
    return jnp.where(a > 0, a / jnp.float32(FP8_MAX), prev)


def update_amax_history(amax_history, a):
    """The history after a call whose tensor had amax ``a``: rolled by one, ``a`` written at index 0
    (Flax's ``compute_amax_history``; every entry counts equally in :func:`delayed_scale`)."""
    h = jnp.asarray(amax_history, jnp.float32)
    return jnp.roll(h, -1, axis=0).at[0].set(jnp.asarray(a, jnp.float32))


def check_history_length(n, op: str, name: str = "history_length") -> int:
    """``n`` as a Python int: a positive int (or numpy integer, not a bool); ValueError otherwise."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {n!r}")
    return int(n)


def init_meta(history_length: int = 1024) -> dict:
    """A fresh delayed-scaling state: scales 1, histories of zeros (the first call then quantizes with
    scale 1, as Flax's fp8 layers do)."""
    history_length = check_history_length(history_length, "init_meta")
    return {n: (jnp.ones((1,), jnp.float32) if n.endswith("_scale") else jnp.zeros((history_length,), jnp.float32))
            for n in META_NAMES}


def check_meta(meta, op: str) -> dict:
    """``meta`` as a dict of float32 arrays with :data:`META_NAMES` (scales (1,) or (), histories
    1-D and non-empty); ValueError naming the problem otherwise."""
    if not hasattr(meta, "keys") or set(meta.keys()) != set(META_NAMES):
        got = sorted(meta.keys()) if hasattr(meta, "keys") else type(meta).__name__
        raise ValueError(f"{op}: fp8_meta must be a dict with the keys {list(META_NAMES)} (the delayed-scaling "
                         f"state of one layer, fp8.init_meta()), got {got}")
    out = {}
    for n in META_NAMES:
        a = meta[n]
        shape, dtype = tuple(jnp.shape(a)), jnp.result_type(a)
        if not jnp.issubdtype(dtype, jnp.floating) or dtype == FP8_DTYPE:
            raise ValueError(f"{op}: fp8_meta[{n!r}] must be float32, got dtype {dtype}")
        if n.endswith("_scale") and shape not in ((), (1,)):
            raise ValueError(f"{op}: fp8_meta[{n!r}] must have shape (1,), got {shape}")
        if n.endswith("_history") and (len(shape) != 1 or shape[0] < 1):
            raise ValueError(f"{op}: fp8_meta[{n!r}] must be 1-D and non-empty, got shape {shape}")
        out[n] = jnp.asarray(a).astype(jnp.float32)
    return out


def combine_meta(a: dict, b: dict) -> dict:
    """Two updates of the same delayed-scaling state (e.g. from the micro-batches of one step, whose
    "gradients" must not be summed): the elementwise maximum — the scales are equal (the same prior
    history) and each history gets the larger of the two new amaxes.

    Within one differentiated function JAX sums the cotangents of a variable that is used twice, so a
    delayed-scaling layer must be called once per loss evaluation (no weight tying or reuse of the
    same layer within a step); accumulate micro-batches outside ``grad`` and combine them with this.
    """
    return jax.tree.map(jnp.maximum, a, b)


def keep_unupdated(old, new, prefix: str = ""):
    """``new`` (the gradient of a loss with respect to a delayed-scaling state tree), except that a
    layer whose new scales are all 0 — its output did not reach the loss, so its "gradient" is zero —
    keeps its ``old`` state instead of being zeroed. Trees of layers' dicts keyed ``prefix`` +
    :data:`META_NAMES` (a real update's scales are never 0: :func:`delayed_scale`)."""
    names = [prefix + n for n in META_NAMES]

    def is_layer(t):
        return hasattr(t, "keys") and set(t.keys()) == set(names)

    def pick(o, n):
        if not is_layer(o):
            return n
        # one flag per layer: a layer's scale is one number, so a stack of layers (nn.scan's leading
        # axis) has as many as its scales have entries
        got = jnp.any(jnp.stack([jnp.reshape(n[f"{prefix}{op}_scale"], (-1,)) != 0 for op in _OPERANDS]), axis=0)
        per_layer = lambda k: jnp.reshape(  # noqa: E731
            jnp.where(got[:, None], jnp.reshape(n[k], (got.shape[0], -1)), jnp.reshape(o[k], (got.shape[0], -1))),
            jnp.shape(o[k]))
        return {k: per_layer(k) for k in names}

    return jax.tree.map(pick, old, new, is_leaf=is_layer)


def meta_update(meta: dict, scales: dict, amaxes: dict) -> dict:
    """The new delayed-scaling state after a call that used ``scales[op]`` and saw ``amaxes[op]``
    (``op`` in input / kernel / output_grad): what the layer returns as the "gradient" of its state."""
    out = {}
    for op in _OPERANDS:
        s = meta[f"{op}_scale"]
        out[f"{op}_scale"] = jnp.reshape(scales[op], jnp.shape(s)).astype(jnp.float32)
        out[f"{op}_amax_history"] = update_amax_history(meta[f"{op}_amax_history"], amaxes[op])
    return out


def mvue_scale(g):
    """The scale of ``q(MVUE(g))``: ``MVUE_SCALE_FACTOR · current_scale(g)`` (float32 scalar).

    Exact in float32 (a power of two); with ``g`` all zero or not finite it is 2 (the sample is then
    all zero, or carries the NaN / saturates as :func:`quantize` says).
    """
    return mvue_scale_from(current_scale(g))


def mvue_scale_from(s_g):
    """The scale of ``q(MVUE(∇y))`` from ``∇y``'s scale ``s_g`` (current or delayed)."""
    return jnp.float32(MVUE_SCALE_FACTOR) * s_g


def check_scale(s, op: str, name: str = "scale"):
    """A float scalar (shape ``()`` or one element) as a float32 ``()`` array; ValueError otherwise."""
    shape = tuple(jnp.shape(s))
    dtype = jnp.result_type(s)
    if not jnp.issubdtype(dtype, jnp.floating) or dtype == FP8_DTYPE:
        raise ValueError(f"{op}: `{name}` must be a float32 (or other 16/32/64-bit float) scalar, got dtype {dtype}")
    if len(shape) > 1 or (shape and shape[0] != 1):
        raise ValueError(f"{op}: `{name}` must be a scalar (shape ()), got shape {shape}")
    return jnp.asarray(s).astype(jnp.float32).reshape(())


def quantize(t, s):
    """``clip(t·(1/s), -448, 448)`` rounded to float8_e4m3fn (nearest even); NaN stays NaN.

    Args:
      t: a floating-point array (bfloat16, float16, float32, float64).
      s: its scale, a float32 scalar (``real ≈ q·s``), e.g. :func:`current_scale` of ``t``. A
        scale of 0, a negative one or a non-finite one is not checked (it is a traced value):
        :func:`scale_from_amax` never makes one.

    >>> import jax.numpy as jnp
    >>> quantize(jnp.array([1.0, 3.3, -1000.0, jnp.nan]), jnp.float32(0.5)).astype(jnp.float32)
    Array([   2. ,    6.5, -448. ,    nan], dtype=float32)
    """
    dtype = jnp.result_type(t)
    if not jnp.issubdtype(dtype, jnp.floating) or dtype == FP8_DTYPE:
        raise ValueError(f"quantize: `t` must be a bfloat16/float16/float32/float64 array, got dtype {dtype}")
    s = check_scale(s, "quantize", "s")
    inv = jnp.float32(1.0) / s
    scaled = jnp.asarray(t).astype(jnp.float32) * inv
    return jnp.clip(scaled, -FP8_MAX, FP8_MAX).astype(FP8_DTYPE)


def dequantize(q, s, dtype=jnp.float32):
    """``q·s`` in float32, cast to ``dtype``."""
    return (jnp.asarray(q).astype(jnp.float32) * check_scale(s, "dequantize", "s")).astype(dtype)


def scaled_matmul(qa, qb, alpha, *, transpose_b: bool = False):
    """``(qa @ qb) · alpha`` with float32 accumulation, rounded once to bfloat16.

    ``qa`` (n, k) and ``qb`` (k, m) (or (m, k) with ``transpose_b``) are float8_e4m3fn; ``alpha``
    is the product of their scales (float32 scalar). XLA runs the dot with float32 accumulation
    (on a CPU it converts the operands to float32 exactly; on a GPU it may use an fp8 GEMM).
    """
    for name, q in (("qa", qa), ("qb", qb)):
        if jnp.result_type(q) != FP8_DTYPE or jnp.ndim(q) != 2:
            raise ValueError(f"scaled_matmul: `{name}` must be a 2-D float8_e4m3fn array, got "
                             f"{jnp.result_type(q)} {tuple(jnp.shape(q))}")
    alpha = check_scale(alpha, "scaled_matmul", "alpha")
    dims = (((1,), (1,)), ((), ())) if transpose_b else (((1,), (0,)), ((), ()))
    acc = lax.dot_general(qa, qb, dims, preferred_element_type=jnp.float32)
    return (acc * alpha).astype(GEMM_OUT_DTYPE)
