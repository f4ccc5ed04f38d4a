"""Benchmark: what the device-side mask check of ``sparse24_linear`` costs in a training step.

A mask passed to :func:`jax_sparse24.sparse24_linear` as a traced argument is checked on the device
(``check_mask=True``, the default: one fused count per mask and a host callback that raises;
``check_mask="nan"``: the count poisons the output with NaN, no host round trip). This times the
``value_and_grad`` of a stack of 2:4 FFN layers whose transposable masks are arguments of the jitted
step, with the check on, "nan" and off, interleaved, plus a second check-off column as the noise floor.
(The layers ``Sparse24Dense`` / ``Sparse24Linear`` trust their own masks and run no check at all.)

    python benchmarks/bench_mask_check.py [--shapes gpt2,llama-1b] [--rounds 7] [--iters 10] [--out DIR]

Writes DIR/mask_check_<gpu>.json and .md (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository's jax_sparse24 without an install

#: name -> (layers, d_model, d_ffn, tokens)
SHAPES = {"gpt2": (12, 768, 3072, 8192), "llama-1b": (8, 2048, 5632, 8192), "tiny": (2, 64, 128, 64)}
VARIANTS = ("check off", "check on", "check nan", "check off (control)")


def _gpu_tag() -> str:
    import jax

    kind = jax.devices()[0].device_kind.lower()
    for tag in ("h200", "h100"):
        if tag in kind:
            return tag
    return jax.default_backend()


def build(shape: str):
    import jax
    import jax.numpy as jnp

    import jax_sparse24 as s24

    n_layer, d, f, tokens = SHAPES[shape]
    keys = iter(jax.random.split(jax.random.key(0), 4 * n_layer + 2))
    dt = jnp.bfloat16
    ws = [(jax.random.normal(next(keys), (d, f), dt) * d ** -0.5,
           jax.random.normal(next(keys), (f, d), dt) * f ** -0.5) for _ in range(n_layer)]
    ms = [(s24.transposable_mask24(a), s24.transposable_mask24(b)) for a, b in ws]
    x = jax.random.normal(next(keys), (tokens, d), dt)
    key = next(keys)

    def step_fn(check):
        def loss(ws, ms, x, key):
            h = x
            for j, ((a, b), (ma, mb)) in enumerate(zip(ws, ms)):
                k1, k2 = jax.random.split(jax.random.fold_in(key, j))
                u = s24.sparse24_linear(h, a, ma, key=k1, transposable=True, check_mask=check)
                h = h + s24.sparse24_linear(jax.nn.gelu(u), b, mb, key=k2, transposable=True, check_mask=check)
            return jnp.mean(jnp.square(h.astype(jnp.float32)))

        return jax.jit(jax.value_and_grad(loss))

    fns = {"check off": step_fn(False), "check on": step_fn(True), "check nan": step_fn("nan"),
           "check off (control)": step_fn(False)}
    return fns, (ws, ms, x, key)


def measure(shape: str, rounds: int, iters: int) -> dict:
    import jax

    fns, args = build(shape)
    for fn in fns.values():  # compile and warm up
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in fns}
    for _ in range(rounds):  # interleaved rounds
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(iters):
                out = fn(*args)
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - t0) / iters)
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["check off"]
    n_layer, d, f, tokens = SHAPES[shape]
    return {"shape": shape, "layers": n_layer, "d_model": d, "d_ffn": f, "tokens": tokens,
            "ms": {k: v * 1e3 for k, v in med.items()},
            "ratio_vs_check_off": {k: v / base for k, v in med.items()},
            "rounds_ms": {k: [t * 1e3 for t in v] for k, v in times.items()}}


def to_markdown(res: dict) -> str:
    lines = [f"# Cost of the device-side mask check ({res['device']})", "",
             "`value_and_grad` of a stack of 2:4 FFN layers (`sparse24_linear`, transposable masks passed as "
             "traced arguments, MVUE weight gradient, bf16), medians of interleaved rounds; ratio = time / "
             "check-off time (> 1: slower). `Sparse24Dense`/`Sparse24Linear` run no check (their masks are "
             "the library's). Command: `" + res["command"] + "`", "",
             "| shape | layers x (d -> ffn -> d) | tokens | check off ms | check on (raise) | check nan | control (off) |",
             "|---|---|---|---|---|---|---|"]
    for r in res["results"]:
        q = r["ratio_vs_check_off"]
        lines.append(f"| {r['shape']} | {r['layers']} x ({r['d_model']} -> {r['d_ffn']}) | {r['tokens']} | "
                     f"{r['ms']['check off']:.2f} | {q['check on']:.3f}x | {q['check nan']:.3f}x | "
                     f"{q['check off (control)']:.3f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="gpt2,llama-1b", help=f"comma-separated of {sorted(SHAPES)}")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    import jax

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r}; choose from {sorted(SHAPES)}")
    import jax_sparse24 as s24

    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "python": platform.python_version(),
           "kernels": s24.cuda_kernels_available(),
           "command": "python benchmarks/bench_mask_check.py --shapes " + ",".join(shapes),
           "results": []}
    for s in shapes:
        r = measure(s, args.rounds, args.iters)
        print(f"{s}: " + ", ".join(f"{k} {v:.3f}x" for k, v in r["ratio_vs_check_off"].items()), flush=True)
        res["results"].append(r)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"mask_check_{_gpu_tag()}")
    with open(stem + ".json", "w") as fh:
        json.dump(res, fh, indent=1)
    with open(stem + ".md", "w") as fh:
        fh.write(to_markdown(res))
    print(to_markdown(res))


if __name__ == "__main__":
    main()
