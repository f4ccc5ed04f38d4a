"""Benchmark: is a fused gated-activation (SwiGLU) kernel worth writing? Where the FFN's time goes.

The 2by4 paper fuses the gated activation to save its memory traffic. This measures, per GPT-2-like
width d (T = 8192 tokens, bfloat16, SwiGLU hidden h = 8d/3 rounded up to 64, the example's
``--ffn swiglu``), in one run:

* ``ffn``: the whole FFN ``down(silu(a)·g)``, ``[a | g] = x·W_up`` — forward + backward (∇x, ∇W_up,
  ∇W_down) as XLA compiles it;
* ``gate``: the gated activation alone, forward + backward (``y = silu(a)·g`` and ``∇[a|g]`` from
  ``∇y``): its share of the FFN is the most a fused kernel could save;
* its effective bandwidth over the minimum bytes it must move (read ``[a|g]`` and ``∇y``, write ``y``
  and ``∇[a|g]``: 12·T·h bytes), next to ``copy`` (``2·[a|g]``, one read + one write) — the
  bandwidth an elementwise kernel reaches on this GPU.

A standalone kernel moves the same bytes as XLA's fusion, so it can only win where ``gate`` runs
below ``copy``'s bandwidth; beyond that, only folding the activation into the GEMM epilogue (no
``[a|g]`` round trip) saves time, bounded by ``gate``'s share.

    python benchmarks/bench_gated_ffn.py [--dims 768 1024 1280] [--out DIR]

Writes DIR/gated_ffn.json and .md (default benchmarks/results). Method as bench_spmm.py (interleaved
medians after warm-up, random normal inputs).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path[:0] = [os.path.join(HERE, "harness"), os.path.join(HERE, "..", "examples")]

from bench_spmm import measure, write_results  # noqa: E402

DTYPE = jnp.bfloat16
TOKENS = 8192


def swiglu_hidden(d: int) -> int:
    """The example's SwiGLU hidden size (examples/model.py: GPTConfig.ffn_hidden)."""
    return int(64 * math.ceil(8 * d / 3 / 64))


def gate(ab):
    a, g = jnp.split(ab, 2, axis=-1)
    return jax.nn.silu(a) * g


def gate_fwd_bwd(ab, dy):
    y, vjp = jax.vjp(gate, ab)
    return y, vjp(dy)[0]


def ffn_fwd_bwd(x, w_up, w_down, dout):
    def ffn(x, w_up, w_down):
        return gate(x @ w_up) @ w_down

    out, vjp = jax.vjp(ffn, x, w_up, w_down)
    return (out,) + vjp(dout)


def bench(d: int, trials: int, tokens: int = TOKENS) -> dict:
    h = swiglu_hidden(d)
    ks = jax.random.split(jax.random.key(d), 6)
    rnd = lambda k, shape, s=1.0: (jax.random.normal(k, shape, jnp.float32) * s).astype(DTYPE)  # noqa: E731
    x, dout = rnd(ks[0], (tokens, d)), rnd(ks[1], (tokens, d))
    w_up, w_down = rnd(ks[2], (d, 2 * h), d ** -0.5), rnd(ks[3], (h, d), h ** -0.5)
    ab, dy = rnd(ks[4], (tokens, 2 * h)), rnd(ks[5], (tokens, h))
    variants = {
        "ffn": (jax.jit(ffn_fwd_bwd), (x, w_up, w_down, dout)),
        "gate": (jax.jit(gate_fwd_bwd), (ab, dy)),
        "copy": (jax.jit(lambda ab: ab * jnp.asarray(2, ab.dtype)), (ab,)),
    }
    med, _ = measure(variants, 1, trials)
    item = jnp.dtype(DTYPE).itemsize
    gate_bytes = 6 * tokens * h * item  # read ab (2h) + dy (h), write y (h) + dab (2h): 6·T·h elements
    copy_bytes = 2 * tokens * 2 * h * item
    flops = 3 * 2 * tokens * (d * 2 * h + h * d)  # forward + 2 backward GEMMs of both layers
    return dict(
        d=d, hidden=h, tokens=tokens, dtype=jnp.dtype(DTYPE).name,
        ffn_ms=1e3 * med["ffn"], gate_ms=1e3 * med["gate"], copy_ms=1e3 * med["copy"],
        gate_share=med["gate"] / med["ffn"],
        gate_gbs=gate_bytes / med["gate"] / 1e9, copy_gbs=copy_bytes / med["copy"] / 1e9,
        gate_vs_copy_bandwidth=(gate_bytes / med["gate"]) / (copy_bytes / med["copy"]),
        ffn_tflops=flops / med["ffn"] / 1e12,
    )


def markdown(meta: dict, records: list) -> str:
    lines = [f"# SwiGLU FFN: where the time goes — {meta['device']}, jax {meta['jax']}, {meta['date']}", "",
             f"T = {meta['tokens']} tokens, bfloat16; `ffn` = forward + backward of the whole FFN (XLA), `gate` = "
             "forward + backward of `silu(a)·g` alone, GB/s over its minimum bytes (12·T·h); `copy` = `2·[a|g]` "
             "(the elementwise bandwidth reached on this GPU). Medians of interleaved trials.", "",
             "| d | hidden h | ffn ms | ffn TFLOP/s | gate ms | gate share of ffn | gate GB/s | copy GB/s | "
             "gate / copy bandwidth |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['d']} | {r['hidden']} | {r['ffn_ms']:.3f} | {r['ffn_tflops']:.0f} | {r['gate_ms']:.3f} | "
                     f"{100 * r['gate_share']:.1f}% | {r['gate_gbs']:.0f} | {r['copy_gbs']:.0f} | "
                     f"{r['gate_vs_copy_bandwidth']:.2f} |")
    lines += ["", "A standalone fused gated-activation kernel moves the same minimum bytes, so it can gain at most "
              "the gap between `gate` and `copy` bandwidth; removing the `[a|g]` round trip needs the activation "
              "in the up-projection GEMM's epilogue, worth at most `gate share`."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--dims", type=int, nargs="+", default=[768, 1024, 1280])
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--tokens", type=int, default=TOKENS, help=argparse.SUPPRESS)  # small for the CPU test
    args = p.parse_args(argv)
    meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, python=platform.python_version(),
                date=datetime.datetime.now().isoformat(timespec="seconds"), tokens=args.tokens, dims=args.dims,
                trials=args.trials)
    records = []
    for d in args.dims:
        records.append(bench(d, args.trials, args.tokens))
        print(records[-1], flush=True)
    write_results(args.out, "gated_ffn", meta, records, markdown(meta, records))


if __name__ == "__main__":
    main()
