"""Argument checks shared by every op: one place that words each constraint.

All checks run at trace time on static shape/dtype information and raise ``ValueError`` naming
the constraint and the offending shape. :func:`check_nm_mask` additionally inspects concrete masks,
and checks traced masks on the device too.
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


def _violations(mask, n: int, m: int, axis: int, xp=jnp):
    """``(groups keeping more than n of m along axis, all groups)`` of a mask (``xp``: numpy for a
    concrete mask — jnp would trace it inside an enclosing jit — or jnp for a traced one)."""
    kept = xp.moveaxis(xp.asarray(mask) != 0, axis, -1)
    counts = kept.reshape(*kept.shape[:-1], -1, m).sum(-1, dtype=xp.int32)
    return xp.sum(counts > n, dtype=xp.int32), counts.size


def _mask_message(op: str, name: str, n: int, m: int, axis: int, shape, bad: int, total: int,
                  axis_name: str | None, hint: str) -> str:
    where = f"axis {axis}" + (f" ({axis_name})" if axis_name else "")
    return (f"{op}: `{name}` is not {n}:{m} along {where}: {bad} of {total} group(s) of {m} keep more than "
            f"{n} elements (shape {tuple(shape)}).{hint}")


class MaskCheckError(ValueError):
    """A mask that is not N:M along its grouping axis reached an op that needs it (raised when the
    mask is concrete; when it is traced, the device check fails the computation with this message)."""


def _grouping_axis(mask, m: int, axis: int, op: str, name: str) -> tuple[tuple[int, ...], int]:
    """``(mask's shape, axis made non-negative)``; MaskCheckError unless the axis splits into groups of m."""
    shape = _shape(mask)
    axis = axis % len(shape)
    if shape[axis] % m:
        raise MaskCheckError(f"{op}: `{name}` axis {axis} must be divisible by {m}, got shape {shape}")
    return shape, axis


def check_nm_mask(mask, n: int, m: int, axis: int, op: str, name: str = "mask", *, on_device: bool | str = True,
                  axis_name: str | None = None, hint: str = ""):
    """``mask`` keeps at most ``n`` of every ``m`` along ``axis`` — whether concrete or traced.

    A concrete mask is checked now (``MaskCheckError``, a ``ValueError``). A traced mask (inside
    ``jit``/``grad``/``vmap``) is checked on the device when ``on_device`` is true: one fused
    reduction over the mask and a host callback that fails the computation with the same message
    (``jax.errors.JaxRuntimeError`` naming the argument and the axis) when any group breaks the
    pattern, so a wrong mask never yields a result. ``on_device=False`` skips the traced check;
    ``on_device="nan"`` only returns the traced scalar ``bad`` (True where some group breaks the
    pattern) for the caller to poison its result with (no host round trip). Returns ``None``
    otherwise.
    """
    shape, axis = _grouping_axis(mask, m, axis, op, name)
    if is_concrete(mask):
        bad, total = _violations(np.asarray(mask), n, m, axis, np)
        if int(bad):
            raise MaskCheckError(_mask_message(op, name, n, m, axis, shape, int(bad), total, axis_name, hint))
        return None
    if not on_device:
        return None
    bad, total = _violations(mask, n, m, axis)
    if on_device == "nan":
        return bad > 0

    def fail_if_bad(bad_groups):
        if int(bad_groups):
            raise MaskCheckError(_mask_message(op, name, n, m, axis, shape, int(bad_groups), total, axis_name,
                                               hint))

    jax.debug.callback(fail_if_bad, bad)
    return None


def check_concrete_mask_on_device(mask, n: int, m: int, axis: int, op: str, name: str = "mask", *,
                                  axis_name: str | None = None, hint: str = "") -> None:
    """:func:`check_nm_mask` of a concrete mask where it lives: a ``jax.Array``'s count runs on its
    devices (only a scalar comes back, no transfer of a large or sharded mask), a NumPy array's on the
    host. Skipped for a traced mask, a mask not fully addressable by this process (several
    processes), and inside an enclosing trace (where the count would be traced)."""
    if not is_concrete(mask) or (isinstance(mask, jax.Array) and not mask.is_fully_addressable):
        return
    shape, axis = _grouping_axis(mask, m, axis, op, name)
    try:
        bad, total = _violations(mask, n, m, axis, jnp if isinstance(mask, jax.Array) else np)
        bad = int(bad)
    except jax.errors.ConcretizationTypeError:
        return
    if bad:
        raise MaskCheckError(_mask_message(op, name, n, m, axis, shape, bad, total, axis_name, hint))


def check_same_shape(a, b, op: str, names: tuple[str, str]) -> None:
    if _shape(a) != _shape(b):
        raise ValueError(
            f"{op}: `{names[0]}` and `{names[1]}` must have the same shape, got {_shape(a)} and {_shape(b)}"
        )
