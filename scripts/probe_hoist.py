"""Does XLA hoist the loop-invariant weight compression out of a gradient-accumulation loop?

Compiles ``lax.scan`` over 4 micro-batches of a 2:4 linear layer's gradient (``backend="cutlass"``,
transposable mask: forward and input gradient both compress the weight) and reports, per
jax_sparse24 custom call, how many sit inside the loop (the while body and every computation it
calls) and how many outside. A hoisted compression would show ``masked_compress`` outside only.

    python scripts/probe_hoist.py [--d 2048] [--micro 4] [--tokens 2048]   # needs the GPU build
"""

from __future__ import annotations

import argparse
import collections
import re

import jax
import jax.numpy as jnp

import jax_sparse24 as s24

_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|called_computations|branch_computations)=\{?([^,}\s][^}]*?)(?:\}|,\s*\w+=|$)")
_TARGET = re.compile(r'custom_call_target="(jax_sparse24\w*)"')


def computations(hlo: str) -> dict[str, list[str]]:
    comps, name = {}, None
    for line in hlo.splitlines():
        m = _HEADER.match(line)
        if m:
            name = m.group(1)
            comps[name] = []
        elif name is not None:
            comps[name].append(line)
    return comps


def callees(lines: list[str]) -> set[str]:
    out = set()
    for line in lines:
        for group in _CALLS.findall(line):
            out.update(n.strip().lstrip("%") for n in group.split(",") if n.strip())
    return out


def custom_calls_by_place(hlo: str) -> dict[str, collections.Counter]:
    """{"in loop": Counter(target), "outside": Counter(target)} over the compiled module."""
    comps = computations(hlo)
    bodies = {n.lstrip("%") for lines in comps.values() for line in lines for n in re.findall(r"body=(%?[\w.\-]+)", line)}
    in_loop, todo = set(), list(bodies)
    while todo:  # everything reachable from a while body runs once per iteration
        c = todo.pop()
        if c in in_loop or c not in comps:
            continue
        in_loop.add(c)
        todo.extend(callees(comps[c]))
    places = {"in loop": collections.Counter(), "outside": collections.Counter()}
    for name, lines in comps.items():
        for line in lines:
            for target in _TARGET.findall(line):
                places["in loop" if name in in_loop else "outside"][target] += 1
    return places


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=2048, help="layer d -> 4d (default 2048)")
    p.add_argument("--micro", type=int, default=4, help="micro-batches (default 4)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per micro-batch (default 2048)")
    a = p.parse_args(argv)
    w = jax.random.normal(jax.random.key(0), (a.d, 4 * a.d), jnp.float32).astype(jnp.bfloat16)
    mask = s24.transposable_mask24(w)
    xs = jax.random.normal(jax.random.key(1), (a.micro, a.tokens, a.d), jnp.float32).astype(jnp.bfloat16)

    def loss(w, x):
        y = s24.sparse24_linear(x, w, mask, backend="cutlass", transposable=True)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    def step(w, xs):
        def body(acc, x):
            return acc + jax.grad(loss)(w, x).astype(jnp.float32), None

        return jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32), xs)[0]

    hlo = jax.jit(step).lower(w, xs).compile().as_text()
    places = custom_calls_by_place(hlo)
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}: scan over {a.micro} micro-batches of "
          f"{a.tokens} tokens, layer {a.d} -> {4 * a.d}")
    for place, counts in places.items():
        print(f"  {place}: {dict(sorted(counts.items())) or '-'}")
    hoisted = places["outside"]["jax_sparse24_masked_compress"] > 0 and not places["in loop"]["jax_sparse24_masked_compress"]
    print("weight compression hoisted out of the loop:", "yes" if hoisted else "no")


if __name__ == "__main__":
    main()
