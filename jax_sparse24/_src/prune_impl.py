"""Private helpers of :mod:`jax_sparse24.prune`: pattern parsing, the 2-D and grouped masks,
parameter-tree paths and the channel-permutation local search.

The masks compose the one definition of each op (``ops.nm_mask``, ``ops.transposable_mask24``,
which lower to the CUDA kernels where they exist): vector- and block-wise N:M are ``nm_mask`` of
per-vector / per-block scores. Only the m×m 2-D searches are new ops, defined here.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_sparse24._src import ops
from jax_sparse24._src.tree_paths import path_str
from jax_sparse24._src import validation as v

MAX_M = v.MAX_M
#: The exact 2-D search scores every m×m pattern; above this many patterns it refuses.
MAX_2D_BEST_PATTERNS = 100_000
#: ``lax.map`` batch for the 2-D scoring matmul, chosen so one batch holds ≤ 2**24 scores.
_SCORE_ELEMS = 1 << 24

GRAMMAR = (
    "m{M}n{N}_1d, m{M}n{N}_1d_best, m{M}n{N}_1d_greedy (N of every M along the contraction axis), "
    "m{M}n{N}_1d_v{V} (vector-wise), m{M}n{N}_1d_b{BH}x{BW} (block-wise), m{M}n{N}_2d_best, "
    "m{M}n{N}_2d_greedy (N of M along both axes); 1 <= N < M <= 32"
)
EXAMPLES = "'m4n2_1d', 'm4n2_2d_best', 'm8n4_2d_greedy', 'm32n3_1d_greedy', 'm4n2_1d_v4', 'm4n2_1d_b4x4'"

_PATTERN_RE = re.compile(
    r"m(?P<m>\d+)n(?P<n>\d+)_(?P<dim>[12]d)(?:_(?P<algo>best|greedy))?"
    r"(?:_v(?P<v>\d+)|_b(?P<bh>\d+)x(?P<bw>\d+))?"
)


class PatternSpec(NamedTuple):
    """A parsed pattern name. ``kind`` is one of ``1d``, ``vector``, ``block``, ``2d_best``,
    ``2d_greedy``."""

    name: str
    n: int
    m: int
    kind: str
    v: int | None = None
    block: tuple[int, int] | None = None


class PatternShapeError(ValueError):
    """A valid pattern that does not fit an array's shape (``prune_trained`` may skip the layer)."""


def _bad(pattern, why: str) -> ValueError:
    return ValueError(
        f"invalid N:M pattern {pattern!r}: {why}. Expected one of {GRAMMAR}; e.g. {EXAMPLES}"
    )


@functools.lru_cache(maxsize=256)
def parse_pattern(pattern: str) -> PatternSpec:
    """Parse an ASP-style pattern name with a regular expression (no lookup table)."""
    if not isinstance(pattern, str):
        raise _bad(pattern, f"a pattern name must be a str, got {type(pattern).__name__}")
    mt = _PATTERN_RE.fullmatch(pattern)
    if mt is None:
        raise _bad(pattern, "the name does not follow the grammar")
    n, m = int(mt["n"]), int(mt["m"])
    if m < 2 or m > MAX_M:
        raise _bad(pattern, f"M must satisfy 2 <= M <= {MAX_M}, got M={m}")
    if n < 1 or n >= m:
        raise _bad(pattern, f"N must satisfy 1 <= N < M, got N={n}, M={m}")
    if mt["dim"] == "2d":
        if mt["v"] is not None or mt["bh"] is not None:
            raise _bad(pattern, "vector-wise (_v) and block-wise (_b) groups exist only for 1d patterns")
        if mt["algo"] is None:
            raise _bad(pattern, "a 2d pattern needs a search: '_2d_best' (exact) or '_2d_greedy'")
        return PatternSpec(pattern, n, m, "2d_" + mt["algo"])
    if mt["v"] is not None:
        vv = int(mt["v"])
        if vv < 1:
            raise _bad(pattern, f"the vector length V must be >= 1, got {vv}")
        return PatternSpec(pattern, n, m, "vector", v=vv)
    if mt["bh"] is not None:
        bh, bw = int(mt["bh"]), int(mt["bw"])
        if bh < 1 or bw < 1:
            raise _bad(pattern, f"block sizes must be >= 1, got {bh}x{bw}")
        return PatternSpec(pattern, n, m, "block", block=(bh, bw))
    return PatternSpec(pattern, n, m, "1d")  # 1d, 1d_best and 1d_greedy are the same (exact) mask


# ---------------------------------------------------------------------------------------------
# checks with context (pattern, layer, shape, constraint)


def _where(op: str, pattern: str | None, layer: str | None, shape) -> str:
    ctx = op
    if pattern is not None:
        ctx += f": pattern {pattern!r}"
    if layer is not None:
        ctx += f" for layer {layer!r}"
    return ctx + f" (shape {tuple(shape)})"


def check_float(x, ctx: str) -> None:
    dt = jnp.result_type(x)
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"{ctx}: needs a floating-point array, got dtype {dt}")


def check_norm(norm: str, ctx: str) -> None:
    if norm not in ("l1", "l2"):
        raise ValueError(f"{ctx}: norm must be 'l1' or 'l2', got {norm!r}")


def _axis(axis: int, ndim: int, ctx: str) -> int:
    if ndim == 0:
        raise PatternShapeError(f"{ctx}: needs an array with at least 1 dimension, got a scalar")
    if not -ndim <= axis < ndim:
        raise PatternShapeError(f"{ctx}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def _divisible(size: int, by: int, ctx: str, what: str) -> None:
    if size % by:
        raise PatternShapeError(f"{ctx}: {what} has size {size}, which is not divisible by {by}")


def _rank2(shape, ctx: str, what: str) -> None:
    if len(shape) != 2:
        raise PatternShapeError(f"{ctx}: {what} need a 2-D array, got {len(shape)}-D")


# ---------------------------------------------------------------------------------------------
# masks


def _score(a, norm: str, axes):
    a = jnp.abs(a.astype(jnp.float32))
    return jnp.sum(a if norm == "l1" else a * a, axis=axes)  # l2: squared norm, same ranking


def vector_mask(x, n: int, m: int, vlen: int, axis: int, vector_axis: int | None, norm: str,
                ctx: str):
    """N:M over vectors: ``vlen`` consecutive elements along ``vector_axis`` form one vector,
    scored by its L1/L2 norm; ``nm_mask`` keeps ``n`` of every ``m`` consecutive vectors along
    ``axis``."""
    shape = np.shape(x)
    axis = _axis(axis, len(shape), ctx)
    if vector_axis is None:
        if len(shape) != 2:
            raise PatternShapeError(f"{ctx}: vector_axis must be given for a {len(shape)}-D array")
        vector_axis = 1 - axis
    vector_axis = _axis(vector_axis, len(shape), ctx)
    if vector_axis == axis:
        raise PatternShapeError(f"{ctx}: vector_axis must differ from the grouping axis {axis}")
    _divisible(shape[axis], m, ctx, f"axis {axis} (groups of {m} vectors)")
    _divisible(shape[vector_axis], vlen, ctx, f"axis {vector_axis} (vectors of {vlen})")
    xm = jnp.moveaxis(jnp.asarray(x), (axis, vector_axis), (-2, -1))
    lead = xm.shape[:-1]
    s = _score(xm.reshape(*lead, xm.shape[-1] // vlen, vlen), norm, -1)  # (..., L, V/vlen)
    keep = ops.nm_mask(s, n, m, axis=-2)
    keep = jnp.repeat(keep, vlen, axis=-1)
    return jnp.moveaxis(keep, (-2, -1), (axis, vector_axis))


def block_mask(x, n: int, m: int, block: tuple[int, int], axis: int, norm: str, ctx: str):
    """N:M over bh×bw blocks of a 2-D array: blocks scored by L1/L2 norm, ``nm_mask`` keeps
    ``n`` of every ``m`` consecutive blocks along ``axis`` of the block grid."""
    shape = np.shape(x)
    _rank2(shape, ctx, "block-wise masks")
    axis = _axis(axis, 2, ctx)
    bh, bw = block
    _divisible(shape[0], bh, ctx, f"axis 0 (blocks of {bh} rows)")
    _divisible(shape[1], bw, ctx, f"axis 1 (blocks of {bw} columns)")
    grid = (shape[0] // bh, shape[1] // bw)
    _divisible(grid[axis], m, ctx, f"the block grid {grid} along axis {axis} (groups of {m} blocks)")
    s = _score(jnp.asarray(x).reshape(grid[0], bh, grid[1], bw), norm, (1, 3))
    keep = ops.nm_mask(s, n, m, axis=axis)
    return jnp.repeat(jnp.repeat(keep, bh, axis=0), bw, axis=1)


def _blocks(x, m: int):
    r, c = x.shape
    b = jnp.abs(jnp.asarray(x)).astype(jnp.float32).reshape(r // m, m, c // m, m)
    return b.transpose(0, 2, 1, 3).reshape(-1, m * m)


def _unblocks(b, m: int, shape):
    r, c = shape
    return b.reshape(r // m, c // m, m, m).transpose(0, 2, 1, 3).reshape(r, c)


def greedy_2d_mask(x, n: int, m: int, ctx: str):
    """ASP's 2-D greedy: per m×m block, visit elements by descending ``|x|`` (ties: lower
    row-major index first) and keep one while its row and its column hold fewer than ``n``."""
    shape = np.shape(x)
    _rank2(shape, ctx, "2-D masks")
    _divisible(shape[0], m, ctx, f"axis 0 (m×m blocks, m={m})")
    _divisible(shape[1], m, ctx, f"axis 1 (m×m blocks, m={m})")
    if int(np.prod(shape)) == 0:
        return jnp.zeros(shape, jnp.bool_)
    blocks = _blocks(x, m)
    nb = blocks.shape[0]
    order = jnp.argsort(-blocks, axis=-1, stable=True)
    rows, cols = order // m, order % m
    ar = jnp.arange(nb)

    def body(t, carry):
        rc, cc, keep = carry
        r, c, e = rows[:, t], cols[:, t], order[:, t]
        ok = (rc[ar, r] < n) & (cc[ar, c] < n)
        inc = ok.astype(rc.dtype)
        return rc.at[ar, r].add(inc), cc.at[ar, c].add(inc), keep.at[ar, e].set(ok)

    init = (jnp.zeros((nb, m), jnp.int32), jnp.zeros((nb, m), jnp.int32),
            jnp.zeros((nb, m * m), jnp.bool_))
    _, _, keep = lax.fori_loop(0, m * m, body, init)
    return _unblocks(keep, m, shape)


@functools.lru_cache(maxsize=None)
def count_2d_patterns(m: int, n: int) -> int | None:
    """Number of m×m 0/1 matrices with ``n`` ones in every row and column (``None``: m > 8,
    where there are always more than :data:`MAX_2D_BEST_PATTERNS`)."""
    if m > 8:
        return None

    @functools.lru_cache(maxsize=None)
    def rec(rows_left: int, caps: tuple[int, ...]) -> int:
        # caps[c] = number of columns that can still take c more ones
        if rows_left == 0:
            return int(all(k == 0 for k in caps[1:]))
        total = 0

        def pick(c: int, need: int, ways: int, new: list[int]):
            nonlocal total
            if need == 0:
                total += ways * rec(rows_left - 1, tuple(new))
                return
            if c > n:
                return
            for k in range(min(need, caps[c]) + 1):
                nxt = list(new)
                nxt[c] -= k
                nxt[c - 1] += k
                pick(c + 1, need - k, ways * math.comb(caps[c], k), nxt)

        pick(1, n, 1, list(caps))
        return total

    return rec(m, tuple([0] * n + [m]))


@functools.lru_cache(maxsize=8)
def patterns_2d(m: int, n: int) -> np.ndarray:
    """All m×m patterns with ``n`` ones per row and column, as float32 (P, m*m), ordered by the
    integer whose bit ``m*r + c`` is element (r, c) — for m=4, n=2 the order of
    ``reference.transposable_patterns``."""
    rows = [sum(1 << c for c in cs) for cs in itertools.combinations(range(m), n)]
    out: list[int] = []

    def rec(r: int, colcount: list[int], acc: int):
        if r == m:
            out.append(acc)
            return
        left = m - r
        for bits in rows:
            cols = [c for c in range(m) if bits >> c & 1]
            if any(colcount[c] >= n for c in cols):
                continue
            for c in cols:
                colcount[c] += 1
            # every column must still be able to reach n with the remaining rows
            if all(n - colcount[c] <= left - 1 for c in range(m)):
                rec(r + 1, colcount, acc | (bits << (m * r)))
            for c in cols:
                colcount[c] -= 1

    rec(0, [0] * m, 0)
    out.sort()
    pats = np.array([[(p >> i) & 1 for i in range(m * m)] for p in out], dtype=np.float32)
    return pats


def best_2d_mask(x, n: int, m: int, ctx: str):
    """Exact 2-D N:M: per m×m block the pattern (n ones per row and column) with the largest
    kept ``Σ|x|``; m4n2 is ``ops.transposable_mask24``, other m/n score every pattern."""
    shape = np.shape(x)
    _rank2(shape, ctx, "2-D masks")
    _divisible(shape[0], m, ctx, f"axis 0 (m×m blocks, m={m})")
    _divisible(shape[1], m, ctx, f"axis 1 (m×m blocks, m={m})")
    if (n, m) == (2, 4):
        return ops.transposable_mask24(x)
    count = count_2d_patterns(m, n)
    if count is None or count > MAX_2D_BEST_PATTERNS:
        how = "more than" if count is None else f"{count:,}, more than"
        raise ValueError(
            f"{ctx}: the exact 2-D search scores every {m}x{m} pattern with {n} ones per row and "
            f"column; there are {how} the {MAX_2D_BEST_PATTERNS:,} it supports. Use "
            f"'m{m}n{n}_2d_greedy' instead"
        )
    if int(np.prod(shape)) == 0:
        return jnp.zeros(shape, jnp.bool_)
    pats = jnp.asarray(patterns_2d(m, n))
    blocks = _blocks(x, m)
    batch = max(1, min(blocks.shape[0], _SCORE_ELEMS // pats.shape[0]))

    def best(b):
        return jnp.argmax(jnp.dot(b, pats.T, precision=lax.Precision.HIGHEST), axis=-1)

    idx = lax.map(best, blocks, batch_size=batch)
    return _unblocks(pats[idx] > 0.5, m, shape)


def mask_for(x, spec: PatternSpec, *, axis: int = 0, norm: str = "l1", layer: str | None = None,
             op: str = "mask_from_pattern"):
    """Mask of ``x`` for a parsed pattern; errors name the op, pattern, layer and constraint.

    One jitted computation per (shape, dtype, pattern) — the checks run while tracing."""
    return _mask_for_jit(x, spec, axis, norm, layer, op)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _mask_for_jit(x, spec: PatternSpec, axis: int, norm: str, layer: str | None, op: str):
    shape = np.shape(x)
    ctx = _where(op, spec.name, layer, shape)
    check_float(x, ctx)
    check_norm(norm, ctx)
    if spec.kind == "1d":
        ax = _axis(axis, len(shape), ctx)
        _divisible(shape[ax], spec.m, ctx, f"axis {ax} (groups of {spec.m} consecutive elements)")
        return ops.nm_mask(x, spec.n, spec.m, axis=ax)
    if spec.kind == "vector":
        return vector_mask(x, spec.n, spec.m, spec.v, axis, None, norm, ctx)
    if spec.kind == "block":
        return block_mask(x, spec.n, spec.m, spec.block, axis, norm, ctx)
    if spec.kind == "2d_best":
        return best_2d_mask(x, spec.n, spec.m, ctx)
    return greedy_2d_mask(x, spec.n, spec.m, ctx)


# ---------------------------------------------------------------------------------------------
# parameter-tree paths


def _as_list(pats) -> list:
    if pats is None:
        return []
    if isinstance(pats, (str, re.Pattern)):
        return [pats]
    return list(pats)


def path_matches(path: str, pats) -> bool:
    """True when any pattern matches. ``str`` = glob (``fnmatch``; ``*`` also crosses ``/``)
    against the leaf path or its layer path (leaf path minus the last key); ``re.Pattern`` or a
    ``"re:"``-prefixed str = regular expression searched in the leaf path."""
    layer = path.rsplit("/", 1)[0] if "/" in path else path
    for p in _as_list(pats):
        if isinstance(p, re.Pattern):
            if p.search(path):
                return True
        elif isinstance(p, str):
            if p.startswith("re:"):
                if re.search(p[3:], path):
                    return True
            elif fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(layer, p):
                return True
        else:
            raise ValueError(f"layer patterns must be str or re.Pattern, got {type(p).__name__}: {p!r}")
    return False


def flatten(tree) -> tuple[list[tuple[str, Any]], Any]:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [(path_str(p), x) for p, x in leaves], treedef


def find_leaf(flat: list[tuple[str, Any]], path: str, op: str) -> int:
    for i, (p, _) in enumerate(flat):
        if p == path:
            return i
    layers = sorted({p.rsplit("/", 1)[0] for p, _ in flat if "/" in p})
    raise ValueError(f"{op}: no parameter at path {path!r}; layers in the tree: {layers}")


# ---------------------------------------------------------------------------------------------
# channel permutation (ASP-style channel swaps between groups)


def _group_stats(aw: np.ndarray, members: np.ndarray, n: int):
    """For every member c of each group (G, m): base[c] = Σ_cols top-(n−1) of the other m−1
    members, sn[c] = their n-th largest per column (O,), and K[g] = Σ_cols top-n of the group."""
    vals = aw[members]  # (G, m, O)
    g, m, o = vals.shape
    srt = -np.sort(-vals, axis=1)
    kept = srt[:, :n].sum(axis=(1, 2))  # (G,)
    base = np.empty((g, m))
    sn = np.empty((g, m, o))
    for p in range(m):
        rest = -np.sort(-np.delete(vals, p, axis=1), axis=1)  # (G, m-1, O)
        base[:, p] = rest[:, : n - 1].sum(axis=(1, 2))
        sn[:, p] = rest[:, n - 1]
    return base, sn, kept


@jax.jit
def _swap_gain_rows_jit(sn_rows, aw):
    return jnp.sum(jnp.maximum(sn_rows[:, None, :], aw[None]), axis=-1)


def _swap_gain_rows(sn_rows: np.ndarray, aw32) -> np.ndarray:
    """M[a, b] = Σ_cols max(sn[a], |w_b|) for the given rows a, by XLA (float32, fused: the
    (rows, in, out) broadcast is never materialised)."""
    return np.asarray(_swap_gain_rows_jit(jnp.asarray(sn_rows, jnp.float32), aw32), np.float64)


def kept_by_groups(aw: np.ndarray, perm: np.ndarray, n: int, m: int) -> float:
    vals = aw[perm].reshape(-1, m, aw.shape[1])
    return float((-np.sort(-vals, axis=1))[:, :n].sum())


def search_permutation(w, n: int, m: int, max_iters: int | None, ctx: str) -> tuple[np.ndarray, int]:
    """Greedy channel swaps between groups of ``m`` rows of ``w`` (rows = the grouped channels),
    each the swap with the largest gain in kept ``Σ top-n |w|``; stops when no swap gains.

    Uses: top-n of (group − a + x) = S_{n−1}(rest_a) + max(s_n(rest_a), x) per column, so the
    gain of swapping a↔b is base[a] + M[a, b] + base[b] + M[b, a] − K[g(a)] − K[g(b)], and a
    swap only changes the rows of M for the 2m channels of the two groups.
    """
    aw = np.abs(np.asarray(w, dtype=np.float64))
    c, o = aw.shape
    g = c // m
    members = np.arange(c).reshape(g, m)
    if g < 2 or o == 0:
        return np.arange(c), 0
    grp = np.repeat(np.arange(g), m)
    base_g, sn_g, kept = _group_stats(aw, members, n)
    base = np.empty(c)
    sn = np.empty((c, o))
    base[members] = base_g
    sn[members] = sn_g
    aw32 = jnp.asarray(aw, jnp.float32)
    mm = _swap_gain_rows(sn, aw32)

    def gain_rows(rows: np.ndarray) -> np.ndarray:
        # gain[a, b] = base[a] + M[a, b] + base[b] + M[b, a] − K[g(a)] − K[g(b)]
        kc = kept[grp]
        out = (base[rows, None] + mm[rows] + base[None, :] + mm[:, rows].T
               - kc[rows, None] - kc[None, :])
        out[grp[rows][:, None] == grp[None, :]] = -np.inf  # swaps within a group change nothing
        return out

    gain = gain_rows(np.arange(c))
    max_iters = 4 * c if max_iters is None else int(max_iters)
    # M is summed in float32: count only gains well above its rounding (~out·eps32 relative)
    tol = 1e-5 * max(float(kept.mean()), np.finfo(np.float64).tiny)
    it = 0
    while it < max_iters:
        best = int(np.argmax(gain))  # first maximum: the lowest (a, b), a < b
        a, b = divmod(best, c)
        if not gain[a, b] > tol:
            break
        ga, gb = grp[a], grp[b]
        pa, pb = int(np.nonzero(members[ga] == a)[0][0]), int(np.nonzero(members[gb] == b)[0][0])
        members[ga, pa], members[gb, pb] = b, a
        grp[a], grp[b] = gb, ga
        touched = np.array([ga, gb])
        bg, sg, kg = _group_stats(aw, members[touched], n)
        idx = members[touched].reshape(-1)
        base[idx] = bg.reshape(-1)
        sn[idx] = sg.reshape(-1, o)
        kept[touched] = kg
        # only the rows of M for the touched channels change (M[a, b] depends on sn[a], |w_b|),
        # so only their rows and columns of the gain matrix do
        mm[idx] = _swap_gain_rows(sn[idx], aw32)
        rows = gain_rows(idx)
        gain[idx] = rows
        gain[:, idx] = rows.T
        it += 1
    return members.reshape(-1).copy(), it
