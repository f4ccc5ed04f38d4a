"""Benchmark: what launching our custom calls costs inside a jitted step, with and without XLA's
command buffers (CUDA graphs).

Two measurements, each run in a fresh process per XLA flag setting (XLA reads ``XLA_FLAGS`` once):

1. ``chain``: a jitted function of N back-to-back tiny ops, each feeding the next (so nothing runs in
   parallel and nothing is dropped): our fused compressor custom call on a 64 x 128 weight followed
   by a tiny XLA fusion, against the same chain with the custom call replaced by its jnp reference
   (XLA fusions only). Time per link = wall time of the jitted call / N — at these sizes the GPU
   work is ~1-2 µs, so the rest is launch cost.
2. ``step``: value_and_grad of a GPT-2-shaped stack of 2:4 FFN layers (12 x (768 -> 3072 -> 768),
   8192 tokens, backend="cutlass" forced so every GEMM is a custom call plus its compressors) and the
   same stack dense, per flag setting: the step time and the 2:4 / dense ratio.

Flag settings: ``default`` (XLA's command buffers as shipped), ``off``
(``--xla_gpu_enable_command_buffer=``: every thunk launched one by one), and ``min1``
(``--xla_gpu_graph_min_graph_size=1``: also short runs of commands captured).

    python benchmarks/bench_launch.py [--out DIR] [--links 64] [--quick]

Writes DIR/launch_overhead.json and .md (default benchmarks/results). Needs a GPU and the extension;
``--smoke-cpu`` runs the chain section on the CPU reference for the script's test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SETTINGS = {
    "default": "",
    "off": "--xla_gpu_enable_command_buffer=",
    "min1": "--xla_gpu_graph_min_graph_size=1",
}


def _median_time(fn, args, rounds: int, iters: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            r = fn(*args)
        jax.block_until_ready(r)
        out.append((time.perf_counter() - t0) / iters)
    return statistics.median(out)


def worker(section: str, links: int, quick: bool) -> dict:
    """Runs in the child process (XLA_FLAGS already set): one section, returns its numbers."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, ROOT)
    import jax_sparse24 as s24
    import jax_sparse24.nn  # noqa: F401  (s24.nn)
    from jax_sparse24._src import cuda_compress_ops as cc
    from jax_sparse24._src import ffi

    res = {"kernels": ffi.cuda_kernels_available(), "device": jax.devices()[0].device_kind}
    rounds, iters = (3, 5) if quick else (7, 20)
    if section == "chain":
        key = jax.random.key(0)
        w = jax.random.normal(key, (128, 64), jnp.bfloat16)   # (I, O): A = W~^T (64, 128)
        mask = s24.mask24(w, axis=0)

        def link_custom(w):
            values, meta = cc.masked_compress(w, mask, transposed=True)
            # a tiny fusion that depends on the custom call's output and feeds the next link
            return w + (values[0, 0] * 0).astype(w.dtype) + (meta[0, 0] * 0).astype(w.dtype)

        def link_xla(w):
            wm = jnp.where(mask, w, 0)
            return w + (wm[0, 0] * 0).astype(w.dtype) + jnp.sum(wm[:2, :2] * 0).astype(w.dtype)

        def chain(link):
            def f(w):
                for _ in range(links):
                    w = link(w)
                return w
            return jax.jit(f)

        use_custom = res["kernels"]
        t_custom = _median_time(chain(link_custom if use_custom else link_xla), (w,), rounds, iters)
        t_xla = _median_time(chain(link_xla), (w,), rounds, iters)
        res.update(links=links, us_per_link_custom=t_custom / links * 1e6, us_per_link_xla=t_xla / links * 1e6,
                   custom_calls=use_custom)
    else:
        import flax.linen as nn

        d, f, tokens, layers = 768, 3072, 8192, 12

        class Stack(nn.Module):
            sparse: bool

            @nn.compact
            def __call__(self, x):
                for i in range(layers):
                    if self.sparse:
                        kw = dict(method="srste", backend="cutlass", dtype=jnp.bfloat16, param_dtype=jnp.float32)
                        h = nn.gelu(s24.nn.Sparse24Dense(f, name=f"up{i}", **kw)(x))
                        h = s24.nn.Sparse24Dense(d, name=f"down{i}", **kw)(h)
                    else:
                        kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32)
                        h = nn.Dense(d, name=f"down{i}", **kw)(nn.gelu(nn.Dense(f, name=f"up{i}", **kw)(x)))
                    x = x + h
                return x

        x = jax.random.normal(jax.random.key(1), (tokens, d), jnp.bfloat16)
        for name, sparse in (("dense", False), ("sparse", True)):
            model = Stack(sparse)
            variables = model.init(jax.random.key(2), x[:8])
            params = variables["params"]
            other = {k: v for k, v in variables.items() if k != "params"}

            def loss(p, x, model=model, other=other):
                y = model.apply({"params": p, **other}, x, rngs={"mvue": jax.random.key(3)})
                return jnp.mean(jnp.square(y.astype(jnp.float32)))

            step = jax.jit(jax.value_and_grad(loss))
            res[f"ms_{name}"] = _median_time(step, (params, x), rounds, max(3, iters // 4)) * 1e3
        res["ratio"] = res["ms_dense"] / res["ms_sparse"]
    return res


def run_child(section: str, setting: str, links: int, quick: bool, cpu: bool) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SETTINGS[setting]).strip()
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", section, "--links", str(links)]
    if quick:
        cmd.append("--quick")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{section}/{setting} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Launch cost of our custom calls inside a jitted step ({meta['device']})", "",
             f"Command: `{meta['command']}`; jax {meta['jax']}. Each row is a fresh process with the XLA flags shown.", ""]
    chain = [r for r in rows if r["section"] == "chain"]
    if chain:
        lines += ["## Chain of tiny ops (per link: one op + one tiny XLA fusion, each feeding the next)", "",
                  "| XLA flags | µs per link, our custom call | µs per link, XLA fusion instead |", "|---|---|---|"]
        for r in chain:
            lines.append(f"| {r['setting']} (`{SETTINGS[r['setting']] or 'none'}`) | {r['us_per_link_custom']:.2f} "
                         f"| {r['us_per_link_xla']:.2f} |")
        lines.append("")
    step = [r for r in rows if r["section"] == "step"]
    if step:
        lines += ["## GPT-2-shaped FFN stack, value_and_grad (12 x 768->3072->768, 8192 tokens)", "",
                  "| XLA flags | dense ms | 2:4 (cutlass forced) ms | dense / 2:4 |", "|---|---|---|---|"]
        for r in step:
            lines.append(f"| {r['setting']} | {r['ms_dense']:.3f} | {r['ms_sparse']:.3f} | {r['ratio']:.3f}x |")
        lines.append("")
    lines += ["`default`: XLA's command buffers as shipped; `off`: `--xla_gpu_enable_command_buffer=` (no CUDA "
              "graphs); `min1`: `--xla_gpu_graph_min_graph_size=1`. Our FFI handlers are declared "
              "command-buffer compatible (`kCmdBufferCompatible`)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--links", type=int, default=64)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--sections", nargs="+", default=["chain", "step"], choices=["chain", "step"])
    p.add_argument("--worker", choices=["chain", "step"], help=argparse.SUPPRESS)
    p.add_argument("--smoke-cpu", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.links < 1:
        p.error("--links must be positive")
    if a.worker:
        print(json.dumps(worker(a.worker, a.links, a.quick)))
        return 0
    import jax

    sections = ["chain"] if a.smoke_cpu else a.sections
    rows = []
    for section in sections:
        for setting in a.settings:
            r = run_child(section, setting, a.links, a.quick or a.smoke_cpu, a.smoke_cpu)
            r.update(section=section, setting=setting)
            rows.append(r)
            print(json.dumps(r), flush=True)
    meta = {"device": rows[0]["device"] if rows else "?", "jax": jax.__version__, "python": platform.python_version(),
            "command": "python benchmarks/bench_launch.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    os.makedirs(a.out, exist_ok=True)
    name = "launch_overhead_smoke" if a.smoke_cpu else "launch_overhead"
    with open(os.path.join(a.out, name + ".json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    with open(os.path.join(a.out, name + ".md"), "w") as fh:
        fh.write(markdown(meta, rows))
    print(markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
