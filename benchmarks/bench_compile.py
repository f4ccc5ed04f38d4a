r"""Compile time of a user's own unrolled LLaMA, dense (``nn.Dense``) against 2:4 SR-STE (``Sparse24Dense``).

The model is what a user writes from the README and docs/multi_gpu.md alone, with the public API only: a
Python ``for`` loop of LLaMA blocks (RMSNorm, attention with q/k/v/o projections, SwiGLU MLP: 7 linear
layers per block, every one ``Sparse24Dense`` in the srste recipe and ``nn.Dense`` in dense), a dense vocabulary
head, :class:`jax_sparse24.training.SparseTrainState`, the train step of the README (``value_and_grad`` then
``apply_gradients``), FSDP with ``jax_sparse24.sharding.param_shardings(..., fsdp="fsdp")`` and the activation
pins of ``batch_sharded_activations``, or data parallel (``--mesh data=N``: replicated state).

For each recipe and layer count, interleaved over ``--rounds``, a fresh ``jax.jit`` of the step is traced
(``jit(...).trace``: Python and JAX tracing to a jaxpr), lowered (``.lower()``: StableHLO) and compiled
(``.compile()``: XLA, including the partitioner and the 2:4 ops' ``custom_partitioning`` callbacks) on
abstract arguments (nothing is allocated, so the full LLaMA-7B shape compiles on any host). It reports the
median of each phase, srste / dense ratios, and the part of srste's compile spent in the partitioner
callbacks (``jax_sparse24._src.partitioning.partition_callback_stats``, a diagnostic). Runs on a CPU with fake
devices (``--cpu-devices N`` sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N``) and on GPUs unchanged::

    # CPU, fake devices
    python benchmarks/bench_compile.py --cpu-devices 2 --d-model 512 --n-layer 4,8,16,32 --mesh 'fsdp=2;data=2' \
        --tokens 2048 --variants dense,srste,srste/uncached --uncached-max-layers 16 --out benchmarks/results \
        --name compile_cpu_d512_l4-32
    # 4 GPUs, LLaMA-7B-shaped (d 4096, FFN 11008, 32 heads), 8,192 tokens per GPU; compile only, nothing allocated
    python benchmarks/bench_compile.py --d-model 4096 --n-layer 16,32 --mesh fsdp=4 --vocab 32000 --tokens 32768 \
        --seq-len 2048 --variants dense,srste --out benchmarks/results --name compile_h200x4_llama-7b_l16-32
    # the same before/after the shared partition results (srste/uncached: as before), 16 layers
    python benchmarks/bench_compile.py --d-model 4096 --n-layer 16 --mesh fsdp=4 --vocab 32000 --tokens 32768 \
        --seq-len 2048 --variants dense,srste,srste/uncached --out benchmarks/results --name compile_h200x4_llama-7b_l16_uncached
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path


def _early_cpu_devices(argv) -> None:
    """``--cpu-devices N``: fake N host devices (must be set before JAX starts)."""
    for i, a in enumerate(argv):
        n = a.split("=", 1)[1] if a.startswith("--cpu-devices=") else argv[i + 1] if a == "--cpu-devices" and i + 1 < len(argv) else None
        if n:
            flags = os.environ.get("XLA_FLAGS", "")
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(n)}".strip()
            os.environ.setdefault("JAX_PLATFORMS", "cpu")


if __name__ == "__main__":
    _early_cpu_devices(sys.argv[1:])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24 import sharding as shd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import partition_profile  # noqa: E402  (times the partitioner callbacks; before any op is traced)
from result_files import write_result  # noqa: E402


RECIPES = ("dense", "srste")


# ---------------------------------------------------------------------------------------------
# The user's model: public API only
# ---------------------------------------------------------------------------------------------


def linear(recipe: str, features: int, name: str, dtype):
    if recipe == "dense":
        return nn.Dense(features, use_bias=False, dtype=dtype, name=name)
    return s24.nn.Sparse24Dense(features, use_bias=False, dtype=dtype, name=name)


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


class Attention(nn.Module):
    recipe: str
    n_head: int
    dtype: object

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        hd = d // self.n_head
        q, k, v = (linear(self.recipe, d, n, self.dtype)(x).reshape(b, t, self.n_head, hd) for n in ("q", "k", "v"))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return linear(self.recipe, d, "o", self.dtype)(y.reshape(b, t, d))


class MLP(nn.Module):
    recipe: str
    ffn: int
    dtype: object

    @nn.compact
    def __call__(self, x):
        gate = linear(self.recipe, self.ffn, "gate", self.dtype)(x)
        up = linear(self.recipe, self.ffn, "up", self.dtype)(x)
        return linear(self.recipe, x.shape[-1], "down", self.dtype)(nn.silu(gate) * up)


class Block(nn.Module):
    recipe: str
    n_head: int
    ffn: int
    dtype: object

    @nn.compact
    def __call__(self, x):
        x = x + Attention(self.recipe, self.n_head, self.dtype)(RMSNorm()(x))
        return x + MLP(self.recipe, self.ffn, self.dtype)(RMSNorm()(x))


class LLaMA(nn.Module):
    recipe: str
    vocab: int
    d_model: int
    n_layer: int
    n_head: int
    ffn: int
    dtype: object = jnp.bfloat16

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d_model, dtype=self.dtype)(tokens)
        for i in range(self.n_layer):  # unrolled: one Python block per layer
            x = Block(self.recipe, self.n_head, self.ffn, self.dtype, name=f"block_{i}")(x)
        return nn.Dense(self.vocab, use_bias=False, dtype=self.dtype, name="head")(RMSNorm()(x))


def ffn_width(d: int) -> int:
    """LLaMA's SwiGLU width (8/3 d rounded up to a multiple of 256: 11008 at d 4096)."""
    return 256 * -(-(8 * d // 3) // 256)


def build(recipe: str, a, mesh):
    """(step function, abstract state, abstract batch, shardings) of one recipe's user program."""
    model = LLaMA(recipe, a.vocab, a.d_model, a.n_layer_now, a.n_head, ffn_width(a.d_model))
    batch = a.tokens // a.seq_len
    x = jax.ShapeDtypeStruct((batch, a.seq_len), jnp.int32)
    if recipe == "dense":
        tx = optax.adamw(3e-4)
    else:  # the README's SR-STE optimizer, its 2:4 weights named (the head is dense)
        where = lambda path, leaf: "block_" in path and path.endswith("kernel")  # noqa: E731
        tx = optax.chain(s24.optim.masked_decay(2e-2, where=where), optax.adamw(3e-4),
                         s24.optim.sparse_lr_scale(2.0, where=where))

    def create(key):
        v = model.init(key, jnp.zeros(x.shape, x.dtype))
        return s24.training.SparseTrainState.create(apply_fn=model.apply, params=v["params"], tx=tx,
                                                    sparsity=v.get("sparsity", {}), rng=jax.random.key(2))

    state = jax.eval_shape(create, jax.random.key(0))
    fsdp = "fsdp" if "fsdp" in mesh.axis_names else None
    state_sh = shd.param_shardings(state, mesh, fsdp=fsdp)
    batch_axes = tuple(n for n in ("data", "fsdp") if n in mesh.axis_names)
    batch_sh = NamedSharding(mesh, P(batch_axes))

    def train_step(state, x, y):
        def loss_fn(p):
            if fsdp:
                with shd.batch_sharded_activations(mesh, batch_axes):
                    logits = state.apply(x, params=p)
            else:
                logits = state.apply(x, params=p)
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

        if a.prepare:
            state = state.prepare(x)
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    args = (state, jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sh),
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sh))
    args = (jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, state_sh),
            *args[1:])
    return train_step, args, (state_sh, batch_sh)


def callback_stats() -> dict:
    """The 2:4 ops' partitioner-callback counters (benchmarks/partition_profile.py, imported at the top)."""
    return partition_profile.partition_callback_stats()


@contextlib.contextmanager
def partition_cache(on: bool):
    """``srste``: the library's shared partition results on (``JAX_SPARSE24_SHARED_PARTITIONS=1``, opt-in);
    ``srste/uncached``: off, every 2:4 op instance partitioned on its own (the library's default)."""
    from jax_sparse24._src import partitioning as _shd

    saved = _shd._shared_partitioning() is not None
    if on and not _shd.share_partition_results(True):
        raise SystemExit("bench_compile: this JAX lacks the internals of the shared partition results")
    if not on:
        _shd.share_partition_results(False)
    try:
        yield
    finally:
        _shd.share_partition_results(saved)


def measure(variant: str, a, mesh) -> dict:
    """Trace, lower and compile a fresh jit of one variant's train step (seconds per phase; ``*_cpu_s``: CPU
    seconds of this process, all threads, which other processes on a shared host do not inflate)."""
    recipe, _, option = variant.partition("/")
    step, args, (state_sh, batch_sh) = build(recipe, a, mesh)
    jitted = jax.jit(step, out_shardings=(state_sh, NamedSharding(mesh, P())), donate_argnums=0)
    with partition_cache(option != "uncached"):
        c0, t0 = time.process_time(), time.perf_counter()
        traced = jitted.trace(*args)
        t1 = time.perf_counter()
        lowered = traced.lower()
        c2, t2 = time.process_time(), time.perf_counter()
        cb0 = callback_stats()
        exe = lowered.compile()
        c3, t3 = time.process_time(), time.perf_counter()
        cb1 = callback_stats()
    d = {k: (n - cb0.get(k, (0, 0.0))[0], s - cb0.get(k, (0, 0.0))[1]) for k, (n, s) in cb1.items()}
    n_cp = lowered.as_text().count("CustomSPMDPartitioning")
    del exe
    return {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2, "total_s": t3 - t0,
            "trace_lower_cpu_s": c2 - c0, "compile_cpu_s": c3 - c2, "total_cpu_s": c3 - c0,
            "partition_callbacks": sum(n for k, (n, _) in d.items() if not k.endswith(" (cached)")),
            "partition_results_reused": sum(n for k, (n, _) in d.items() if k.endswith(" (cached)")),
            "partition_callback_s": sum(s for _, (_, s) in d.items()), "custom_partitioning_ops": n_cp}


def run(a) -> dict:
    rows = []
    for mesh_spec in a.mesh:
        mesh = shd.make_mesh(mesh_spec)
        for n_layer in a.n_layer:
            a.n_layer_now = n_layer
            variants = [v for v in a.variants if not (v == "srste/uncached" and n_layer > a.uncached_max_layers)]
            samples = {v: [] for v in variants}
            for rnd in range(a.rounds):
                for v in (variants if rnd % 2 == 0 else variants[::-1]):  # interleaved, order alternated
                    m = measure(v, a, mesh)
                    samples[v].append(m)
                    print(f"  mesh {mesh_spec:10s} {n_layer:3d} layers  {v:15s} round {rnd}: trace {m['trace_s']:.2f}s "
                          f"lower {m['lower_s']:.2f}s compile {m['compile_s']:.2f}s (CPU {m['compile_cpu_s']:.2f}s; "
                          f"partitioner callbacks {m['partition_callbacks']}, {m['partition_callback_s']:.2f}s, "
                          f"{m['partition_results_reused']} partition results reused)", flush=True)
            med = {v: {k: statistics.median(s[k] for s in samples[v]) for k in samples[v][0]} for v in variants}
            row = {"mesh": mesh_spec, "n_layer": n_layer, **med, "samples": samples}
            for v in variants[1:]:
                row[f"ratio_compile/{v}"] = med[v]["compile_s"] / med["dense"]["compile_s"]
                row[f"ratio_compile_cpu/{v}"] = med[v]["compile_cpu_s"] / med["dense"]["compile_cpu_s"]
                row[f"ratio_total/{v}"] = med[v]["total_s"] / med["dense"]["total_s"]
                print(f"  mesh {mesh_spec} {n_layer} layers: {v}/dense compile {row[f'ratio_compile/{v}']:.2f}x "
                      f"(CPU time {row[f'ratio_compile_cpu/{v}']:.2f}x), trace+lower+compile "
                      f"{row[f'ratio_total/{v}']:.2f}x", flush=True)
            rows.append(row)
    dev = jax.devices()
    return {"bench": "bench_compile", "platform": dev[0].platform, "device_kind": dev[0].device_kind,
            "n_devices": len(dev), "fake_cpu_devices": dev[0].platform == "cpu" and len(dev) > 1,
            "jax": jax.__version__, "host": platform.node(), "variants": a.variants,
            "d_model": a.d_model, "n_head": a.n_head, "ffn": ffn_width(a.d_model), "vocab": a.vocab,
            "tokens": a.tokens, "seq_len": a.seq_len, "prepare": a.prepare, "rounds": a.rounds,
            "note": a.note, "rows": rows}


def to_markdown(res: dict) -> str:
    cpu = res["platform"] == "cpu"
    where = (f"CPU with {res['n_devices']} fake devices (`--xla_force_host_platform_device_count`)"
             if cpu else f"{res['n_devices']} x {res['device_kind']}")
    variants = res["variants"]
    lines = [f"# Compile time of an unrolled user-style LLaMA: dense vs srste ({where})", "",
             f"d_model {res['d_model']}, {res['n_head']} heads, FFN {res['ffn']}, vocabulary {res['vocab']}, "
             f"{res['tokens']} tokens per step (sequence {res['seq_len']}), unrolled Python loop of blocks, every "
             f"block linear `nn.Dense` (dense) or `Sparse24Dense` (srste), `SparseTrainState`"
             f"{' + prepare' if res['prepare'] else ''}, value_and_grad + apply_gradients, FSDP with "
             f"`param_shardings(..., fsdp=\"fsdp\")` + `batch_sharded_activations` or data parallel; jax {res['jax']}. "
             f"Median of {res['rounds']} interleaved rounds. Seconds: trace = `jit(...).trace`, lower = `.lower()`, "
             f"compile = `.compile()` (XLA, the partitioner callbacks included); CPU s = CPU time of the process "
             f"in the compile (all threads)."
             + (" `srste/uncached`: the 2:4 ops' partition results not shared between identical op instances "
                "(as before that change)." if "srste/uncached" in variants else ""), ""]
    if res.get("note"):
        lines += [res["note"], ""]
    if res.get("command"):
        lines += [f"`{res['command']}`", ""]
    head = "| mesh | layers | variant | trace | lower | compile | compile CPU s | partitioner callbacks, partition results reused, callback s | compile vs dense | compile CPU s vs dense | total vs dense |"
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for r in res["rows"]:
        for v in (v for v in variants if v in r):
            m = r[v]
            bold_wall, bold_cpu = ("", "**") if cpu else ("**", "")  # a shared CPU host: its own CPU time is steadier
            ratio = "" if v == "dense" else f"{bold_wall}{r[f'ratio_compile/{v}']:.2f}x{bold_wall}"
            ratio_cpu = "" if v == "dense" else f"{bold_cpu}{r[f'ratio_compile_cpu/{v}']:.2f}x{bold_cpu}"
            ratio_tot = "" if v == "dense" else f"{r[f'ratio_total/{v}']:.2f}x"
            lines.append(f"| `{r['mesh']}` | {r['n_layer']} | {v} | {m['trace_s']:.2f} | {m['lower_s']:.2f} | "
                         f"{m['compile_s']:.2f} | {m['compile_cpu_s']:.2f} | {m['partition_callbacks']:.0f}, "
                         f"{m['partition_results_reused']:.0f}, {m['partition_callback_s']:.2f} | {ratio} | {ratio_cpu} | {ratio_tot} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--n-head", type=int, default=0, help="0: d_model / 128 (LLaMA's head size)")
    ap.add_argument("--n-layer", default="4,8", help="comma-separated layer counts")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (all devices)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--mesh", default="fsdp=2", help="';'-separated meshes, e.g. 'fsdp=2;data=2'")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", default="dense,srste",
                    help="dense,srste[,srste/uncached] (srste/uncached: partition results not shared, as before)")
    ap.add_argument("--uncached-max-layers", type=int, default=10**9,
                    help="run srste/uncached only up to this many layers (it is the slow one)")
    ap.add_argument("--prepare", action="store_true", help="state.prepare(x) in the step (the weights prepared once)")
    ap.add_argument("--cpu-devices", type=int, default=0, help="fake this many CPU devices (set before JAX starts)")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--name", default="compile")
    a = ap.parse_args(argv)
    a.n_layer = [int(n) for n in str(a.n_layer).split(",") if n]
    a.mesh = [m.strip() for m in a.mesh.split(";") if m.strip()]
    a.n_head = a.n_head or max(1, a.d_model // 128)
    a.variants = [v for v in a.variants.split(",") if v]
    if a.variants[0] != "dense" or any(v.split("/")[0] not in RECIPES for v in a.variants):
        ap.error("--variants: dense first, then srste or srste/uncached")
    if a.tokens % a.seq_len:
        ap.error("--tokens must be a multiple of --seq-len")
    res = run(a)
    res["command"] = "python benchmarks/bench_compile.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    md = to_markdown(res)
    print(md)
    if a.out is not None:
        write_result(a.out, a.name, res, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
