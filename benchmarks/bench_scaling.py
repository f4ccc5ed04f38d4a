"""Benchmark: data-parallel scaling of a 2:4 sparse (``srste``) GPT train step, 1 device vs N.

Issue 6 target: a 2-GPU data-parallel train step of a GPT-2-350M-sized model with ``srste``
reaches >= 90% efficiency (tokens/s >= 1.8x one GPU).

The model is self-contained (no dependency on ``examples/``): a GPT-2-medium-shaped decoder —
d_model 1024, 16 heads, 24 pre-LN blocks, FFN 4096, vocab 50304, sequence 1024, tied embedding
head — whose linear layers (attention ``qkv``/``proj``, FFN ``fc1``/``fc2``) are
``Sparse24Dense(method=...)``. ``--ffn-only`` drops attention (a pure transformer-FFN stack).
One train step = forward + backward (MVUE weight gradient) + SR-STE masked decay + AdamW +
``refresh_masks`` every 40 steps (inside the step, ``lax.cond``), all under one ``jit``.

Weak scaling: every device gets ``--batch`` sequences; on N devices the global batch is N×batch,
params / masks / optimizer state are replicated, the batch is sharded over the ``data`` mesh
axis, and gradients are all-reduced by the partitioned weight-gradient GEMM (see
``jax_sparse24/_src/partitioning.py``). Efficiency = tokens/s(N) / (N × tokens/s(1)).

Method (device tool METHOD.md / DESIGN.md "Measuring"): all configurations are compiled first,
then timed *interleaved* — each trial runs ``--steps`` back-to-back steps per configuration on
``R`` distinct pre-placed batches and blocks once; medians over ``--trials`` after a warm-up. A
second, separately compiled 1-device step is timed as the control (its ratio to the first is the
noise floor of the run). Random tokens, never zeros.

Checks (recorded in the JSON): (1) correctness — loss and updated params of one step (MVUE off,
so the result is deterministic) on N devices equal the 1-device result for the same global batch,
on a 2-block model of the same widths; (2) the compiled N-device HLO holds no all-gather of a
full weight, and lists the custom-call targets (on a GPU our FFI kernels must appear).

    python benchmarks/bench_scaling.py                       # GPUs: 1 vs all visible
    python benchmarks/bench_scaling.py --devices 1,2 --method srste,dense
    python benchmarks/bench_scaling.py --smoke --cpu-devices 2   # CPU smoke test (tiny model)

Writes DIR/NAME.json and DIR/NAME.md (``--out DIR`` default benchmarks/results, ``--name`` default
``scaling``, ``scaling_smoke`` with ``--smoke``) and prints the markdown table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="", help="device counts to compare, e.g. '1,2' (default: 1 and all)")
    p.add_argument("--method", default="srste", help="comma list of Sparse24Dense methods (srste, dense, ...)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="sequences per device")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (params stay float32)")
    p.add_argument("--backend", default="auto", help="Sparse24Dense GEMM backend")
    p.add_argument("--ffn-only", action="store_true", help="no attention: a transformer-FFN stack")
    p.add_argument("--steps", type=int, default=5, help="steps per timed call")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sets", type=int, default=3, help="distinct batches per configuration")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--no-control", action="store_true", help="skip the 1-device control")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 trial (CPU smoke test)")
    p.add_argument("--cpu-devices", type=int, default=0,
                   help="run on N fake CPU devices (sets XLA_FLAGS and JAX_PLATFORMS=cpu)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="")
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.d_model, a.heads, a.ffn, a.vocab, a.seq, a.batch = 2, 64, 4, 256, 256, 32, 2
        a.steps, a.trials, a.warmup, a.sets, a.dtype = 2, 1, 1, 2, "float32"
    a.name = a.name or ("scaling_smoke" if a.smoke else "scaling")
    return a


def main(argv=None):
    args = _parse(argv)
    if args.cpu_devices:  # before JAX starts its backends
        os.environ["JAX_PLATFORMS"] = "cpu"
        flags = os.environ.get("XLA_FLAGS", "")
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.cpu_devices}".strip()
    sys.path.insert(0, os.path.join(HERE, ".."))
    record = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(record, f, indent=2)
    md = markdown(record)
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write(md)
    print(md)


# ----------------------------------------------------------------------------------------------
# Model and train step (imports after the environment is set)
# ----------------------------------------------------------------------------------------------


def build(args, method: str, layers: int):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    import jax_sparse24 as s24
    from jax_sparse24.nn import Sparse24Dense
    from jax_sparse24.masks import masks_for_params, refresh_masks

    dtype = jnp.dtype(args.dtype)

    def dense(features, name):
        return Sparse24Dense(features, method=method, dtype=dtype, backend=args.backend, name=name)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            b, s, d = x.shape
            if not args.ffn_only:
                h = nn.LayerNorm(dtype=dtype, name="ln_1")(x)
                q, k, v = jnp.split(dense(3 * d, "qkv")(h), 3, axis=-1)
                heads = lambda t: t.reshape(b, s, args.heads, d // args.heads)  # noqa: E731
                a = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
                x = x + dense(d, "proj")(a.reshape(b, s, d))
            h = nn.LayerNorm(dtype=dtype, name="ln_2")(x)
            h = dense(d, "fc2")(nn.gelu(dense(args.ffn, "fc1")(h)))
            return x + h

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            emb = nn.Embed(args.vocab, args.d_model, name="wte")
            pos = self.param("wpe", nn.initializers.normal(0.02), (args.seq, args.d_model))
            x = (emb(tokens) + pos[: tokens.shape[1]]).astype(dtype)
            for i in range(layers):
                x = Block(name=f"h_{i}")(x)
            x = nn.LayerNorm(dtype=dtype, name="ln_f")(x)
            return emb.attend(x.astype(jnp.float32))

    model = GPT()
    uses_masks = method == "srste"
    tx = optax.adamw(3e-4, weight_decay=0.1)
    if uses_masks:  # SR-STE masked decay with the masks the forward used
        tx = optax.chain(s24.optim.masked_decay(2e-4), tx)

    def init(key):
        tokens = jnp.zeros((1, args.seq), jnp.int32)
        variables = model.init(key, tokens)
        params, sparsity = variables["params"], variables.get("sparsity", {})
        return {"params": params, "sparsity": sparsity, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    def train_step(state, tokens, key, *, mvue: bool = True):
        params, sparsity = state["params"], state["sparsity"]

        def loss_fn(p):
            rngs = {"mvue": key} if mvue else {}
            logits = model.apply({"params": p, "sparsity": sparsity}, tokens[:, :-1], rngs=rngs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        masks = masks_for_params(params, sparsity) if uses_masks else None
        extra = {"masks": masks} if uses_masks else {}
        updates, opt = tx.update(grads, state["opt"], params, **extra)
        params = optax.apply_updates(params, updates)
        if uses_masks:
            sparsity, _ = refresh_masks(params, sparsity, step=state["step"])
        return {"params": params, "sparsity": sparsity, "opt": opt, "step": state["step"] + 1}, loss

    return init, train_step


def compile_step(args, method, layers, n, *, mvue=True, donate=True):
    """(jitted step, state shardings, batch sharding, mesh) on the first n devices."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_sparse24 import sharding as shd

    init, train_step = build(args, method, layers)
    mesh = shd.make_mesh(f"data={n}", devices=jax.devices()[:n])
    abstract = jax.eval_shape(init, jax.random.key(0))
    st_sh = shd.param_shardings(abstract, mesh)  # replicated: data parallel
    tok_sh = NamedSharding(mesh, P("data"))
    rep = NamedSharding(mesh, P())
    step = jax.jit(lambda s, t, k: train_step(s, t, k, mvue=mvue), in_shardings=(st_sh, tok_sh, rep),
                   out_shardings=(st_sh, rep), donate_argnums=(0,) if donate else ())
    init_j = jax.jit(init, out_shardings=st_sh)
    return step, init_j, tok_sh, mesh


def tokens_for(args, global_batch, seed, sharding):
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)
    toks = rng.integers(1, args.vocab, size=(global_batch, args.seq + 1), dtype=np.int32)
    return jax.device_put(toks, sharding)


def weight_shapes(state) -> set[str]:
    import jax

    shapes = set()
    for path, leaf in jax.tree_util.tree_leaves_with_path(state["params"]):
        if getattr(leaf, "ndim", 0) == 2:
            shapes.add("[" + ",".join(map(str, leaf.shape)) + "]")
    return shapes


def hlo_checks(hlo: str, full_shapes: set[str]) -> dict:
    gathers = []
    for line in hlo.splitlines():
        if re.search(r"\ball-gather(-start)?\(", line):
            m = re.search(r"=\s*\(?\s*[a-z0-9]+(\[[0-9,]*\])", line)
            gathers.append(m.group(1) if m else "?")
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    return {
        "all_gathers": len(gathers),
        "all_gathers_of_full_weights": sum(g in full_shapes for g in gathers),
        "all_reduces": len(re.findall(r"\ball-reduce(-start)?\(", hlo)),
        "custom_call_targets": targets,
    }


def check_correctness(args, method, n) -> dict:
    """One step, MVUE off, same global batch: N devices vs 1 device (2-block model).

    Compares the loss, the parameter update Δ = p_new − p_old (relative global norm: AdamW's first
    step is ≈ lr·sign(g), so a per-element comparison would only measure which near-zero
    gradients changed sign under a different reduction order) and the refreshed masks.
    """
    import jax
    import numpy as np

    layers = min(args.layers, 2)
    res = {}
    for k in (1, n):
        step, init, tok_sh, _ = compile_step(args, method, layers, k, mvue=False, donate=False)
        state = init(jax.random.key(0))
        toks = tokens_for(args, args.batch * n, 123, tok_sh)
        new, loss = step(state, toks, jax.random.key(1))
        delta = jax.tree_util.tree_map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                                       new["params"], state["params"])
        res[k] = (float(loss), delta, [np.asarray(x) for x in jax.tree_util.tree_leaves(new["sparsity"])])
    (l1, d1, m1), (ln, dn, mn) = res[1], res[n]
    num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(jax.tree_util.tree_leaves(d1), jax.tree_util.tree_leaves(dn)))
    den = sum(float(np.sum(a ** 2)) for a in jax.tree_util.tree_leaves(d1))
    upd = (num / max(den, 1e-30)) ** 0.5
    masks = [a for a in m1 if a.dtype == bool]
    agree = (float(np.mean(np.concatenate([(a == b).ravel() for a, b in zip(m1, mn) if a.dtype == bool])))
             if masks else 1.0)
    loss_rel = abs(l1 - ln) / max(abs(l1), 1e-12)
    return {"layers": layers, "devices": n, "loss_1": l1, f"loss_{n}": ln, "loss_rel_diff": loss_rel,
            "update_rel_diff": upd, "mask_agreement": agree,
            "ok": loss_rel < 1e-3 and upd < 0.05 and agree > 0.999}


def time_calls(step, state, batches, keys, steps):
    import jax

    t0 = time.perf_counter()
    loss = None
    for i in range(steps):
        state, loss = step(state, batches[i % len(batches)], keys[i % len(keys)])
    jax.block_until_ready((state, loss))
    return state, (time.perf_counter() - t0) / steps


def run(args) -> dict:
    import jax
    import jax.numpy as jnp

    devs = jax.devices()
    counts = [int(c) for c in args.devices.split(",")] if args.devices else sorted({1, len(devs)})
    if max(counts) > len(devs):
        raise SystemExit(f"--devices {args.devices}: only {len(devs)} devices visible")
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "jax": jax.__version__, "python": platform.python_version(),
        "device_kind": devs[0].device_kind, "platform": devs[0].platform, "n_visible": len(devs),
        "model": {k: getattr(args, k) for k in ("layers", "d_model", "heads", "ffn", "vocab", "seq")},
        "ffn_only": args.ffn_only, "batch_per_device": args.batch, "dtype": args.dtype,
        "backend": args.backend, "steps_per_call": args.steps, "trials": args.trials,
        "warmup": args.warmup, "sets": args.sets, "smoke": args.smoke,
        "cuda_kernels": __import__("jax_sparse24").cuda_kernels_available(),
    }
    print(f"# {meta['device_kind']} x{len(devs)}: devices {counts}, methods {methods}", flush=True)

    configs = []  # (label, method, n)
    for m in methods:
        for n in counts:
            configs.append((f"{m}/{n}", m, n))
        if not args.no_control and 1 in counts:
            configs.append((f"{m}/1-control", m, 1))

    live = {}
    compile_s = {}
    hlo = {}
    params_count = None
    for label, m, n in configs:
        t0 = time.perf_counter()
        step, init, tok_sh, mesh = compile_step(args, m, args.layers, n)
        state = init(jax.random.key(0))
        batches = [tokens_for(args, args.batch * n, 1000 + i, tok_sh) for i in range(args.sets)]
        keys = [jax.random.key(10 + i) for i in range(args.sets)]
        compiled = step.lower(state, batches[0], keys[0]).compile()
        compile_s[label] = time.perf_counter() - t0
        if n == max(counts) and n > 1 and not label.endswith("control"):
            hlo[label] = hlo_checks(compiled.as_text(), weight_shapes(state))
        if params_count is None:
            params_count = sum(x.size for x in jax.tree_util.tree_leaves(state["params"]))
        for _ in range(args.warmup):
            state, _ = time_calls(compiled, state, batches, keys, 1)
        live[label] = [compiled, state, batches, keys, n, m]
        print(f"compiled {label} in {compile_s[label]:.1f}s", flush=True)
    meta["params"] = int(params_count)

    times = {label: [] for label, _, _ in configs}
    for trial in range(args.trials):
        for label, _, _ in configs:  # interleaved
            compiled, state, batches, keys, n, m = live[label]
            state, dt = time_calls(compiled, state, batches, keys, args.steps)
            live[label][1] = state
            times[label].append(dt)
        print(f"trial {trial}: " + ", ".join(f"{k} {1e3 * v[-1]:.1f} ms" for k, v in times.items()), flush=True)

    rows = []
    for label, m, n in configs:
        med = statistics.median(times[label])
        toks = args.batch * n * args.seq
        rows.append({"config": label, "method": m, "devices": n, "tokens_per_step": toks,
                     "step_ms": 1e3 * med, "tokens_per_s": toks / med, "times_ms": [1e3 * t for t in times[label]],
                     "compile_s": compile_s[label]})
    for m in methods:
        base = next((r for r in rows if r["method"] == m and r["config"] == f"{m}/1"), None)
        for r in rows:
            if r["method"] == m and base is not None:
                r["speedup_vs_1"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["efficiency"] = r["speedup_vs_1"] / r["devices"]
    del live

    checks = {}
    if not args.no_check and max(counts) > 1:
        for m in methods:
            checks[m] = check_correctness(args, m, max(counts))
            print(f"correctness {m}: {checks[m]}", flush=True)
    return {"meta": meta, "rows": rows, "hlo": hlo, "correctness": checks}


def markdown(rec) -> str:
    meta = rec["meta"]
    mdl = meta["model"]
    lines = [
        f"## Data-parallel scaling — {meta['device_kind']} ({meta['platform']}), jax {meta['jax']}, {meta['date']}",
        "",
        f"GPT ({'FFN stack' if meta['ffn_only'] else 'decoder'}): {mdl['layers']} layers, d={mdl['d_model']}, "
        f"ffn={mdl['ffn']}, heads={mdl['heads']}, vocab={mdl['vocab']}, seq={mdl['seq']}, "
        f"{meta['params'] / 1e6:.0f}M params; {meta['batch_per_device']} seq/device, {meta['dtype']}, "
        f"backend={meta['backend']}, CUDA kernels: {meta['cuda_kernels']}. Medians of {meta['trials']} "
        f"interleaved trials × {meta['steps_per_call']} steps.{' **Smoke run (CPU, tiny model): not a measurement.**' if meta['smoke'] else ''}",
        "",
        "| config | devices | tokens/step | step (ms) | tokens/s | speedup vs 1 | efficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rec["rows"]:
        sp = f"{r['speedup_vs_1']:.2f}×" if "speedup_vs_1" in r else "–"
        ef = f"{100 * r['efficiency']:.0f}%" if "efficiency" in r else "–"
        lines.append(f"| {r['config']} | {r['devices']} | {r['tokens_per_step']} | {r['step_ms']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {sp} | {ef} |")
    lines.append("")
    lines.append("`<method>/1-control`: a second, separately compiled 1-device step — its ratio to `<method>/1` "
                 "is the noise floor. Target (issue 6): 2-device efficiency ≥ 90% for srste.")
    for label, h in rec["hlo"].items():
        lines.append("")
        lines.append(f"HLO `{label}`: {h['all_gathers']} all-gathers ({h['all_gathers_of_full_weights']} of full "
                     f"weights), {h['all_reduces']} all-reduces; custom calls: "
                     f"{', '.join(h['custom_call_targets']) or 'none'}")
    for m, c in rec["correctness"].items():
        lines.append("")
        lines.append(f"Correctness `{m}` ({c['layers']}-block model, one step, MVUE off, {c['devices']} devices vs 1, "
                     f"same global batch): loss rel. diff {c['loss_rel_diff']:.1e}, update rel. diff "
                     f"{c['update_rel_diff']:.1e}, masks agree {100 * c['mask_agreement']:.3f}% — "
                     f"{'OK' if c['ok'] else 'MISMATCH'}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
