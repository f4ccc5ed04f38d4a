#!/usr/bin/env python
"""One-shot 2:4 pruning of a trained tiny GPT, then fine-tuning with and without AST (CPU demo).

Steps (a few minutes on 2 CPU cores)::

    python examples/prune_demo.py            # writes benchmarks/results/prune_demo.{json,md}

1. Train a tiny character-level GPT (pre-LN, 2 blocks) densely on the bundled synthetic story
   corpus ``examples/data/corpus.txt`` (90% train / 10% validation).
2. One-shot 2:4 magnitude pruning (``jax_sparse24.prune.prune_trained``, pattern ``m4n2_1d``:
   2 of every 4 input channels) of every linear layer in the blocks (``qkv``, ``proj``, ``fc``,
   ``fc_proj``); embeddings and the head stay dense. Also with ASP's channel permutation of each
   MLP (``permute_mlp``: function-preserving, applied before pruning).
3. Fine-tune the pruned model for the same number of steps two ways:

   * **FT** — fixed masks, task loss, ``keep_pruned(masks, adamw)`` (ASP's recipe);
   * **AST** — the Adaptive Sparse Trainer: every linear becomes
     :class:`jax_sparse24.distill.Sparse24LowRankDense` (2:4 mask recomputed from the dense weight
     on every forward, straight-through gradients, SLoRB low-rank term initialised from the
     pruned weights), trained on ``task + KL(dense teacher ‖ student)`` with the annealed SR-STE
     decay (``jax_sparse24.optim.masked_decay``, linearly ramped over the first half).

   plus the ablation **FT + KD** (fixed masks, distillation loss, no low-rank term).

Val loss is next-character cross-entropy (nats) on a fixed set of validation windows.

The SR-STE decay ``g ← g + λ·(1 − M)⊙W`` enters the gradient before AdamW, so λ has to be
comparable to this small model's gradients: the default λ = 0.2 (ramped from 0 over the first
half, as AST anneals it) lets the pruned weights fade and the masks settle; with SR-STE's usual
2e-4 the masks kept flipping and AST ended behind plain FT in a trial run. ``--ft-lr`` 2e-3 was
likewise better than 1e-3 for every fine-tune.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

_HERE = Path(__file__).resolve().parent
try:
    import jax_sparse24  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(_HERE.parent))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24 import distill, prune  # noqa: E402
from jax_sparse24.optim import default_where, masked_decay  # noqa: E402

DATA = _HERE / "data" / "corpus.txt"
RESULTS = _HERE.parent / "benchmarks" / "results"


# ---------------------------------------------------------------------------------------------
# model: a tiny pre-LN GPT whose linear layers come from a factory


DenseFactory = Callable[[int, int, str], nn.Module]  # (features, in_features, name) -> module


def dense_factory(features: int, in_features: int, name: str) -> nn.Module:
    del in_features
    return nn.Dense(features, name=name)


def ast_factory(group: int) -> DenseFactory:
    """Sparse24LowRankDense with SLoRB rank = in_features // group (AST's SLoRB_k = group)."""

    def make(features: int, in_features: int, name: str) -> nn.Module:
        return distill.Sparse24LowRankDense(features, rank=in_features // group, name=name)

    return make


class Block(nn.Module):
    d: int
    n_head: int
    dense: DenseFactory

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h = nn.LayerNorm(name="ln_1")(x)
        qkv = self.dense(3 * d, d, "qkv")(h).reshape(b, t, 3, self.n_head, d // self.n_head)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // self.n_head)
        att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -1e9)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v).reshape(b, t, d)
        x = x + self.dense(d, d, "proj")(y)
        h = nn.LayerNorm(name="ln_2")(x)
        h = jax.nn.gelu(self.dense(4 * d, d, "fc")(h))
        return x + self.dense(d, 4 * d, "fc_proj")(h)


class TinyGPT(nn.Module):
    vocab: int
    block_size: int
    d: int
    n_layer: int
    n_head: int
    dense: DenseFactory = dense_factory

    @nn.compact
    def __call__(self, tokens):
        t = tokens.shape[1]
        x = nn.Embed(self.vocab, self.d, name="wte")(tokens)
        x = x + nn.Embed(self.block_size, self.d, name="wpe")(jnp.arange(t))[None]
        for i in range(self.n_layer):
            x = Block(self.d, self.n_head, self.dense, name=f"h_{i}")(x)
        return nn.Dense(self.vocab, name="lm_head")(nn.LayerNorm(name="ln_f")(x))


# ---------------------------------------------------------------------------------------------
# data


def load_corpus():
    text = DATA.read_text()
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((lut[c] for c in text), np.int32, len(text))
    split = int(0.9 * len(ids))
    return chars, ids[:split], ids[split:]


def batch_at(data: np.ndarray, offsets: np.ndarray, seq_len: int):
    idx = offsets[:, None] + np.arange(seq_len + 1)[None]
    w = data[idx]
    return jnp.asarray(w[:, :-1]), jnp.asarray(w[:, 1:])


# ---------------------------------------------------------------------------------------------
# training


def ce_loss(logits, targets):
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def cosine_lr(peak: float, steps: int, warmup: int):
    return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup, 1), max(steps, warmup + 1), peak * 0.1)


def train(params, loss_fn, opt, steps: int, data, args, seed: int, log_every: int, tag: str,
          extra_update_args: Callable | None = None):
    """Generic jitted loop; the batch of step t is a function of (seed, t)."""
    state = opt.init(params)

    @jax.jit
    def step(p, s, x, y):
        (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss, aux

    rng = np.random.default_rng(seed)
    t0 = time.time()
    for t in range(steps):
        off = rng.integers(0, len(data) - args.seq_len - 1, size=args.batch)
        x, y = batch_at(data, off, args.seq_len)
        params, state, loss, aux = step(params, state, x, y)
        if log_every and (t % log_every == 0 or t == steps - 1):
            extra = " ".join(f"{k}={float(v):.3f}" for k, v in aux.items())
            print(f"[{tag}] step {t:4d} loss {float(loss):.4f} {extra} ({time.time() - t0:.1f}s)", flush=True)
    jax.block_until_ready(params)
    return params, time.time() - t0


def make_eval(model, val, args):
    rng = np.random.default_rng(12345)
    offsets = rng.integers(0, len(val) - args.seq_len - 1, size=(args.eval_batches, args.batch))
    batches = [batch_at(val, o, args.seq_len) for o in offsets]
    apply = jax.jit(lambda p, x, y: ce_loss(model.apply(p, x), y))

    def evaluate(params) -> float:
        return float(np.mean([float(apply(params, x, y)) for x, y in batches]))

    return evaluate


def n_params(tree) -> int:
    return int(sum(np.size(x) for x in jax.tree.leaves(tree)))


def sparse_kernel_paths(masks) -> list[str]:
    flat = jax.tree_util.tree_flatten_with_path(masks, is_leaf=lambda x: x is None)[0]
    return ["/".join(str(getattr(k, "key", k)) for k in p) for p, m in flat if m is not None]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dense-steps", type=int, default=800)
    ap.add_argument("--ft-steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--ft-lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--kd-alpha", type=float, default=1.0)
    ap.add_argument("--kd-temperature", type=float, default=2.0)
    ap.add_argument("--slorb-group", type=int, default=16, help="AST SLoRB_k: input channels per low-rank group")
    ap.add_argument("--srste-decay", type=float, default=0.2,
                    help="AST masked-decay strength λ after the linear ramp over the first half")
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--no-ablation", action="store_true", help="skip the FT+KD ablation run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t_start = time.time()

    chars, train_data, val = load_corpus()
    cfg = dict(vocab=len(chars), block_size=args.seq_len, d=args.d_model, n_layer=args.n_layer,
               n_head=args.n_head)
    model = TinyGPT(**cfg)
    evaluate = make_eval(model, val, args)
    x0 = jnp.zeros((1, args.seq_len), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(args.seed), x0)
    print(f"vocab {len(chars)}, train {len(train_data):,} / val {len(val):,} chars, "
          f"{n_params(params):,} params", flush=True)

    def task_loss(p, x, y):
        loss = ce_loss(model.apply(p, x), y)
        return loss, {}

    # 1. dense
    opt = optax.adamw(cosine_lr(args.lr, args.dense_steps, args.dense_steps // 20), b2=0.99,
                      weight_decay=args.weight_decay)
    dense, t_dense = train(params, task_loss, opt, args.dense_steps, train_data, args, args.seed,
                           args.log_every, "dense")
    results = {"dense": {"val_loss": evaluate(dense), "train_s": t_dense}}

    # 2. one-shot 2:4, with and without the MLP channel permutation
    sel = dict(pattern="m4n2_1d", disallowed="*lm_head*")
    pruned, masks = prune.prune_trained(dense, **sel)
    layers = sparse_kernel_paths(masks)
    permuted = dense
    for i in range(args.n_layer):
        permuted, _ = prune.permute_mlp(permuted, f"params/h_{i}/fc", f"params/h_{i}/fc_proj")
    same_fn = abs(evaluate(permuted) - results["dense"]["val_loss"])
    pruned_perm, _ = prune.prune_trained(permuted, **sel)

    def kept_fraction(tree):
        tot = kept = 0.0
        for path in layers:
            keys = path.split("/")
            w = tree
            for k in keys:
                w = w[k]
            tot += float(jnp.abs(w).sum())
            kept += prune.kept_magnitude(w)
        return kept / tot

    results["pruned"] = {"val_loss": evaluate(pruned), "kept_magnitude": kept_fraction(dense)}
    results["pruned_permuted"] = {"val_loss": evaluate(pruned_perm),
                                  "kept_magnitude": kept_fraction(permuted),
                                  "dense_val_loss_change_after_permutation": same_fn}

    # 3a. FT: fixed masks, task loss
    ft_sched = cosine_lr(args.ft_lr, args.ft_steps, args.ft_steps // 10)
    ft_opt = prune.keep_pruned(masks, optax.adamw(ft_sched, b2=0.99, weight_decay=args.weight_decay))
    ft, t_ft = train(pruned, task_loss, ft_opt, args.ft_steps, train_data, args, args.seed + 1,
                     args.log_every, "FT")
    zero_ok = _pruned_stay_zero(ft, masks)
    results["pruned_ft"] = {"val_loss": evaluate(ft), "train_s": t_ft, "pruned_weights_stay_zero": zero_ok}

    teacher_apply = jax.jit(model.apply)

    def kd_loss_fn(student_model):
        def loss_fn(p, x, y):
            logits = student_model.apply(p, x)
            teacher = jax.lax.stop_gradient(teacher_apply(dense, x))
            return distill.ast_loss(ce_loss(logits, y), logits, teacher, alpha=args.kd_alpha,
                                    temperature=args.kd_temperature)
        return loss_fn

    # 3b. ablation: FT + KD (fixed masks, no low-rank term)
    if not args.no_ablation:
        kd_ft, t_kd = train(pruned, kd_loss_fn(model), ft_opt, args.ft_steps, train_data, args,
                            args.seed + 1, args.log_every, "FT+KD")
        results["pruned_ft_kd"] = {"val_loss": evaluate(kd_ft), "train_s": t_kd}

    # 3c. AST: adaptive masks + SLoRB + KD + annealed SR-STE decay
    student = TinyGPT(**cfg, dense=ast_factory(args.slorb_group))
    s_params = jax.jit(student.init)(jax.random.key(args.seed + 7), x0)
    s_params = distill.student_params_from_dense(s_params, dense)
    eval_student = make_eval(student, val, args)
    ramp = args.ft_steps // 2
    decay = lambda c: args.srste_decay * jnp.minimum(c / max(ramp, 1), 1.0)  # noqa: E731
    where = lambda path, leaf: default_where(path, leaf) and "lm_head" not in path  # noqa: E731
    ast_opt = optax.chain(masked_decay(decay, where=where),
                          optax.adamw(ft_sched, b2=0.99, weight_decay=args.weight_decay))
    at_init = eval_student(s_params)
    init_masks = {p: s24.mask24(_get(s_params, p), axis=0) for p in layers}
    ast, t_ast = train(s_params, kd_loss_fn(student), ast_opt, args.ft_steps, train_data, args,
                       args.seed + 1, args.log_every, "AST")
    flips = float(np.mean([float(s24.flip_rate(init_masks[p], s24.mask24(_get(ast, p), axis=0)))
                           for p in layers]))
    extra = n_params(ast) - n_params(dense)
    results["pruned_ast"] = {"val_loss": eval_student(ast), "val_loss_at_init": at_init, "train_s": t_ast,
                             "mask_flip_fraction_vs_one_shot": flips, "extra_lowrank_params": extra}

    meta = {
        "model": {**cfg, "params": n_params(dense), "sparse_layers": layers},
        "args": {k: (_rel(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "corpus": str(DATA.relative_to(_HERE.parent)),
        "pattern": "m4n2_1d (2 of every 4 input channels of each block linear)",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "jax": jax.__version__, "devices": str(jax.devices())},
        "total_s": time.time() - t_start,
    }
    write(args.out, results, meta)
    return results


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(_HERE.parent))
    except ValueError:
        return str(path)


def _get(tree, path: str):
    for k in path.split("/"):
        tree = tree[k]
    return tree


def _pruned_stay_zero(params, masks) -> bool:
    flat_m = jax.tree_util.tree_flatten_with_path(masks, is_leaf=lambda x: x is None)[0]
    ok = True
    for p, m in flat_m:
        if m is None:
            continue
        w = _get(params, "/".join(str(getattr(k, "key", k)) for k in p))
        ok &= bool((w[~m] == 0).all())
    return ok


def write(out: Path, results: dict, meta: dict):
    out.mkdir(parents=True, exist_ok=True)
    (out / "prune_demo.json").write_text(json.dumps({"results": results, "meta": meta}, indent=2) + "\n")
    d = results["dense"]["val_loss"]
    a = meta["args"]
    rows = [
        ("dense", "trained dense model (teacher)", results["dense"]),
        ("pruned", "one-shot 2:4 magnitude prune (m4n2_1d), no training", results["pruned"]),
        ("pruned (permuted)", "ASP channel permutation of each MLP, then one-shot 2:4", results["pruned_permuted"]),
        ("pruned+FT", f"{a['ft_steps']} steps, fixed masks (keep_pruned), task loss", results["pruned_ft"]),
    ]
    if "pruned_ft_kd" in results:
        rows.append(("pruned+FT+KD", f"{a['ft_steps']} steps, fixed masks, task + KL(teacher‖student)",
                     results["pruned_ft_kd"]))
    rows.append(("pruned+AST", f"{a['ft_steps']} steps, adaptive masks + SLoRB (k={a['slorb_group']}) + KD "
                 f"+ SR-STE decay ramped 0→{a['srste_decay']}", results["pruned_ast"]))
    lines = [
        "# One-shot 2:4 pruning of a tiny GPT, fine-tuned with and without AST",
        "",
        f"Written by `examples/prune_demo.py` ({meta['total_s']:.0f} s on {meta['machine']['devices']}, "
        f"jax {meta['machine']['jax']}). Char-level GPT on `{meta['corpus']}`: "
        f"d={meta['model']['d']}, {meta['model']['n_layer']} blocks, {meta['model']['n_head']} heads, "
        f"context {meta['model']['block_size']}, {meta['model']['params']:,} params; dense training "
        f"{a['dense_steps']} steps × {a['batch']}×{a['seq_len']} tokens. Pruned: every block linear "
        f"({len(meta['model']['sparse_layers'])} kernels), 2 of every 4 input channels; embeddings and head dense. "
        f"Fine-tunes: AdamW, peak lr {a['ft_lr']}, cosine; KD = T²·KL(teacher‖student) at "
        f"T={a['kd_temperature']}, weight {a['kd_alpha']}. Val loss = next-character cross-entropy "
        f"(nats) on {a['eval_batches']} fixed validation batches of {a['batch']}×{a['seq_len']}; seed {a['seed']}.",
        "",
        "| model | what | val loss | Δ vs dense |",
        "|---|---|---|---|",
    ]
    for name, what, r in rows:
        lines.append(f"| {name} | {what} | {r['val_loss']:.4f} | {r['val_loss'] - d:+.4f} |")
    p, pp, ast = results["pruned"], results["pruned_permuted"], results["pruned_ast"]
    lines += [
        "",
        f"- Kept |W| under 2:4: {p['kept_magnitude']:.4f} of the total without permutation, "
        f"{pp['kept_magnitude']:.4f} with the MLP channel permutation (the permuted dense model's val "
        f"loss differs by {pp['dense_val_loss_change_after_permutation']:.1e}: same function).",
        f"- FT keeps pruned weights at exactly 0: {results['pruned_ft']['pruned_weights_stay_zero']}.",
        f"- AST: val loss {ast['val_loss_at_init']:.4f} right after initialisation (the SLoRB term starts "
        f"from the pruned weights); {ast['mask_flip_fraction_vs_one_shot']:.3f} of the mask entries "
        f"changed vs the one-shot mask during training; {ast['extra_lowrank_params']:,} extra low-rank "
        f"parameters ({100 * ast['extra_lowrank_params'] / meta['model']['params']:.1f}% of the dense model).",
    ]
    (out / "prune_demo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
