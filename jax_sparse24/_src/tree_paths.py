"""Pytree key paths as strings/tuples (shared by nn, optim and prune)."""

from __future__ import annotations


def key_str(k) -> str:
    """One path entry (DictKey, GetAttrKey, SequenceKey, ...) as a string."""
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_str(path) -> str:
    """A key path joined by ``"/"``, e.g. ``"params/Dense_0/kernel"``."""
    return "/".join(key_str(k) for k in path)


def path_tuple(path) -> tuple:
    """A key path as a tuple of plain keys."""
    return tuple(getattr(k, "key", getattr(k, "name", k)) for k in path)
