"""N:M pruning of trained models, Apex-ASP style, done functionally.

* :func:`mask_from_pattern` — masks from ASP pattern names (``"m4n2_1d"``, ``"m4n2_2d_best"``,
  ``"m8n4_2d_greedy"``, ``"m32n3_1d_greedy"``, vector-wise ``"m4n2_1d_v4"``, block-wise
  ``"m4n2_1d_b4x4"``), parsed with a regular expression. Groups run along the contraction axis,
  which for a Flax kernel ``(in, out)`` is axis 0.
* :func:`vector_nm_mask`, :func:`block_nm_mask` — vector- and block-wise N:M.
* :func:`prune_trained` — one-shot pruning of a Flax parameter tree, layers chosen by path.
* :func:`keep_pruned` — an optax transformation that keeps pruned weights at exactly zero while
  fine-tuning (ASP's optimizer patch, functional).
* :func:`search_permutation`, :func:`permute_channels`, :func:`apply_permutation`,
  :func:`permute_mlp` — ASP's channel permutation: reorder a layer's input channels so 2:4
  keeps more magnitude, with the matching reorder of the producing layer so the network's
  function is unchanged.

All masks build on the library's single definitions (``nm_mask``, ``transposable_mask24``), so
the 2:4 cases use the CUDA kernels where they exist.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_sparse24._src import prune_impl as _impl
from jax_sparse24._src import validation as _v
from jax_sparse24._src.prune_impl import PatternShapeError, PatternSpec

__all__ = [
    "PatternSpec",
    "PatternShapeError",
    "parse_pattern",
    "mask_from_pattern",
    "vector_nm_mask",
    "block_nm_mask",
    "kept_magnitude",
    "prune_trained",
    "apply_masks",
    "KeepPrunedState",
    "keep_pruned",
    "ChannelPermutation",
    "search_permutation",
    "permute_channels",
    "apply_permutation",
    "permute_mlp",
]


def parse_pattern(pattern: str) -> PatternSpec:
    """Parses an ASP-style N:M pattern name.

    Grammar (a regular expression, not a table of names): ``m{M}n{N}_1d`` — keep N of every M
    consecutive elements along the contraction axis (``_1d_best`` and ``_1d_greedy`` are the
    same exact mask); ``m{M}n{N}_1d_v{V}`` — vector-wise; ``m{M}n{N}_1d_b{BH}x{BW}`` —
    block-wise; ``m{M}n{N}_2d_best`` / ``m{M}n{N}_2d_greedy`` — N of M along both axes of every
    M×M block. ``1 <= N < M <= 32``.

    Args:
      pattern: the name.

    Returns:
      A :class:`PatternSpec` ``(name, n, m, kind, v, block)``.

    Raises:
      ValueError: the name does not parse, ``N >= M``, ``M > 32``, or a 2-D name without
        ``_best``/``_greedy``; the message quotes the pattern and the constraint.

    >>> parse_pattern("m32n3_1d_greedy")
    PatternSpec(name='m32n3_1d_greedy', n=3, m=32, kind='1d', v=None, block=None)
    >>> parse_pattern("m4n2_1d_b4x8").block
    (4, 8)
    """
    return _impl.parse_pattern(pattern)


def mask_from_pattern(x, pattern: str, *, axis: int = 0, norm: str = "l1"):
    """Boolean N:M mask of ``x`` for an ASP pattern name.

    * ``m{M}n{N}_1d`` (``_best``/``_greedy``): the ``N`` largest ``|x|`` of every ``M``
      consecutive elements along ``axis`` — ``nm_mask(x, N, M, axis)``.
    * ``m{M}n{N}_1d_v{V}``: :func:`vector_nm_mask` with vectors of ``V`` along the other axis.
    * ``m{M}n{N}_1d_b{BH}x{BW}``: :func:`block_nm_mask` with ``BH×BW`` blocks.
    * ``m4n2_2d_best``: the transposable 2:4 mask (exact optimum per 4×4 block over the 90
      patterns); other ``_2d_best``: the exact optimum over every M×M pattern with N ones per row
      and column where that is at most 100 000 patterns (e.g. m4n1, m5n2, m6n2, m8n1), else an
      error suggesting ``_2d_greedy``.
    * ``m{M}n{N}_2d_greedy``: per M×M block, elements by descending ``|x|`` (ties: lower
      row-major index first) are kept while their row and column hold fewer than ``N``; rows and
      columns keep at most ``N`` (sometimes fewer).

    Args:
      x: floating-point array; 2-D for 2-D, vector- and block-wise patterns.
      pattern: the pattern name (see :func:`parse_pattern`).
      axis: the contraction axis the groups run along — 0 for a Flax kernel ``(in, out)``.
        Ignored by 2-D patterns (they constrain both axes).
      norm: ``"l1"`` or ``"l2"``, the score of a vector or block (vector/block-wise only).

    Returns:
      ``bool`` array of ``x``'s shape.

    Raises:
      ValueError: a bad pattern name, or a shape the pattern cannot group (the message names the
        pattern, the shape and the constraint).

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[1.0, -2.0], [3.0, 0.5], [-0.1, 4.0], [2.0, 1.0]])
    >>> mask_from_pattern(w, "m4n2_1d").astype(int)
    Array([[0, 1],
           [1, 0],
           [0, 1],
           [1, 0]], dtype=int32)
    """
    return _impl.mask_for(x, _impl.parse_pattern(pattern), axis=axis, norm=norm)


def vector_nm_mask(x, n: int, m: int, v: int, *, axis: int = 0, vector_axis: int | None = None,
                   norm: str = "l1"):
    """Vector-wise N:M mask: keep ``n`` of every ``m`` consecutive vectors along ``axis``.

    A vector is ``v`` consecutive elements along ``vector_axis`` (default: the other axis of a
    2-D array, i.e. ``v`` output channels of one input row of a Flax kernel), scored by its L1 or
    L2 norm. All ``v`` elements of a vector share one keep/drop decision, so the mask is N:M
    along ``axis`` with index metadata shared by ``v`` rows — the layout vector-wise sparse
    kernels use. Built as ``nm_mask`` of the vector scores.

    Args:
      x: floating-point array; ``x.shape[axis] % m == 0`` and ``x.shape[vector_axis] % v == 0``.
      n: vectors kept per group, ``1 <= n < m``.
      m: group size in vectors, ``m <= 32``.
      v: vector length.
      axis: grouping (contraction) axis.
      vector_axis: axis the vectors run along; required for arrays that are not 2-D.
      norm: ``"l1"`` or ``"l2"``.

    Returns:
      ``bool`` array of ``x``'s shape.

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[1., 1.], [5., 5.], [0., 9.], [3., 3.]])  # (in=4, out=2)
    >>> vector_nm_mask(w, 2, 4, 2).astype(int)  # a vector = one row of 2 outputs
    Array([[0, 0],
           [1, 1],
           [1, 1],
           [0, 0]], dtype=int32)
    """
    _v.check_nm(n, m, "vector_nm_mask")
    if not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"vector_nm_mask: v must be an int >= 1, got {v!r}")
    ctx = _impl._where("vector_nm_mask", None, None, np.shape(x))
    _impl.check_float(x, ctx)
    _impl.check_norm(norm, ctx)
    return _impl.vector_mask(x, n, m, int(v), axis, vector_axis, norm, ctx)


def block_nm_mask(x, n: int, m: int, block: tuple[int, int] = (4, 4), *, axis: int = 0,
                  norm: str = "l1"):
    """Block-wise N:M mask of a 2-D array: keep ``n`` of every ``m`` consecutive blocks.

    ``x`` is tiled into ``bh×bw`` blocks, each scored by its L1 or L2 norm; along ``axis`` of the
    block grid, ``n`` of every ``m`` consecutive blocks are kept whole. Built as ``nm_mask`` of
    the block scores.

    Args:
      x: 2-D floating-point array with ``R % bh == 0``, ``C % bw == 0`` and the block grid's
        ``axis`` divisible by ``m``.
      n: blocks kept per group, ``1 <= n < m``.
      m: group size in blocks, ``m <= 32``.
      block: ``(bh, bw)``.
      axis: the grouping axis of the block grid.
      norm: ``"l1"`` or ``"l2"``.

    Returns:
      ``bool`` array of ``x``'s shape.

    >>> import jax.numpy as jnp
    >>> x = jnp.arange(16.0).reshape(8, 2)
    >>> block_nm_mask(x, 1, 2, (2, 2)).astype(int)[:, 0]
    Array([0, 0, 1, 1, 0, 0, 1, 1], dtype=int32)
    """
    _v.check_nm(n, m, "block_nm_mask")
    if len(tuple(block)) != 2 or any(not isinstance(b, (int, np.integer)) or b < 1 for b in block):
        raise ValueError(f"block_nm_mask: block must be two ints >= 1, got {block!r}")
    ctx = _impl._where("block_nm_mask", None, None, np.shape(x))
    _impl.check_float(x, ctx)
    _impl.check_norm(norm, ctx)
    return _impl.block_mask(x, n, m, (int(block[0]), int(block[1])), axis, norm, ctx)


def kept_magnitude(x, pattern: str = "m4n2_1d", *, axis: int = 0, norm: str = "l1") -> float:
    """``Σ|x|`` over the elements the pattern keeps (the quantity ASP's searches maximise).

    >>> import jax.numpy as jnp
    >>> kept_magnitude(jnp.array([[1.0], [-4.0], [2.0], [3.0]]))
    7.0
    """
    mask = mask_from_pattern(x, pattern, axis=axis, norm=norm)
    return float(jnp.sum(jnp.where(mask, jnp.abs(jnp.asarray(x, jnp.float32)), 0.0)))


# ---------------------------------------------------------------------------------------------
# pruning a parameter tree


def prune_trained(params, *, pattern: str = "m4n2_1d", allowed=None, disallowed=None,
                  axis: int = 0, leaf_names=("kernel",), norm: str = "l1", strict: bool = False):
    """One-shot N:M magnitude pruning of a trained Flax parameter tree.

    ASP's patterns (N:M, vector- and block-wise, 2-D) with the pruned weights zeroed; the 2:4 masks of
    a training run (``masks=`` of :func:`jax_sparse24.optim.masked_decay`) come from
    :func:`jax_sparse24.optim.magnitude_masks` (the default pattern ``"m4n2_1d"`` keeps the same 2 of 4).

    A leaf is pruned when its last key is in ``leaf_names`` (default: ``'kernel'``), it is 2-D,
    its path matches ``allowed`` (when given) and does not match ``disallowed``. Paths are the
    tree's keys joined by ``'/'``, e.g. ``'params/Block_0/mlp/fc1/kernel'``. A ``str`` pattern
    is a glob (``fnmatch``: ``*`` also crosses ``/``) matched against the leaf path or its layer
    path (the leaf path without ``/kernel``), so ``"*/mlp/*"`` or ``"*fc1"`` work; an
    ``re.Pattern`` or a string starting with ``"re:"`` is a regular expression searched in the
    leaf path.

    Selected layers the pattern cannot group (e.g. ``in % 4 != 0``, or a 3-D kernel) are skipped
    with a ``warnings.warn`` naming the layer, its shape and the constraint (``strict=True``
    raises ``ValueError`` instead).

    Args:
      params: the parameter pytree (dicts / FrozenDicts of arrays).
      pattern: pattern name, see :func:`mask_from_pattern`.
      allowed: glob/regex pattern(s); when given only matching layers are pruned.
      disallowed: glob/regex pattern(s) of layers never pruned (e.g. ``"*lm_head*"``).
      axis: contraction axis of the kernels (0 for Flax ``Dense``).
      leaf_names: last path keys that are prunable.
      norm: vector/block score (``"l1"`` or ``"l2"``).
      strict: raise instead of warning when a selected layer cannot be grouped.

    Returns:
      ``(pruned_params, masks)``: ``pruned_params`` has the tree's structure with pruned
      elements set to 0 (same dtypes); ``masks`` has the same structure with a ``bool`` mask at
      every pruned leaf and ``None`` elsewhere.

    Raises:
      ValueError: an invalid pattern name (always), or a layer that cannot be grouped when
        ``strict``.

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> model = nn.Sequential([nn.Dense(8), nn.relu, nn.Dense(2)])
    >>> params = model.init(jax.random.key(0), jnp.ones((1, 16)))
    >>> pruned, masks = prune_trained(params, disallowed="*layers_2*")
    >>> masks["params"]["layers_0"]["kernel"].shape, masks["params"]["layers_2"]["kernel"]
    ((16, 8), None)
    """
    spec = _impl.parse_pattern(pattern)
    flat, treedef = _impl.flatten(params)
    new_leaves, mask_leaves = [], []
    for path, leaf in flat:
        name = path.rsplit("/", 1)[-1]
        mask = None
        if (name in tuple(leaf_names) and hasattr(leaf, "shape")
                and (allowed is None or _impl.path_matches(path, allowed))
                and not _impl.path_matches(path, disallowed)):
            try:
                if np.ndim(leaf) != 2:
                    raise PatternShapeError(
                        f"prune_trained: pattern {pattern!r} for layer {path!r} (shape "
                        f"{tuple(np.shape(leaf))}): only 2-D kernels (in, out) are pruned")
                mask = _impl.mask_for(leaf, spec, axis=axis, norm=norm, layer=path,
                                      op="prune_trained")
            except PatternShapeError as e:
                if strict:
                    raise ValueError(str(e)) from None
                warnings.warn(f"{e}; layer skipped (left dense)", stacklevel=2)
        if mask is None:
            new_leaves.append(leaf)
        else:
            new_leaves.append(jnp.where(mask, leaf, jnp.zeros((), leaf.dtype)))
        mask_leaves.append(mask)
    return treedef.unflatten(new_leaves), treedef.unflatten(mask_leaves)


def _is_none(x) -> bool:
    return x is None


def _zero_where_pruned(mask, x):
    if mask is None or x is None:
        return x
    return jnp.where(mask, x, jnp.zeros((), x.dtype))


def apply_masks(tree, masks):
    """Zeroes the elements of ``tree`` where ``masks`` is False (``None`` masks: unchanged).

    ``masks`` is a tree like the one :func:`prune_trained` returns; ``tree`` may be params,
    gradients or updates with the same structure.

    >>> import jax.numpy as jnp
    >>> apply_masks({"a": jnp.ones(2), "b": jnp.ones(2)}, {"a": jnp.array([True, False]), "b": None})
    {'a': Array([1., 0.], dtype=float32), 'b': Array([1., 1.], dtype=float32)}
    """
    return jax.tree.map(_zero_where_pruned, masks, tree, is_leaf=_is_none)


class KeepPrunedState(NamedTuple):
    """State of :func:`keep_pruned`: the wrapped optimizer's state (``EmptyState`` if none)."""

    inner_state: Any


def keep_pruned(masks, inner: optax.GradientTransformation | None = None, *,
                mask_gradients: bool = True) -> optax.GradientTransformation:
    """Keeps pruned weights at exactly zero during fine-tuning (ASP's optimizer patch).

    Zeroes the updates at pruned positions, so a weight that is 0 stays 0 whatever the optimizer
    (momentum, Adam moments, decoupled weight decay). Two ways to use it:

    * ``keep_pruned(masks)`` — a stateless transformation; put it **last** in an
      ``optax.chain`` (it zeroes the final updates).
    * ``keep_pruned(masks, inner)`` — wraps ``inner``: gradients are masked before ``inner`` (if
      ``mask_gradients``, so its moments never see the pruned positions) and its updates after.

    Args:
      masks: tree of ``bool`` masks (True = kept) with ``None`` for unpruned leaves, as returned
        by :func:`prune_trained`; same structure as the params.
      inner: optional optimizer to wrap.
      mask_gradients: with ``inner``, also mask the gradients it receives.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`KeepPrunedState`.

    >>> import jax, jax.numpy as jnp, optax
    >>> params = {"w": jnp.array([0.0, 1.0])}
    >>> masks = {"w": jnp.array([False, True])}
    >>> opt = keep_pruned(masks, optax.adamw(0.1, weight_decay=0.1))
    >>> state = opt.init(params)
    >>> upd, state = opt.update({"w": jnp.array([1.0, 1.0])}, state, params)
    >>> optax.apply_updates(params, upd)["w"][0]
    Array(0., dtype=float32)
    """

    def init_fn(params):
        return KeepPrunedState(optax.EmptyState() if inner is None else inner.init(params))

    def update_fn(updates, state, params=None):
        if inner is None:
            return apply_masks(updates, masks), state
        if mask_gradients:
            updates = apply_masks(updates, masks)
        updates, inner_state = inner.update(updates, state.inner_state, params)
        return apply_masks(updates, masks), KeepPrunedState(inner_state)

    return optax.GradientTransformation(init_fn, update_fn)


# ---------------------------------------------------------------------------------------------
# channel permutation


class ChannelPermutation(NamedTuple):
    """Result of :func:`permute_channels`.

    Attributes:
      consumer: the consumer kernel with its input channels (rows) permuted.
      producer: the producer kernel with its output channels (columns) permuted, or ``None``.
      producer_bias: the producer bias permuted, or ``None``.
      perm: the permutation; new channel ``k`` is old channel ``perm[k]``.
      kept_before: kept ``Σ|w|`` of the consumer under N:M along its input axis, unpermuted.
      kept_after: the same after the permutation (``>= kept_before``).
    """

    consumer: Any
    producer: Any
    producer_bias: Any
    perm: np.ndarray
    kept_before: float
    kept_after: float


def _check_perm_args(w, n: int, m: int, op: str):
    _v.check_nm(n, m, op)
    shape = np.shape(w)
    ctx = _impl._where(op, None, None, shape)
    _impl.check_float(w, ctx)
    if len(shape) != 2:
        raise ValueError(f"{ctx}: the consumer kernel must be 2-D (in, out)")
    if shape[0] % m:
        raise ValueError(f"{ctx}: the input axis 0 has size {shape[0]}, which is not divisible by m={m}")
    return ctx


def search_permutation(w, *, n: int = 2, m: int = 4, max_iters: int | None = None) -> np.ndarray:
    """Finds a permutation of a kernel's input channels that keeps more magnitude under N:M.

    The rows of a Flax kernel ``(in, out)`` are its input channels; N:M groups ``m`` consecutive
    rows. Reordering rows only changes which channels share a group, so the search is over the
    partition into groups. Starting from the identity it repeatedly applies the single channel
    swap between two groups with the largest gain in kept ``Σ|w|`` (ASP's channel-swap
    refinement, Pool & Yu, "Channel Permutations for N:M Sparsity", NeurIPS 2021), until no swap
    gains or after ``max_iters`` swaps. Deterministic (ties: the lowest channel pair); the kept
    magnitude never decreases. Cost per swap: ``O(in·in + 2m·in·out)``.

    Args:
      w: 2-D kernel ``(in, out)``, ``in % m == 0``.
      n: kept per group.
      m: group size.
      max_iters: most swaps (default ``4·in``).

    Returns:
      ``perm`` (int numpy array): row ``k`` of the permuted kernel is row ``perm[k]`` of ``w``.

    >>> import numpy as np
    >>> w = np.array([[9.0], [9.0], [9.0], [9.0], [1.0], [1.0], [1.0], [1.0]])
    >>> perm = search_permutation(w)
    >>> kept_magnitude(w), kept_magnitude(w[perm])
    (20.0, 36.0)
    """
    ctx = _check_perm_args(w, n, m, "search_permutation")
    perm, _ = _impl.search_permutation(np.asarray(w, np.float64), n, m, max_iters, ctx)
    return perm


def _check_perm(perm, size: int, op: str) -> np.ndarray:
    p = np.asarray(perm)
    if p.shape != (size,) or not np.array_equal(np.sort(p), np.arange(size)):
        raise ValueError(f"{op}: perm must be a permutation of range({size}), got shape {p.shape}")
    return p


def permute_channels(w_consumer, w_producer=None, b_producer=None, *, perm=None, n: int = 2,
                     m: int = 4, max_iters: int | None = None) -> ChannelPermutation:
    """Permutes the channels between a producer and a consumer layer for better N:M pruning.

    ``y = act(x·P + b)·C``: permuting ``C``'s rows (its input channels), ``P``'s columns and
    ``b`` by the same ``perm`` leaves ``y`` unchanged for any elementwise ``act``, and with the
    ``perm`` from :func:`search_permutation` N:M pruning of ``C`` along its input axis keeps
    more magnitude.

    Args:
      w_consumer: consumer kernel ``(in, out)``.
      w_producer: producer kernel ``(…, in)`` or ``None``.
      b_producer: producer bias ``(in,)`` or ``None``.
      perm: a given permutation; searched when ``None``.
      n, m: the N:M pattern along the consumer's input axis.
      max_iters: passed to :func:`search_permutation`.

    Returns:
      A :class:`ChannelPermutation`.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> fc1, fc2 = rng.normal(size=(8, 16)), rng.normal(size=(16, 8))
    >>> r = permute_channels(fc2, fc1)
    >>> x = rng.normal(size=(3, 8))
    >>> bool(np.allclose(np.maximum(x @ fc1, 0) @ fc2, np.maximum(x @ r.producer, 0) @ r.consumer))
    True
    """
    op = "permute_channels"
    ctx = _check_perm_args(w_consumer, n, m, op)
    size = np.shape(w_consumer)[0]
    if w_producer is not None and np.shape(w_producer)[-1] != size:
        raise ValueError(f"{ctx}: the producer kernel's last axis must equal the consumer's input "
                         f"size {size}, got producer shape {tuple(np.shape(w_producer))}")
    if b_producer is not None and tuple(np.shape(b_producer)) != (size,):
        raise ValueError(f"{ctx}: the producer bias must have shape ({size},), got "
                         f"{tuple(np.shape(b_producer))}")
    if perm is None:
        perm = search_permutation(w_consumer, n=n, m=m, max_iters=max_iters)
    perm = _check_perm(perm, size, op)
    aw = np.abs(np.asarray(w_consumer, np.float64))
    before = _impl.kept_by_groups(aw, np.arange(size), n, m)
    after = _impl.kept_by_groups(aw, perm, n, m)
    idx = jnp.asarray(perm)
    take = lambda a, ax: None if a is None else jnp.take(jnp.asarray(a), idx, axis=ax)  # noqa: E731
    return ChannelPermutation(take(w_consumer, 0), take(w_producer, -1), take(b_producer, 0),
                              perm, before, after)


def _layer_leaf(path: str, leaf: str) -> str:
    return path if path.endswith("/" + leaf) else f"{path}/{leaf}"


def apply_permutation(params, producer_path: str, consumer_path: str, perm):
    """Applies a channel permutation between two layers of a parameter tree.

    Permutes the columns of ``{producer_path}/kernel`` and ``{producer_path}/bias`` (if present)
    and the rows of ``{consumer_path}/kernel``, which leaves ``consumer(act(producer(x)))``
    unchanged for an elementwise ``act`` (e.g. the two ``Dense`` layers of an MLP block).

    Args:
      params: parameter pytree.
      producer_path: '/'-joined path of the producing layer, e.g. ``'params/Block_0/fc1'``
        (a path ending in ``/kernel`` is accepted too).
      consumer_path: path of the consuming layer.
      perm: permutation of the shared channels (new ``k`` = old ``perm[k]``).

    Returns:
      The new parameter tree (same structure).

    Raises:
      ValueError: a path not in the tree (the message lists the layers), mismatched sizes, or
        ``perm`` not a permutation.

    >>> import numpy as np
    >>> p = {"fc1": {"kernel": np.eye(4)[:, :4], "bias": np.arange(4.0)}, "fc2": {"kernel": np.eye(4)}}
    >>> out = apply_permutation(p, "fc1", "fc2", [1, 0, 3, 2])
    >>> np.asarray(out["fc1"]["bias"]).tolist()
    [1.0, 0.0, 3.0, 2.0]
    """
    op = "apply_permutation"
    flat, treedef = _impl.flatten(params)
    leaves = [x for _, x in flat]
    ik = _impl.find_leaf(flat, _layer_leaf(consumer_path, "kernel"), op)
    pk = _impl.find_leaf(flat, _layer_leaf(producer_path, "kernel"), op)
    layer = producer_path[: -len("/kernel")] if producer_path.endswith("/kernel") else producer_path
    bias_path = f"{layer}/bias"
    pb = next((i for i, (p, _) in enumerate(flat) if p == bias_path), None)
    size = np.shape(leaves[ik])[0]
    if np.shape(leaves[pk])[-1] != size:
        raise ValueError(f"{op}: producer {producer_path!r} kernel {tuple(np.shape(leaves[pk]))} does "
                         f"not produce the {size} input channels of consumer {consumer_path!r} "
                         f"kernel {tuple(np.shape(leaves[ik]))}")
    idx = jnp.asarray(_check_perm(perm, size, op))
    leaves[ik] = jnp.take(jnp.asarray(leaves[ik]), idx, axis=0)
    leaves[pk] = jnp.take(jnp.asarray(leaves[pk]), idx, axis=-1)
    if pb is not None:
        leaves[pb] = jnp.take(jnp.asarray(leaves[pb]), idx, axis=-1)
    return treedef.unflatten(leaves)


def permute_mlp(params, producer_path: str, consumer_path: str, *, n: int = 2, m: int = 4,
                max_iters: int | None = None):
    """Searches and applies the channel permutation for one producer→consumer pair.

    :func:`search_permutation` on ``{consumer_path}/kernel``, then :func:`apply_permutation`.

    Returns:
      ``(new_params, perm)``.

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> mlp = nn.Sequential([nn.Dense(16), nn.gelu, nn.Dense(4)])
    >>> params = mlp.init(jax.random.key(0), jnp.ones((1, 4)))
    >>> new, perm = permute_mlp(params, "params/layers_0", "params/layers_2")
    >>> x = jnp.ones((2, 4))
    >>> bool(jnp.allclose(mlp.apply(params, x), mlp.apply(new, x), atol=1e-6))
    True
    """
    flat, _ = _impl.flatten(params)
    ik = _impl.find_leaf(flat, _layer_leaf(consumer_path, "kernel"), "permute_mlp")
    perm = search_permutation(flat[ik][1], n=n, m=m, max_iters=max_iters)
    return apply_permutation(params, producer_path, consumer_path, perm), perm
