"""Argument checks shared by every op: one place that words each constraint.

All checks run at trace time on static shape/dtype information and raise ``ValueError`` naming
the constraint and the offending shape. :func:`check_nm_mask_concrete` additionally inspects
concrete (non-traced) masks.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MAX_M = 32


def _shape(x) -> tuple[int, ...]:
    return tuple(np.shape(x))


def check_float(x, name: str, op: str) -> None:
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{op}: `{name}` must be a floating-point array (float32, bfloat16, float16, float64), "
            f"got dtype {dtype} with shape {_shape(x)}"
        )


def normalize_axis(axis: int, ndim: int, op: str, shape: Sequence[int]) -> int:
    if ndim == 0:
        raise ValueError(f"{op}: expected an array with at least 1 dimension, got a scalar")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for an array of shape {tuple(shape)}")
    return axis % ndim


def check_positive_int(n, name: str, op: str, *, allow_none: bool = False) -> None:
    """``n`` is a positive integer (an int-valued number, not a bool), or ``None`` if allowed."""
    if allow_none and n is None:
        return
    if isinstance(n, bool) or n is None or int(n) != n or n < 1:
        raise ValueError(f"{op}: {name} must be a positive integer{' or None' if allow_none else ''}, got {n!r}")


def check_nm(n: int, m: int, op: str) -> None:
    if not isinstance(n, (int, np.integer)) or not isinstance(m, (int, np.integer)):
        raise ValueError(f"{op}: n and m must be Python ints, got n={n!r}, m={m!r}")
    if m < 2 or m > MAX_M:
        raise ValueError(f"{op}: m must satisfy 2 <= m <= {MAX_M}, got m={m}")
    if n < 1 or n >= m:
        raise ValueError(f"{op}: n must satisfy 1 <= n < m, got n={n}, m={m}")


def check_divisible(x, axis: int, m: int, op: str, what: str = "axis") -> None:
    shape = _shape(x)
    if shape[axis] % m:
        raise ValueError(
            f"{op}: the size of {what} {axis} must be divisible by {m} (groups of {m} consecutive "
            f"elements), got shape {shape}"
        )


def check_rank(x, ndim: int, op: str, name: str = "x") -> None:
    shape = _shape(x)
    if len(shape) != ndim:
        raise ValueError(f"{op}: `{name}` must have rank {ndim}, got shape {shape}")


def is_concrete(x) -> bool:
    """True when ``x`` holds a value now (not a tracer inside jit/grad/vmap)."""
    return not isinstance(x, jax.core.Tracer)


def check_nm_mask_concrete(mask, n: int, m: int, axis: int, op: str, name: str = "mask") -> None:
    """If ``mask`` is concrete, check it keeps at most ``n`` of every ``m`` along ``axis``."""
    if not is_concrete(mask):
        return
    arr = np.asarray(mask)
    axis = axis % arr.ndim
    if arr.shape[axis] % m:
        raise ValueError(
            f"{op}: `{name}` axis {axis} must be divisible by {m}, got shape {arr.shape}"
        )
    moved = np.moveaxis(arr != 0, axis, -1)
    counts = moved.reshape(*moved.shape[:-1], -1, m).sum(-1)
    if counts.size and counts.max() > n:
        bad = int((counts > n).sum())
        raise ValueError(
            f"{op}: `{name}` is not {n}:{m} along axis {axis}: {bad} group(s) of {m} keep more "
            f"than {n} elements (shape {arr.shape})"
        )


def check_same_shape(a, b, op: str, names: tuple[str, str]) -> None:
    if _shape(a) != _shape(b):
        raise ValueError(
            f"{op}: `{names[0]}` and `{names[1]}` must have the same shape, got {_shape(a)} and {_shape(b)}"
        )
