"""Sharding rules: how every 2:4 op and GEMM partitions under ``jit`` + ``NamedSharding`` and ``shard_map``.

Why ``custom_partitioning`` (and not ``shard_map`` inside the op)
------------------------------------------------------------------
An XLA custom call is opaque to the SPMD partitioner: left alone, XLA all-gathers its operands
and runs it redundantly on every device. Two ways to tell it otherwise:

* ``shard_map`` inside the op needs the mesh and the operand shardings at *trace* time. Under
  ``jit(..., in_shardings=...)`` with auto axes neither is known while tracing (shardings are
  decided later by propagation), so the op would have to guess or force a layout.
* ``jax.experimental.custom_partitioning`` is called back by the partitioner *after*
  propagation with the shardings it chose, and lets the op pick the final operand/result
  shardings and a per-shard lowering (with collectives). That is what we use.

Every public op is ``ffi.per_platform(reference_fn, cuda_fn, *args)``; :func:`partitioned_per_platform`
wraps *that* function — the thing that lowers to the reference on CPU and to the FFI custom
call on CUDA — in one ``custom_partitioning``. The per-shard lowering calls the same
per-platform function on the local shards, so a CPU test of the partitioning exercises exactly
the code that wraps the custom call on a GPU.

Both partitioners are supported from one :class:`Rule`: it gives each operand/result dimension a
*factor* name (einsum-like) and is turned into a Shardy ``SdyShardingRule`` (Shardy is the
default partitioner in jax 0.10/0.11, ``jax_use_shardy_partitioner``) and into GSPMD's
``infer_sharding_from_operands`` callback. The ``partition`` callback is shared: it reads the
shardings the partitioner proposes, assigns mesh axes to factors (weight operands first, so a
weight is never moved to match an activation), checks the 2:4 constraint and returns the per-shard
function:

* a factor that is summed over (``contract``, the GEMM contraction axis) may be sharded; the
  per-shard function then ends with a ``psum`` over those mesh axes (Megatron row-parallel);
* a factor with ``multiple_of=4`` (the axis of 4-groups, and the kernel's alignment) must leave
  every shard a multiple of 4: a 4-group is never split across devices. Otherwise the
  ``partition`` callback raises ``ValueError`` naming the mesh axes and sizes (XLA reports it
  while compiling, wrapped in a ``JaxRuntimeError`` whose text carries the ``ValueError``).
  This check lives in the callback, not in the Shardy rule (a compound-factor encoding of the
  4-groups could make Shardy quietly re-replicate a bad user sharding instead of reporting it);
* a factor that cannot be split evenly (and has no 4-group constraint) is replicated;
* PRNG-key operands are replicated; for MVUE the key is folded with the index of the shard of
  the data operand (so shards draw independent samples; see :func:`mvue_rule`).

Inside ``shard_map`` (all mesh axes manual) ``custom_partitioning`` lowers to the per-platform
function on the local block directly — the explicit mode needs no rule; only the MVUE key fold
is applied at trace time from the operand's varying manual axes, so ``shard_map`` and auto
sharding draw the same samples. ``sparse24_linear`` casts its operands to the union of their
varying axes (:func:`vary_to_union`) so its ``custom_vjp`` cotangents type-check in ``shard_map``.

With ``Explicit`` mesh axes (sharding in types; ``jax.make_mesh``'s default in jax 0.10) the
operand shardings *are* known at trace time, so there the same plan (axis assignment, 4-group
check — a plain ``ValueError`` while tracing — psum, key fold) runs as a ``shard_map`` inside the
op — the one place where "``shard_map`` inside the op" is the right tool.

``custom_partitioning`` has no autodiff or batching rule of its own, so :func:`partitioned`
adds a ``custom_jvp`` (tangents from the plain-``jnp`` reference, as before) and a
``custom_vmap`` (the batch dimension becomes one more pass-through factor, so ops stay
partitioned under ``vmap``). With a single device in the process the op is called directly,
inside the same ``custom_jvp``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import math
import os
import types
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sparse24._src import ffi, packed24
from jax_sparse24._src.ffi import _varying_axes, vary_to_union  # noqa: F401  (re-exported)

__all__ = [
    "Rule",
    "partitioned",
    "partitioned_per_platform",
    "grouped_rule",
    "transposable_rule",
    "mvue_rule",
    "gemm_rule",
    "partitioned_gemm",
    "vary_to_union",
    "eval_shape",
    "weight_gather",
    "WEIGHT_GATHERS",
]

GROUP = 4  # a 2:4 group: 4 consecutive elements along the contraction axis


#: How a 2:4 GEMM gathers an FSDP-sharded weight: ``"packed"`` (values + mask bits, by the op) or
#: ``"dense"`` (the weight and its ``bool`` mask, by XLA before the op).
WEIGHT_GATHERS = ("packed", "dense")
# A jit-cache-sensitive context: a function traced under one mode is traced again under the other.
_WEIGHT_GATHER = jax.make_user_context(default_value="packed")


@contextlib.contextmanager
def weight_gather(mode: str):
    """Within the block, 2:4 GEMMs gather a weight sharded over their token axes (FSDP) as ``mode``:
    ``"packed"`` (the default: each device packs its shard of ``w ⊙ mask`` -- kept values and mask
    bits, 0.5625 of the bfloat16 weight's bytes -- the op all-gathers that and unpacks it; exact) or
    ``"dense"`` (XLA all-gathers the weight and its ``bool`` mask before the op: 1.5 times the
    bfloat16 weight's bytes). The mode is part of ``jax.jit``'s cache key: a jitted function called
    (or lowered) inside the block is traced for that mode; like JAX's own contexts it holds for the
    thread that entered the block. Both modes give the same result for a 2:4 mask; a mask that keeps
    more than two of a group (possible only with ``check_mask=False``) keeps its first two when packed."""
    if mode not in WEIGHT_GATHERS:
        raise ValueError(f"weight_gather: mode must be one of {WEIGHT_GATHERS}, got {mode!r}")
    with _WEIGHT_GATHER(mode):
        yield


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one op partitions: a factor name per dimension of every (flat) operand and result.

    Attributes:
      name: op name used in error messages.
      operands: per flat operand, one factor name per dimension (a typed PRNG key of shape ``S``
        is labelled by ``S``'s dimensions only; its key-data dimensions are added internally).
      results: per flat result, one factor name per dimension.
      contract: factors summed over by the op (they appear in no result); sharding one makes the
        per-shard op end with a ``psum`` over its mesh axes.
      multiple_of: ``((factor, m), ...)``: each shard of ``factor`` must hold a multiple of ``m``
        elements (4-groups, kernel alignment) — else ``ValueError``.
      replicated: factors never sharded (PRNG key data).
      priority: operand indices in the order in which their shardings decide a factor's mesh
        axes (weights first); the remaining operands, then the results, follow.
      fold_key: ``(key_operand, data_operand)``: fold the key with the index of the data
        operand's shard, so different shards draw different random numbers.
      tangent: optional ``(primals, primal_out, tangents) -> tangent_out`` used by the JVP instead
        of differentiating the reference.
      tokens_first: factors of activations only (the GEMMs' token axis ``t``) whose mesh axes are
        assigned before ``priority``'s weights: a mesh axis that shards the tokens keeps them
        sharded, and a weight sharded over the same axis (FSDP / ZeRO-3: weights and batch split
        over one axis) is gathered for the op -- instead of the activations being resharded to
        match the weight (an all-to-all of activations and a psum of the output). Weights still
        decide every other factor (Megatron's column/row split over an axis the tokens do not use).
      gathered_weight: ``(w, mask)`` operand positions of a 2:4 weight ``(..., i, o)`` and its mask.
        Where the weight is sharded over a mesh axis the op needs it whole on (FSDP: the axis went
        to the tokens), the per-shard function gathers it itself, packed
        (:mod:`jax_sparse24._src.packed24`: 0.5625 of the bfloat16 weight's bytes instead of 1.5 for
        weight and mask), unless :func:`weight_gather` says ``"dense"`` when the op is traced.
      packed_weight: the op's function takes a weight gathered packed as it arrived: a
        :class:`~jax_sparse24._src.packed24.Packed24` in the weight's position and ``None`` in the
        mask's (its sparse GEMMs compress the encoding directly). Otherwise the per-shard function
        unpacks it into ``(w ⊙ mask, mask)`` first.
    """

    name: str
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    contract: tuple[str, ...] = ()
    multiple_of: tuple[tuple[str, int], ...] = ()
    replicated: tuple[str, ...] = ()
    priority: tuple[int, ...] = ()
    fold_key: tuple[int, int] | None = None
    tangent: Callable | None = dataclasses.field(default=None, compare=False)
    tokens_first: tuple[str, ...] = ()
    gathered_weight: tuple[int, int] | None = None
    packed_weight: bool = False

    def multiple(self, factor: str) -> int:
        return dict(self.multiple_of).get(factor, 1)

    def batched(self, flags: Sequence[bool]) -> "Rule":
        """The rule of ``vmap`` of this op: batched operands and all results gain a leading factor. Where
        an activation (an operand with a ``tokens_first`` factor) is batched, the new factor is one of
        its token axes too: a mesh axis splitting it stays there and a weight split over it is gathered."""
        used = {f for dims in self.operands + self.results for f in dims}
        k = 0
        while f"vb{k}" in used:
            k += 1
        b = f"vb{k}"
        ops = tuple((b,) + dims if flag else dims for dims, flag in zip(self.operands, flags))
        batched_tokens = any(flag and set(dims) & set(self.tokens_first) for dims, flag in zip(self.operands, flags))
        return dataclasses.replace(self, operands=ops, results=tuple((b,) + d for d in self.results),
                                   tangent=None,
                                   tokens_first=self.tokens_first + ((b,) if batched_tokens else ()))


def grouped_rule(name: str, ndim: int, axis: int, n_results: int = 1) -> Rule:
    """Elementwise over 4-groups along ``axis`` (mask24, soft_threshold24): any sharding whose
    shard along ``axis`` is a multiple of 4."""
    dims = tuple(f"d{k}" for k in range(ndim))
    return Rule(name, (dims,), (dims,) * n_results, multiple_of=((dims[axis % ndim], GROUP),) if ndim else ())


def transposable_rule(name: str = "transposable_mask24") -> Rule:
    """4×4 blocks of a 2-D array: shards must be multiples of 4 along both axes."""
    return Rule(name, (("r", "c"),), (("r", "c"),), multiple_of=(("r", GROUP), ("c", GROUP)))


def _mvue_tangent(axis):
    from jax_sparse24._src import reference_ops

    def tangent(primals, out, tangents):
        # d/dx of x_i / p_i(|x| + eps) at the kept positions (those the primal kept non-zero): the
        # derivative the reference has, taken from the primal's own sample so it matches the
        # primal whichever key (folded per shard) or kernel drew it.
        _, x = primals
        _, dx = tangents
        kept = out != 0

        def f(x):
            g = reference_ops._grouped(x.astype(jnp.float32), axis % x.ndim, 4)
            p = reference_ops.mvue24_inclusion_probabilities(jnp.abs(g) + reference_ops.MVUE_EPS)
            return reference_ops._ungrouped(g / p, axis % x.ndim, x.shape).astype(x.dtype)

        _, t = jax.jvp(f, (x,), (dx,))
        return jnp.where(kept, t, jnp.zeros((), t.dtype))

    return tangent


def mvue_rule(key, ndim: int, axis: int) -> Rule:
    """MVUE: elementwise over 4-groups along ``axis``; the key is replicated and folded with the
    index of the data shard (mesh axes in mesh order, row-major), so every block of ``x`` draws its
    own sample — the same under auto sharding and in ``shard_map``. With ``x`` unsharded the key
    is used as is (the single-device result)."""
    kdims = () if _is_typed_key(key) else tuple(f"k{j}" for j in range(np.ndim(key)))
    dims = tuple(f"d{k}" for k in range(ndim))
    return Rule("mvue24", (kdims, dims), (dims,), multiple_of=((dims[axis % ndim], GROUP),),
                replicated=kdims, fold_key=(0, 1), tangent=_mvue_tangent(axis))


def gemm_rule(kind: str, *, transposable: bool = False, sparse_tokens: bool = False,
              align: int = GROUP, packed_weight: bool = False) -> Rule:
    """Rule of the three GEMMs of a 2:4 linear layer (operands as in ``gemm.py``).

    * ``forward``     ``x (t,i), w (i,o), mask (i,o) -> y (t,o)``, contraction ``i`` (2:4 axis);
    * ``input_grad``  ``g (t,o), w (i,o), mask (i,o) -> dx (t,i)``, contraction ``o`` (2:4 when
      ``transposable``);
    * ``weight_grad`` ``x (t,i), g (t,o) -> dw (i,o)``, contraction ``t`` (2:4 when ``g`` is the
      MVUE estimate and the kernel is sparse: ``sparse_tokens``).

    ``w`` sharded on ``o`` gives ``y`` sharded on ``o`` (column parallel); ``w`` sharded on ``i``
    gives per-shard partial sums and a ``psum`` (row parallel); tokens sharded stay sharded (data
    parallel; ``weight_grad`` then ends with the data-parallel ``psum``). A mesh axis that shards
    both the tokens and the weight (FSDP) stays on the tokens and the weight is gathered over it
    (``Rule.tokens_first``) -- packed, by the per-shard function (``Rule.gathered_weight``,
    :func:`weight_gather`). ``align`` is the
    multiple every shard of a 2:4 axis must hold (4, or the sparse kernel's alignment).

    ``packed_weight``: ``forward`` / ``input_grad`` whose function takes a weight gathered packed as a
    :class:`~jax_sparse24._src.packed24.Packed24` (``Rule.packed_weight``).
    """
    if packed_weight and kind not in ("forward", "input_grad"):
        raise ValueError(f"gemm_rule: packed_weight applies to 'forward' and 'input_grad', got {kind!r}")
    if kind == "forward":
        return Rule("sparse24 forward GEMM", (("t", "i"), ("i", "o"), ("i", "o")), (("t", "o"),),
                    contract=("i",), multiple_of=(("i", align),), priority=(1, 2, 0), tokens_first=("t",),
                    gathered_weight=(1, 2), packed_weight=packed_weight)
    if kind == "input_grad":
        mult = (("i", align), ("o", align)) if transposable else (("i", align),)
        return Rule("sparse24 input-gradient GEMM", (("t", "o"), ("i", "o"), ("i", "o")), (("t", "i"),),
                    contract=("o",), multiple_of=mult, priority=(1, 2, 0), tokens_first=("t",),
                    gathered_weight=(1, 2), packed_weight=packed_weight)
    if kind == "weight_grad":
        return Rule("sparse24 weight-gradient GEMM", (("t", "i"), ("t", "o")), (("i", "o"),),
                    contract=("t",), multiple_of=(("t", align),) if sparse_tokens else ())
    raise ValueError(f"gemm_rule: kind must be 'forward', 'input_grad' or 'weight_grad', got {kind!r}")


def prepared_gemm_rule(kind: str, label: str, operand_dims: tuple, *, transposable: bool = False,
                       align: int = GROUP) -> Rule:
    """:func:`gemm_rule` of ``forward`` / ``input_grad`` with the weight's compressed operand appended
    (``prepared_weight.forward_prepared``): one operand per entry of ``operand_dims`` (its dimension
    labels: a backend's ``operand_dims``; ``label`` names the backend in the rule's name). The operand
    is the compression of the *whole* weight (its metadata layout does not slice into per-shard
    operands), so ``i`` and ``o`` stay replicated: a tensor-parallel weight is gathered (correct,
    unsharded GEMM); tokens may be sharded."""
    if kind not in ("forward", "input_grad"):
        raise ValueError(f"prepared_gemm_rule: applies to 'forward' and 'input_grad', got {kind!r}")
    if not operand_dims:
        raise ValueError(f"prepared_gemm_rule: the {label!r} backend has no prepared operand")
    base = gemm_rule(kind, transposable=transposable, align=align)
    return dataclasses.replace(base, name=base.name + f" (prepared {label} weight)",
                               operands=base.operands + tuple(operand_dims), contract=(),
                               replicated=("i", "o") + tuple(d for dims in operand_dims for d in dims),
                               gathered_weight=None)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _is_typed_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _spec_axes(spec, dim: int) -> tuple[str, ...]:
    if spec is None or dim >= len(spec):
        return ()
    entry = spec[dim]
    if entry is None:
        return ()
    if isinstance(entry, (tuple, list)):
        return tuple(a for a in entry if a is not None)
    if isinstance(entry, str):
        return (entry,)
    return ()  # UNCONSTRAINED and friends


def _sharding_spec(sharding):
    return getattr(sharding, "spec", None)


def _entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _describe(labels, shape) -> str:
    return "(" + ", ".join(f"{l}={s}" for l, s in zip(labels, shape)) + ")"


def _assign_axes(rule: Rule, mesh, operand_labels, operand_shapes, operand_specs, result_specs,
                 *, strict: bool):
    """Map each factor to a tuple of mesh axes, from the proposed operand and result shardings."""
    sizes: dict[str, int] = {}
    where: dict[str, str] = {}
    for k, (labels, shape) in enumerate(zip(operand_labels, operand_shapes)):
        for d, (lab, size) in enumerate(zip(labels, shape)):
            sizes.setdefault(lab, int(size))
            where.setdefault(lab, f"dimension {d} of operand {k} {_describe(labels, shape)}")
    mesh_shape = dict(mesh.shape)
    n_ops = len(operand_labels)
    order = list(rule.priority) + [k for k in range(n_ops) if k not in rule.priority]
    candidates = [(operand_labels[k], operand_specs[k]) for k in order]
    candidates += list(zip(rule.results, result_specs))
    assign: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    # every (factor, proposed spec, dimension) in decision order: the tokens_first factors of every
    # operand and result, then all factors (weights first, by priority)
    visits = [(lab, spec, d) for labels, spec in candidates for d, lab in enumerate(labels)]
    if rule.tokens_first:
        visits = [v for v in visits if v[0] in rule.tokens_first] + visits
    for lab, spec, d in visits:
        if lab in assign or lab in rule.replicated or lab not in sizes:
            continue
        axes = tuple(a for a in _spec_axes(spec, d) if a not in used and a in mesh_shape)
        if not axes:
            continue
        n = math.prod(mesh_shape[a] for a in axes)
        size, m = sizes[lab], rule.multiple(lab)
        if size % (n * m):
            if m > 1 and strict:
                per = f"{size // n}" if size % n == 0 else f"{size}/{n} (uneven)"
                raise ValueError(
                    f"{rule.name}: {where[lab]} has size {size} and is sharded {n} ways over mesh "
                    f"axes {axes} (sizes {tuple(mesh_shape[a] for a in axes)}), leaving {per} "
                    f"elements per device; every shard must hold a multiple of {m} (2:4 groups of "
                    f"{GROUP} consecutive elements are never split across devices, and the kernel "
                    f"needs {m}-aligned shards). Shard this dimension over fewer devices, shard "
                    f"another dimension, or make its size a multiple of {n * m}."
                )
            if size % n or m > 1:
                continue  # cannot split evenly: keep this factor replicated
        assign[lab] = axes
        used.update(axes)
    return assign


def _packed_gathers(rule: Rule, mesh, shapes, arg_specs, assign) -> dict[int, tuple[str, ...]]:
    """The mesh axes, per dimension of ``rule.gathered_weight``'s weight, over which the per-shard
    function gathers the weight itself (packed): the axes of the proposed sharding that the plan
    did not give the weight's factors (they went to the tokens). Only where the packed shards
    concatenate into the packed whole: the mask sharded as the weight, the gathered axes the minor
    part of a dimension's sharding, and whole 8-row blocks (:data:`packed24.PACK_ROWS`) per shard of
    the packed axis ``i``. Otherwise ``{}``: XLA gathers weight and mask before the op."""
    wpos, mpos = rule.gathered_weight
    labels, shape = rule.operands[wpos], shapes[wpos]
    if rule.operands[mpos] != labels or shapes[mpos] != shape or len(shape) < 2:
        return {}
    mesh_shape = dict(mesh.shape)

    def axes(pos: int, d: int) -> tuple[str, ...]:  # the mesh axes proposed for dimension d of operand pos
        return tuple(a for a in _spec_axes(arg_specs[pos], d) if a in mesh_shape)

    gathers: dict[int, tuple[str, ...]] = {}
    for d, lab in enumerate(labels):
        proposed = axes(wpos, d)
        if proposed != axes(mpos, d):
            return {}
        kept = assign.get(lab, ())
        if proposed[:len(kept)] != kept:
            return {}  # the plan moves the weight's sharding: leave that to XLA
        extra = proposed[len(kept):]
        if extra:
            if d < len(shape) - 2:
                return {}  # only the weight's own two axes are gathered here
            gathers[d] = extra
    if not gathers:
        return {}
    rows_split, cols_split = (math.prod(mesh_shape[a] for a in axes(wpos, d)) for d in (len(shape) - 2, len(shape) - 1))
    if shape[-2] % rows_split or not packed24.packable(shape[-2] // rows_split) or shape[-1] % cols_split:
        return {}  # uneven shards, or rows a shard cannot pack
    return gathers


def _gather_packed(w, mask, gathers: Mapping[int, tuple[str, ...]], *, keep_packed: bool = False):
    """The per-shard side of :func:`_packed_gathers`: pack this device's block of ``w ⊙ mask``,
    all-gather the packed arrays over each dimension's axes; unpack into ``(w ⊙ mask, mask)``, or
    with ``keep_packed`` return ``(Packed24, None)`` (``Rule.packed_weight``)."""
    values, bits = packed24.pack24(w, mask)
    for d, axes in sorted(gathers.items()):
        values = lax.all_gather(values, axes, axis=d, tiled=True)
        bits = lax.all_gather(bits, axes, axis=d, tiled=True)
    if keep_packed:
        return packed24.Packed24(values, bits), None
    return packed24.unpack24(values, bits)


def _specs_for(labels_list, assign):
    return [P(*(_entry(assign.get(l, ())) for l in labels)) for labels in labels_list]


def _vma_tracked(manual: frozenset) -> bool:
    """Inside ``shard_map``: whether JAX tracks the varying axes of values (``check_vma=True``);
    with ``check_vma=False`` every value reads as varying over no axis, ``axis_index`` included."""
    return bool(_varying_axes(lax.axis_index(sorted(manual)[0])))


def _block_index(axes: Sequence[str], sizes: Mapping[str, int]):
    idx = jnp.zeros((), jnp.uint32)
    for a in axes:
        idx = idx * jnp.uint32(sizes[a]) + lax.axis_index(a).astype(jnp.uint32)
    return idx


def _fold(key, idx):
    """Fold ``idx`` into a (typed or raw, possibly batched) key."""
    fold = jax.random.fold_in
    for _ in range(np.ndim(key) - (0 if _is_typed_key(key) else 1)):
        fold = jax.vmap(fold, in_axes=(0, None))
    return fold(key, idx)


def manual_axes() -> frozenset:
    """The mesh axes of the enclosing ``shard_map`` (with or without ``check_vma``); empty outside."""
    try:
        return frozenset(jax.sharding.get_abstract_mesh().manual_axes or ())
    except Exception:  # pragma: no cover - a JAX without abstract meshes
        return frozenset()


def eval_shape(fn, *args):
    """``jax.eval_shape`` on the arguments' shapes and dtypes only (trace-time validation).

    Drops the sharding from the abstract values, so checks written in plain ``jnp`` (reshapes
    into 4-groups) also run for operands whose type carries ``Explicit`` mesh axes.
    """
    def sds(a):
        dtype = a.dtype if hasattr(a, "dtype") else jnp.result_type(a)
        return jax.ShapeDtypeStruct(np.shape(a), dtype)

    return jax.eval_shape(fn, *(sds(a) for a in args))


def _explicit_mesh(args):
    """The abstract mesh when an operand's type carries ``Explicit`` mesh axes (else ``None``)."""
    for a in args:
        try:
            sh = getattr(jax.typeof(a), "sharding", None)
        except Exception:  # pragma: no cover
            continue
        mesh = getattr(sh, "mesh", None)
        if mesh is None or getattr(mesh, "empty", True):
            continue
        if getattr(mesh, "explicit_axes", ()) and not getattr(mesh, "manual_axes", ()):
            return mesh
    return None


def like_primal(ct, primal):
    """``ct`` with ``primal``'s sharding where that is part of its type (``Explicit`` mesh axes): a
    ``custom_vjp`` cotangent must have its primal's type there (a weight gradient that the GEMM's
    per-shard function returns replicated is resharded to the weight's FSDP sharding, i.e. reduced
    and sliced). ``None`` and arrays without explicit axes pass through."""
    if ct is None or primal is None or _explicit_mesh([primal]) is None:
        return ct
    sh = jax.typeof(primal).sharding
    return ct if jax.typeof(ct).sharding == sh else jax.sharding.reshard(ct, sh)


def _vmapped_mesh_axes() -> set:
    """Explicit mesh axes taken by an enclosing ``vmap(..., spmd_axis_name=...)`` (private API)."""
    try:
        from jax._src import core as _core

        return set(getattr(_core.get_axis_env(), "explicit_mesh_axis_names", ()) or ())
    except Exception:  # pragma: no cover
        return set()


def _only_axes(spec, keep: set):
    entries = []
    for d in range(len(spec)):
        axes = tuple(a for a in _spec_axes(spec, d) if a in keep)
        entries.append(_entry(axes))
    return P(*entries)


def _single_device() -> bool:
    try:
        return jax.device_count() == 1
    except RuntimeError:  # pragma: no cover
        return True


def whole_on_each_device(x) -> bool:
    """True when it is known at trace time that every device holding ``x`` holds all of it: a concrete
    fully replicated (e.g. single-device) array, a local block inside ``shard_map`` (all mesh axes
    manual), or ``Explicit`` mesh axes with no dimension sharded. False when that is not known while
    tracing (``Auto`` axes: the partitioner decides later)."""
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return bool(x.sharding.is_fully_replicated)
    try:
        sh = jax.typeof(x).sharding
    except Exception:  # pragma: no cover
        return False
    mesh = getattr(sh, "mesh", None)
    if mesh is None or getattr(mesh, "empty", True):
        return False
    names = set(mesh.axis_names)
    manual, explicit = set(getattr(mesh, "manual_axes", ())), set(getattr(mesh, "explicit_axes", ()))
    if names <= manual:
        return True
    if not names <= manual | explicit:
        return False
    spec = sh.spec
    return not any(a in explicit for d in range(len(spec)) for a in _spec_axes(spec, d))


def unpartitioned_batch_ok(arrays) -> bool:
    """Whether one custom call without a partitioning rule may take all of ``arrays`` at once with the
    same effect as one call per array: on a single device, or where every array is known whole on
    each device (:func:`whole_on_each_device`). Such a call, like each per-array one, makes the
    partitioner gather its operands whole; but one call over differently sharded arrays gathers them
    all together (the peak memory of a fully sharded model), so elsewhere callers keep one call per
    array. ``preparation.prepare(batch="auto")`` asks this."""
    return _single_device() or all(whole_on_each_device(a) for a in arrays)


_DEF_PARTITION_PARAMS = frozenset(inspect.signature(custom_partitioning.def_partition).parameters)

# --------------------------------------------------------------------------------------------
# One partition result per distinct op instance and compile
# --------------------------------------------------------------------------------------------
#
# XLA's partitioner calls a custom_partitioning op back once per *instance*: JAX then calls ``partition``,
# traces the per-shard function it returns (``make_jaxpr``), lowers that to a StableHLO module and serializes
# it, and XLA parses the module and inlines it. An unrolled model repeats every op once per layer (a LLaMA
# block: 7 linear layers x forward, input- and weight-gradient GEMMs + the mask refresh), so that work grew
# with the depth (CPU, 8 unrolled LLaMA blocks under fsdp=2: 224 instances, 5.5 s of Python in the
# callbacks, more than half of it building the modules, besides XLA's own time on them).
#
# Here the ops bind their own primitive, a copy of ``custom_partitioning_p`` whose custom call has another
# target name, and that target's partition callback memoizes JAX's: within one lowered program (a dict in
# its ``ModuleContext``, which lives as long as the program's lowering) an instance whose op key (:func:`_op_key`: the rule, the per-platform function's code
# and closure values, the operands' shapes and dtypes, the gather mode) and whose proposed operand and
# result shardings equal an earlier instance's gets the earlier module bytes and shardings back without
# tracing or lowering anything. The program XLA builds is the same (the same module text is inlined).
# ``propagate`` / ``infer`` (GSPMD) are JAX's. Where these JAX internals are missing (another JAX) or an
# op's function cannot be keyed (a closure over an array), the op is a plain ``custom_partitioning`` op.


class _Unkeyable(Exception):
    pass


_KEY_ATOMS = (type(None), bool, int, float, complex, str, bytes, np.dtype, type)


def _fn_key(obj, depth: int = 0):
    """A hashable value equal for two objects that compute the same thing: scalars, dtypes, enums, tuples,
    functions (code object, defaults and closure values, recursively), partials, and this package's own
    objects or hashable callables by identity. Raises :class:`_Unkeyable` for anything else (arrays, tracers)."""
    if depth > 12:
        raise _Unkeyable
    if isinstance(obj, _KEY_ATOMS) or isinstance(obj, enum.Enum):
        return (type(obj), obj)
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple(_fn_key(o, depth + 1) for o in obj))
    if isinstance(obj, dict):
        return (dict, tuple(sorted(((_fn_key(k, depth + 1), _fn_key(v, depth + 1)) for k, v in obj.items()), key=repr)))
    if isinstance(obj, functools.partial):
        return (functools.partial, _fn_key(obj.func, depth + 1), _fn_key(obj.args, depth + 1),
                _fn_key(obj.keywords, depth + 1))
    if isinstance(obj, types.FunctionType):
        try:
            cells = tuple(_fn_key(c.cell_contents, depth + 1) for c in obj.__closure__ or ())
        except ValueError:  # an empty cell
            raise _Unkeyable from None
        return (types.FunctionType, obj.__code__, id(obj.__globals__), cells, _fn_key(obj.__defaults__, depth + 1),
                _fn_key(obj.__kwdefaults__, depth + 1))
    if isinstance(obj, (jax.Array, np.ndarray, jax.core.Tracer)):
        raise _Unkeyable
    if type(obj) is object:  # a sentinel (jax.vmap's default axis name)
        return ("object", obj)
    mod = getattr(type(obj), "__module__", "") or ""
    if mod.startswith("jax_sparse24") or isinstance(obj, (types.BuiltinFunctionType, types.MethodType, np.ufunc)) \
            or (callable(obj) and mod.startswith(("jax", "numpy", "ml_dtypes"))):
        try:
            hash(obj)
        except TypeError:
            raise _Unkeyable from None
        return ("object", obj)
    raise _Unkeyable


def _op_key(rule, impl, n_real, gather_packed, key_impls, shapes, dtypes):
    try:
        return (rule, _fn_key(impl), n_real, gather_packed, tuple(sorted((k, str(v)) for k, v in key_impls.items())),
                tuple(shapes), tuple(str(d) for d in dtypes))
    except _Unkeyable:
        return None
    except TypeError:  # something unhashable inside the rule
        return None


class _CachedPartitioning:
    """The primitive, its lowering and the memoizing partition callback (module comment above)."""

    TARGET = "CustomSPMDPartitioning_jax_sparse24"  # JAX's name as a prefix: counts of "CustomSPMDPartitioning" still see the ops

    def __init__(self):
        from jax._src import api_util, core, dispatch, mesh as mesh_lib
        from jax._src import config as jax_config
        from jax._src import custom_partitioning as jcp
        from jax._src import linear_util as lu
        from jax._src import xla_bridge as xb
        from jax._src.interpreters import mlir
        from jax._src.interpreters import partial_eval as pe
        from jax._src.lib import xla_client as xc
        from jax._src.lib.mlir import ir

        self.jcp, self.core, self.pe, self.lu, self.api_util = jcp, core, pe, lu, api_util
        self.mesh_lib, self.jax_config, self.ir = mesh_lib, jax_config, ir
        for name in ("_custom_partitioning_abstract_eval", "_custom_partitioning_impl",
                     "_custom_partitioning_lowering_rule", "_custom_partitioning_partition",
                     "_custom_partitioning_propagate_user_sharding",
                     "_custom_partitioning_infer_sharding_from_operands", "_sharding_callbacks",
                     "_CUSTOM_PARTITIONING_CALL_NAME"):
            getattr(jcp, name)  # AttributeError: another JAX, no cache
        self.hits = 0
        p = core.Primitive("sparse24_custom_partitioning")
        p.multiple_results = True
        p.def_abstract_eval(jcp._custom_partitioning_abstract_eval)
        p.def_impl(jcp._custom_partitioning_impl)
        dispatch.prim_requires_devices_during_lowering.add(p)
        mlir.register_lowering(p, self._lowering)
        self.p = p
        callbacks = dict(prop_user_sharding=jcp._custom_partitioning_propagate_user_sharding,
                         partition=self._partition,
                         infer_sharding_from_operands=jcp._custom_partitioning_infer_sharding_from_operands,
                         can_side_effecting_have_replicated_sharding=True)
        xc.register_custom_call_partitioner(self.TARGET, **callbacks)
        xb.register_plugin_callbacks(functools.partial(xc.register_custom_call_partitioner, name=self.TARGET,
                                                       **callbacks))

    def bind(self, op, op_key, args):
        """``op(*args)`` (a ``custom_partitioning`` without static arguments) bound as this primitive:
        ``custom_partitioning.__call__``'s steps."""
        core, pe = self.core, self.pe
        debug = self.api_util.debug_info("custom_partitioning", op.fun, tuple(args), {})
        args_flat, in_tree = jax.tree_util.tree_flatten(tuple(args))
        flat_fun, out_tree = self.api_util.flatten_fun_nokwargs(self.lu.wrap_init(op.fun, debug_info=debug), in_tree)
        in_avals = [core.typeof(x) for x in args_flat]
        mesh = self.mesh_lib.thread_resources.env.physical_mesh
        with core.extend_axis_env_nd(mesh.shape.items()):
            jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(flat_fun, in_avals)
        assert not len(consts)
        call = core.ClosedJaxpr(pe.convert_constvars_jaxpr(jaxpr), ())
        shardy = self.jax_config.use_shardy_partitioner.value
        partition = functools.partial(_keyed_partition, op.partition, op_key)
        out_flat = self.p.bind(
            *args_flat, call=call, partition=partition,
            propagate_user_sharding=None if shardy else op.propagate_user_sharding,
            infer_sharding_from_operands=None if shardy else op.infer_sharding_from_operands,
            decode_shardings=op.decode_shardings, sharding_rule=op.sharding_rule if shardy else None,
            in_tree=in_tree, out_tree=out_tree(), static_args=())
        return jax.tree_util.tree_unflatten(out_tree(), out_flat)

    def _lowering(self, ctx, *values, **params):
        results = self.jcp._custom_partitioning_lowering_rule(ctx, *values, **params)
        ir = self.ir
        for r in results[:1]:
            op = r.owner
            op = getattr(op, "operation", op)
            if op.name == "stablehlo.custom_call" and "call_target_name" in op.attributes and \
                    ir.StringAttr(op.attributes["call_target_name"]).value == self.jcp._CUSTOM_PARTITIONING_CALL_NAME:
                op.attributes["call_target_name"] = ir.StringAttr.get(self.TARGET)
        return results

    def _partition(self, arg_shapes, arg_shardings, result_shape, result_sharding, backend_string):
        info = self.jcp._sharding_callbacks[backend_string]
        op_key = info.partition.args[1] if isinstance(info.partition, functools.partial) else None
        if op_key is None:
            return self.jcp._custom_partitioning_partition(arg_shapes, arg_shardings, result_shape,
                                                          result_sharding, backend_string)

        def shape_key(s):
            return (tuple(s.dimensions()), str(s.numpy_dtype()))

        res_shapes = result_shape.tuple_shapes() if result_shape.is_tuple() else (result_shape,)
        key = (op_key, info.mesh, tuple(info.module_context.platforms),
               tuple(shape_key(s) for s in arg_shapes), tuple(str(h) for h in arg_shardings),
               tuple(shape_key(s) for s in res_shapes), str(result_sharding))
        store = getattr(info.module_context, "cached_primitive_lowerings", None)  # one dict per lowered program
        if not isinstance(store, dict):
            return self.jcp._custom_partitioning_partition(arg_shapes, arg_shardings, result_shape,
                                                          result_sharding, backend_string)
        cache = store.setdefault(("jax_sparse24", "partition results"), {})
        hit = cache.get(key)
        if hit is not None:
            self.hits += 1
            _SHARED_HITS[op_key[0].name] = _SHARED_HITS.get(op_key[0].name, 0) + 1
            return hit
        out = self.jcp._custom_partitioning_partition(arg_shapes, arg_shardings, result_shape, result_sharding,
                                                      backend_string)
        cache[key] = out
        return out


_SHARED_HITS: dict[str, int] = {}  # rule name -> partition results reused (cumulative, this process)


def shared_partition_hits() -> dict[str, int]:
    """``{rule name: count}``: how often an op instance reused an identical instance's partition result in this
    process (cumulative; benchmarks/partition_profile.py reports them as ``"<rule> (cached)"``)."""
    return dict(_SHARED_HITS)


def _keyed_partition(partition, op_key, *args):
    """The op's ``partition`` callback, carrying its op key for :class:`_CachedPartitioning`."""
    del op_key
    return partition(*args)


#: Opt-in: ``JAX_SPARSE24_SHARED_PARTITIONS=1`` (read at the first 2:4 op traced under a mesh) or
#: :func:`share_partition_results`. Off by default until it has run on a GPU: it binds a copy of JAX's private
#: ``custom_partitioning`` primitive and registers its partitioner with the GPU plugin.
SHARED_PARTITIONS_ENV = "JAX_SPARSE24_SHARED_PARTITIONS"
_CACHED_CP: _CachedPartitioning | None = None
_CACHED_CP_STATE = {"decided": False}


def share_partition_results(enabled: bool = True) -> bool:
    """Turn the shared partition results of identical 2:4 op instances on or off for programs traced from now
    on; returns whether they are on (``False`` where this JAX lacks the internals they use)."""
    global _CACHED_CP
    _CACHED_CP_STATE["decided"] = True
    if not enabled:
        _CACHED_CP = None
    elif _CACHED_CP is None:
        try:
            _CACHED_CP = _CachedPartitioning()
        except Exception:  # a JAX without these internals: plain custom_partitioning ops
            _CACHED_CP = None
    return _CACHED_CP is not None


def _shared_partitioning() -> _CachedPartitioning | None:
    if not _CACHED_CP_STATE["decided"]:
        share_partition_results(os.environ.get(SHARED_PARTITIONS_ENV, "0") == "1")
    return _CACHED_CP


# --------------------------------------------------------------------------------------------
# The partitioned op
# --------------------------------------------------------------------------------------------


def _cp_call(rule: Rule, impl: Callable, *args):
    """``impl(*args)`` as one ``custom_partitioning`` op following ``rule`` (arrays only)."""
    args = list(args)
    if len(args) != len(rule.operands):
        raise TypeError(f"{rule.name}: rule has {len(rule.operands)} operands, got {len(args)} arguments")
    manual = manual_axes()
    if rule.fold_key is not None and manual:  # shard_map (manual axes): fold with the block index now
        kpos, dpos = rule.fold_key
        if _vma_tracked(manual):  # the data's blocks: the axes it varies over and the key does not
            vma = _varying_axes(args[dpos]) - _varying_axes(args[kpos])
        else:  # check_vma=False: which axes split the data is unknown, so every device draws its own
            vma = manual
        if vma:
            am = jax.sharding.get_abstract_mesh()
            axes = [a for a in am.axis_names if a in vma]
            args[kpos] = _fold(args[kpos], _block_index(axes, dict(am.shape)))

    # Typed PRNG keys cross the custom call as raw key data (replicated trailing dims).
    key_impls: dict[int, Any] = {}
    labels = [tuple(l) for l in rule.operands]
    for k, a in enumerate(args):
        if _is_typed_key(a):
            key_impls[k] = jax.random.key_impl(a)
            args[k] = jax.random.key_data(a)
            extra = tuple(f"kd{k}_{j}" for j in range(np.ndim(args[k]) - len(labels[k])))
            labels[k] = labels[k] + extra
    # The packed gather changes only the partition callback, not the program before partitioning, which a
    # persistent compilation cache keys on (with the callback's address, which Python reuses): in packed
    # mode the op takes one more operand, a replicated scalar it ignores, so the two modes' programs differ.
    gather_packed = rule.gathered_weight is not None and _WEIGHT_GATHER.value == "packed"
    n_real = len(args)
    if gather_packed:
        args.append(jnp.zeros((), jnp.uint8))
        labels.append(())
    replicated = set(rule.replicated) | {l for k in key_impls for l in labels[k][len(rule.operands[k]):]}
    # Shardy numbers the factors in order of first appearance and wants need_replication in that
    # order ("indices of special factors must be sorted"), not by name.
    order: dict[str, int] = {}
    for lab in (*labels, *rule.results):
        for f in lab:
            order.setdefault(f, len(order))
    replicated = tuple(sorted((f for f in replicated if f in order), key=order.__getitem__))
    rule_x = dataclasses.replace(rule, operands=tuple(labels), replicated=replicated)
    for k, a in enumerate(args):
        if np.ndim(a) != len(labels[k]):
            raise ValueError(f"{rule.name}: operand {k} has shape {np.shape(a)} but the rule labels "
                             f"{len(labels[k])} dimensions {labels[k]}")

    def rewrap(flat):
        flat = list(flat)[:n_real]  # without the packed-mode marker
        for k, impl_name in key_impls.items():
            flat[k] = jax.random.wrap_key_data(flat[k], impl=impl_name)
        return flat

    @jax.jit  # a closed call: captured constants stay inside (custom_partitioning takes no consts)
    def body(*flat):
        return impl(*rewrap(flat))

    shapes = [tuple(np.shape(a)) for a in args]

    def plan(mesh, arg_specs, res_specs):
        """Final operand/result specs and the per-shard function for proposed shardings."""
        assign = _assign_axes(rule_x, mesh, rule_x.operands, shapes, arg_specs, res_specs, strict=True)
        in_specs = _specs_for(rule_x.operands, assign)
        gathers = _packed_gathers(rule_x, mesh, shapes, arg_specs, assign) if gather_packed else {}
        if gathers:  # the weight and its mask stay as proposed: lower_fn gathers them packed
            for pos in rule_x.gathered_weight:
                in_specs[pos] = P(*(_entry(assign.get(l, ()) + gathers.get(d, ()))
                                    for d, l in enumerate(rule_x.operands[pos])))
        out_specs = _specs_for(rule_x.results, assign)
        psum_axes = tuple(a for f in rule_x.contract for a in assign.get(f, ()))
        fold_axes = ()
        if rule_x.fold_key is not None:
            dpos = rule_x.fold_key[1]
            data_axes = {a for l in rule_x.operands[dpos] for a in assign.get(l, ())}
            fold_axes = tuple(a for a in mesh.axis_names if a in data_axes)
        mesh_sizes = dict(mesh.shape)

        def lower_fn(*flat):
            flat = rewrap(flat)
            if gathers:
                wpos, mpos = rule_x.gathered_weight
                flat[wpos], flat[mpos] = _gather_packed(flat[wpos], flat[mpos], gathers,
                                                        keep_packed=rule_x.packed_weight)
            if fold_axes:
                kpos = rule_x.fold_key[0]
                flat[kpos] = _fold(flat[kpos], _block_index(fold_axes, mesh_sizes))
            out = impl(*flat)
            if psum_axes:
                out = jax.tree_util.tree_map(lambda y: lax.psum(y, psum_axes), out)
            return out

        return in_specs, out_specs, lower_fn

    # Explicit mesh axes (sharding in types, e.g. jax.make_mesh's default): the shardings are
    # known now, so the same plan runs as a shard_map right here.
    emesh = _explicit_mesh(args)
    if emesh is not None:
        explicit = set(emesh.explicit_axes) - _vmapped_mesh_axes()
        arg_specs = [_only_axes(jax.typeof(a).sharding.spec, explicit) for a in args]
        in_specs, out_specs, lower_fn = plan(emesh, arg_specs, [])
        args = [jax.sharding.reshard(a, NamedSharding(emesh, s)) for a, s in zip(args, in_specs)]
        multi = len(rule_x.results) > 1
        smap = jax.shard_map(lower_fn, mesh=emesh, in_specs=tuple(in_specs),
                             out_specs=tuple(out_specs) if multi else out_specs[0], axis_names=explicit)
        return smap(*args)

    def partition(mesh, arg_shapes, result_shape):
        arg_specs = [_sharding_spec(s.sharding) for s in arg_shapes]
        res_list = result_shape if isinstance(result_shape, (tuple, list)) else (result_shape,)
        res_specs = [_sharding_spec(r.sharding) for r in res_list]
        in_specs, out_specs, lower_fn = plan(mesh, arg_specs, res_specs)
        in_sh = tuple(NamedSharding(mesh, s) for s in in_specs)
        out_sh = [NamedSharding(mesh, s) for s in out_specs]
        out_sh = tuple(out_sh) if isinstance(result_shape, (tuple, list)) else out_sh[0]
        return mesh, lower_fn, out_sh, in_sh

    def infer(mesh, arg_shapes, result_shape):  # GSPMD only
        arg_specs = [_sharding_spec(s.sharding) for s in arg_shapes]
        assign = _assign_axes(rule_x, mesh, rule_x.operands, shapes, arg_specs, [], strict=False)
        out = [NamedSharding(mesh, s) for s in _specs_for(rule_x.results, assign)]
        return tuple(out) if isinstance(result_shape, (tuple, list)) else out[0]

    sdy_rule = SdyShardingRule(
        tuple(ArrayMapping(*l) for l in rule_x.operands),
        tuple(ArrayMapping(*l) for l in rule_x.results),
        reduction_factors=tuple(rule_x.contract),
        need_replication_factors=tuple(rule_x.replicated),
    )
    op = custom_partitioning(body)
    kwargs = dict(infer_sharding_from_operands=infer, sharding_rule=sdy_rule)
    kwargs = {k: v for k, v in kwargs.items() if k in _DEF_PARTITION_PARAMS}
    op.def_partition(partition, **kwargs)
    # Identical op instances (an unrolled model's layers) share one partition result per compile: the key is
    # everything the partition callback and its per-shard function depend on besides the shardings and
    # shapes, which the cache adds (see _cached_partition).
    op_key = _op_key(rule_x, impl, n_real, gather_packed, key_impls, shapes, [jnp.result_type(a) for a in args])
    shared = _shared_partitioning() if op_key is not None else None
    if shared is not None:
        return shared.bind(op, op_key, args)
    return op(*args)


def _partitioned_vmappable(rule: Rule, impl: Callable) -> Callable:
    @jax.custom_batching.custom_vmap
    def f(*args):
        return _cp_call(rule, impl, *args)

    @f.def_vmap
    def f_vmap(axis_size, in_batched, *args):
        flags = [bool(b) for b in in_batched]
        vimpl = jax.vmap(impl, in_axes=tuple(0 if b else None for b in flags))
        out = _partitioned_vmappable(rule.batched(flags), vimpl)(*args)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return f


def partitioned(rule: Rule, impl: Callable, *, reference_fn: Callable | None = None) -> Callable:
    """``impl`` (a function of arrays) custom-partitioned by ``rule``; differentiable and vmappable.

    Args:
      rule: the op's :class:`Rule` (one label tuple per positional argument).
      impl: the per-platform function (reference on CPU, FFI custom call on CUDA); it is called
        on the local shards inside the partitioned op, exactly as it is called unsharded.
      reference_fn: plain-``jnp`` definition of the same math, differentiated for the JVP
        (default: ``impl``). ``rule.tangent`` overrides both.
    """
    ref = reference_fn if reference_fn is not None else impl
    # One device: no partitioning, but the same JVP — the custom call itself has no derivative,
    # so differentiating the op on a single GPU must go through the reference (or rule.tangent).
    core = impl if _single_device() else _partitioned_vmappable(rule, impl)

    @jax.custom_jvp
    def f(*args):
        return core(*args)

    @f.defjvp
    def f_jvp(primals, tangents):
        out = f(*primals)
        if rule.tangent is not None:
            return out, rule.tangent(primals, out, tangents)
        _, t_out = jax.jvp(ref, primals, tangents)
        return out, t_out

    return f


def partitioned_per_platform(rule: Rule, reference_fn: Callable, cuda_fn: Callable | None, *args):
    """:func:`ffi.per_platform` (reference on CPU, CUDA kernel on GPU), partitioned by ``rule``.

    Drop-in for ``ffi.per_platform(reference_fn, cuda_fn, *args)`` in ``ops.py``: the partitioned
    op wraps the per-platform function, so the same rule runs around the reference lowering on a
    CPU and around the custom call on a GPU.
    """
    impl = functools.partial(ffi.per_platform, reference_fn, cuda_fn)
    return partitioned(rule, impl, reference_fn=reference_fn)(*args)


def partitioned_gemm(kind: str, **rule_kwargs) -> Callable[[Callable], Callable]:
    """Decorator for the GEMMs in ``gemm.py`` and ``prepared_weight.py``: ``fn(*arrays, **static)``
    runs partitioned by :func:`gemm_rule` (``kind``); ``transposable=`` in the call's keyword
    arguments is passed to the rule. ``fn`` is called on the local shards (local shapes) inside the
    partitioned op."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapped(*arrays, **static):
            kw = dict(rule_kwargs)
            if kind == "input_grad" and "transposable" in static:
                kw.setdefault("transposable", bool(static["transposable"]))
            rule = gemm_rule(kind, **kw)
            return partitioned(rule, lambda *a: fn(*a, **static))(*arrays)

        wrapped.__wrapped_gemm__ = fn
        return wrapped

    return deco
