"""Helpers that read traced programs (jaxprs) in tests."""

from __future__ import annotations


def sharding_constraints(jaxpr, out=None) -> list:
    """``(shape, spec)`` of every ``with_sharding_constraint`` in ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``)
    and in the jaxprs inside it (scan, remat, custom_vjp, pjit), in program order."""
    from jax.extend import core as jcore

    out = [] if out is None else out
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "sharding_constraint":
            out.append((tuple(eqn.invars[0].aval.shape), tuple(eqn.params["sharding"].spec)))
        for p in eqn.params.values():
            for sub in p if isinstance(p, (list, tuple)) else (p,):
                if isinstance(sub, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                    sharding_constraints(sub, out)
    return out
