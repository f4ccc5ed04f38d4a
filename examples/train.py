#!/usr/bin/env python
"""Train a GPT with 2:4 sparse linear layers: the jax_sparse24 training script to copy.

    python examples/train.py --size tiny --steps 300 --out runs/tiny          # CPU, about a minute
    python examples/train.py --size tiny --compare dense,srste --out runs/cmp  # side by side

On a GPU, a LLaMA-shaped model on the bundled text with a 32000-token BPE tokenizer: LLaMA-7B's width
(d 4096) at 4 of its 32 blocks, which fits one GPU (at narrower widths the sparse GEMMs gain less and
the dense 32000-token head, attention and XLA's other kernels take a larger share of the step)::

    python examples/prepare_data.py --data examples/data/realtext_small_train.txt.xz \\
        --val examples/data/realtext_small_val.txt.xz --out data/realtext --vocab-size 32000
    python examples/train.py --data data/realtext --size llama-7b --n-layer 4 --steps 300 \\
        --compare dense,srste --out runs/llama-7b-l4

The table's ``tokens/s`` is the training steps' rate in the recipe's main phase -- srste's 2:4 steps,
not its dense fine-tune -- in the steady state: compilation, evaluations and the first span of steps
(up to the first evaluation) are not timed. ``whole run`` compares every training step's rate
(srste's dense fine-tune included). Each step masks (on a GPU also compresses) the 2:4 weights once,
all layers together (``SparseTrainState.prepare``); on a GPU the train state is updated in place (donated).

It reads top to bottom: flags, data, model, optimizer and train state, the jitted steps, the loop,
the summary. Recipes (``--recipe``; the FFN linears are 2:4, at the LLaMA sizes the attention
projections too):

* ``dense``: plain ``nn.Dense`` layers and AdamW, the baseline;
* ``srste``: SR-STE with transposable masks refreshed every 40 steps, the MVUE weight gradient,
  masked decay of the pruned weights and a dense fine-tune over the last sixth of the steps;
* ``sste``: S-STE, soft-thresholded weights; ``ste``: the 2:4 magnitude mask of the weights, every step.

The 2:4 kernels train at twice the learning rate while the model runs sparse (``sparse_lr_scale``;
srste always, sste and ste on the tiny sizes). ``--out`` gets ``loss.png`` and ``summary.json``.
Checkpoints, ``--resume``, device meshes, fp8, STEP and AST are in the full harness,
``examples/train_gpt.py``; the model is ``examples/gpt_model.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpt_model, gpt_data beside this file

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_sparse24 as s24
from jax_sparse24.training import SparseTrainState

from gpt_data import DEFAULT_DATA, load_data
from gpt_errors import CLIError
from gpt_experiment import SIZE_DEFAULTS
from gpt_model import GPT, SIZES, GPTConfig, sparse_layer_paths

PROG = "train.py"
#: recipe -> the method of the 2:4 layers (Sparse24Dense) and what the optimizer adds
RECIPES = {
    "dense": dict(method="dense"),
    "srste": dict(method="srste", mvue=True, masked_decay=2e-4, dense_tail=1 / 6, lr_scale=2.0),
    "sste": dict(method="soft", mvue=True),
    "ste": dict(method="ste"),
}
TINY = ("tiny", "llama-tiny")  # sste and ste: lr_scale 2 here, 1 at the larger sizes (gpt_experiment.py says why)


# ----------------------------------------------------------------------------------------------
# Flags
# ----------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="Train a GPT with 2:4 sparse layers (jax_sparse24).")
    ap.error = lambda msg: (print(f"{PROG}: error: {msg}", file=sys.stderr), sys.exit(2))  # one line, no usage
    ap.add_argument("--size", choices=list(SIZES), default="tiny", help="model size (gpt_model.SIZES; default: tiny)")
    ap.add_argument("--recipe", choices=list(RECIPES), default="srste", help="2:4 training recipe (default: srste)")
    ap.add_argument("--compare", metavar="R1,R2,...",
                    help="train these recipes one after another on the same data and print a table")
    ap.add_argument("--n-layer", type=int, help="transformer blocks (default: the size's; fewer keep its width, e.g. "
                                                "--size llama-7b --n-layer 4 on one GPU)")
    ap.add_argument("--steps", type=int, help="optimizer steps (default: per size)")
    ap.add_argument("--batch-size", type=int, help="sequences per step (default: per size)")
    ap.add_argument("--lr", type=float, help="peak learning rate (default: per size)")
    ap.add_argument("--eval-every", type=int, help="steps between evaluations (default: a tenth of the steps)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="a text file (its bytes are the tokens) or a directory made by examples/prepare_data.py "
                         "(default: the bundled public-domain text)")
    ap.add_argument("--out", type=Path, help="output directory (default: runs/SIZE)")
    ap.add_argument("--overwrite", action="store_true", help="replace a previous run in --out")
    ap.add_argument("--seed", type=int, default=0, help="seed of the init, the batches and the MVUE gradient")
    args = ap.parse_args(argv)
    args.recipes = [r.strip() for r in (args.compare or args.recipe).split(",") if r.strip()]
    bad = [r for r in args.recipes if r not in RECIPES] or len(set(args.recipes)) != len(args.recipes)
    if not args.recipes or bad:
        ap.error(f"--compare {args.compare!r}: give distinct recipes from {', '.join(RECIPES)}")
    d = SIZE_DEFAULTS[args.size]
    for flag in ("steps", "batch_size", "lr"):
        setattr(args, flag, d[flag] if getattr(args, flag) is None else getattr(args, flag))
    args.eval_every = max(1, args.steps // 10) if args.eval_every is None else args.eval_every
    args.n_layer = SIZES[args.size]["n_layer"] if args.n_layer is None else args.n_layer
    for flag in ("n_layer", "steps", "batch_size", "lr", "eval_every"):
        if not getattr(args, flag) > 0:
            ap.error(f"--{flag.replace('_', '-')} must be > 0")
    args.out = args.out or Path("runs") / args.size
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file")
    previous = [f for f in ("summary.json", "loss.png") if (args.out / f).exists()]
    if previous and not args.overwrite:
        ap.error(f"--out {args.out} holds a previous run ({', '.join(previous)}); pass --overwrite or another --out")
    return args


# ----------------------------------------------------------------------------------------------
# One run of one recipe
# ----------------------------------------------------------------------------------------------

def train(args, recipe: str, data) -> dict:
    r = RECIPES[recipe]
    steps, B, T = args.steps, args.batch_size, data.seq_len
    gpu = jax.default_backend() == "gpu"

    # The model: Sparse24Dense layers where the recipe's method is not "dense".
    cfg = GPTConfig(**dict(SIZES[args.size], block_size=T, n_layer=args.n_layer), vocab_size=data.vocab_size or 256,
                    method=r["method"], mvue=r.get("mvue", False),
                    sparse_attn=SIZE_DEFAULTS[args.size].get("sparse_attn", False),
                    dtype=jnp.bfloat16 if gpu else jnp.float32, attention="auto",
                    layers="scan" if gpu else "unroll")  # scan: one block compiled for all; unrolled: faster on a CPU
    model = GPT(cfg)

    # The optimizer: AdamW with warm-up and cosine decay, plus the recipe's 2:4 transforms.
    dense_after = steps - round(steps * r["dense_tail"]) if "dense_tail" in r else None  # dense fine-tune
    sparse_kernels = {"/".join(p) + "/kernel" for p in sparse_layer_paths(cfg)}
    is_sparse_kernel = lambda path, leaf: path in sparse_kernels  # noqa: E731
    decayed = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731 - weights, not biases or norms
        lambda path, x: path[-1].key in ("kernel", "embedding"), params)
    lr = optax.warmup_cosine_decay_schedule(0.0, args.lr, min(SIZE_DEFAULTS[args.size]["warmup"], steps // 5),
                                            steps, args.lr / 10)
    chain = [optax.clip_by_global_norm(1.0)]
    if "masked_decay" in r:  # SR-STE: decay the pruned weights (the masks come from the train state)
        chain.append(s24.optim.masked_decay(r["masked_decay"], active_until=dense_after))
    chain.append(optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1, mask=decayed))
    lr_scale = r.get("lr_scale", 2.0 if args.size in TINY else 1.0)
    if sparse_kernels and lr_scale != 1:  # a 2:4 layer's output moves half as far per Adam step
        chain.append(s24.optim.sparse_lr_scale(lr_scale, where=is_sparse_kernel, active_until=dense_after))

    # The steps. `sparse` is a Python bool: one program for the 2:4 phase, one for the dense fine-tune.
    # On a GPU the state's buffers are donated: the step updates them in place (no second copy).
    def loss_fn(params, state, tokens, sparse):
        logits = state.apply(tokens[:, :-1], params=params, sparse=sparse)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    donate = (0,) if gpu else ()

    @functools.partial(jax.jit, static_argnames="sparse", donate_argnums=donate)
    def train_step(state, tokens, sparse):
        if sparse and sparse_kernels:  # the 2:4 weights masked and compressed once, all layers together
            state = state.prepare(tokens[:, :-1], sparse=True)
        loss, grads = jax.value_and_grad(loss_fn)(state.params, state, tokens, sparse)
        # masked decay, the AdamW update, step + 1 (the masks are refreshed below, in their own program)
        return state.apply_gradients(grads=grads, sparse=sparse, refresh=False), loss

    eval_step = jax.jit(lambda state, tokens, sparse: loss_fn(state.params, state, tokens, sparse),
                        static_argnames="sparse")
    refresh = jax.jit(lambda state: state.refresh_masks(), donate_argnums=donate)  # srste: new 2:4 masks

    # The train state: params, masks ("sparsity"), optimizer state and the key of the MVUE gradient.
    init = jax.jit(model.init)

    def fresh_state():
        variables = init(jax.random.key(args.seed), jnp.zeros((1, T), jnp.int32))
        return SparseTrainState.create(apply_fn=model.apply, params=variables["params"], tx=optax.chain(*chain),
                                       sparsity=variables.get("sparsity", {}),
                                       rng=jax.random.key(args.seed + 1) if cfg.mvue else None)

    def evaluate(state, sparse, batches) -> float:
        return float(np.mean([eval_step(state, jnp.asarray(b), sparse) for b in batches]))

    # Compile every program (and on a GPU pick its kernels) by running it once on a throw-away state,
    # before the clock starts; training starts from a fresh one (the same, as the init is seeded).
    t = time.perf_counter()
    state = fresh_state()
    periods = s24.masks.mask_periods(state.sparsity)  # () for the recipes without stored masks
    for sparse in [True] if dense_after is None else [True, False]:
        state, _ = train_step(state, jnp.asarray(data.batch(0)), sparse)
    if periods:
        state = refresh(state)
    jax.block_until_ready(state)
    del state  # its buffers are free before the fresh state's are allocated
    state = fresh_state()
    leaves = jax.tree_util.tree_leaves_with_path(state.params)
    n_params = sum(x.size for _, x in leaves)
    n_sparse = sum(x.size for path, x in leaves if "/".join(k.key for k in path) in sparse_kernels)
    print(f"{PROG}: {recipe}: {n_params / 1e6:.1f}M params ({n_sparse / n_params:.0%} in 2:4 layers), compiled in "
          f"{time.perf_counter() - t:.0f} s", file=sys.stderr)
    if gpu and sparse_kernels:  # which kernel each GEMM of a 2:4 layer runs (backend="auto": the measured table)
        shapes = dict.fromkeys(x.shape[-2:] for path, x in leaves if "/".join(k.key for k in path) in sparse_kernels)
        plans = {s: s24.linear_plan(B * T, *s, cfg.dtype, transposable=cfg.method == "srste", mvue=cfg.mvue,
                                    reuse=1, batched=True) for s in shapes}  # prepared once per step, batched
        print(f"{PROG}: {recipe}: kernels (in x out: forward, input gradient, weight gradient): " + "; ".join(
            f"{i}x{o}: {', '.join(p.values())}" for (i, o), p in plans.items()), file=sys.stderr)

    # The loop. The clock counts training steps only: it stops for the evaluations and at the switch to
    # the dense fine-tune, so each span between two device syncs runs one program.
    history, losses, train_loss = [], [], []
    spans, last = [], 0  # spans: (2:4 phase?, steps, seconds); spans[last:]: those since the last evaluation
    clock = time.perf_counter()
    for step in range(steps):
        sparse = dense_after is None or step < dense_after
        state, loss = train_step(state, jnp.asarray(data.batch(step)), sparse)
        if sparse and s24.masks.refresh_due(periods, step + 1):
            state = refresh(state)
        losses.append(loss)
        due = (step + 1) % args.eval_every == 0 or step + 1 == steps
        if not (due or step + 1 == dense_after):
            continue
        train_loss += [float(x) for x in jax.device_get(losses)]  # waits for the device
        spans.append((sparse, len(losses), time.perf_counter() - clock))
        losses = []
        if due:
            n = sum(s[1] for s in spans[last:])
            rate, last = B * T * n / sum(s[2] for s in spans[last:]), len(spans)
            loss, val = float(np.mean(train_loss[-n:])), evaluate(state, sparse, data.val_batches)
            history.append({"step": step + 1, "loss": loss, "val_loss": val})
            print(f"{recipe:>5s} step {step + 1:5d}/{steps}  loss {loss:.4f}  val {val:.4f}  "
                  f"{rate:9,.0f} tokens/s  {sum(s[2] for s in spans):6.1f} s", flush=True)
        clock = time.perf_counter()

    # Tokens/s: the steady state of the main phase (the 2:4 steps of a 2:4 recipe, every step of dense),
    # without its first span (the first steps after compiling); the whole run's rate includes the fine-tune.
    main = [s for s in spans if s[0]] or spans
    main = main[1:] if len(main) > 1 else main
    train_time = sum(s[2] for s in spans)
    final = evaluate(state, sparse, data.final_val_batches(16 * B * T))  # more windows than the curve's
    return {"recipe": recipe, "n_params": n_params, "final_val_loss": final,
            "tokens_per_s": B * T * sum(s[1] for s in main) / sum(s[2] for s in main),
            "run_tokens_per_s": steps * B * T / train_time, "train_time_s": train_time,
            "dense_after": dense_after, "sparse_lr_scale": lr_scale, "history": history, "train_loss": train_loss}


# ----------------------------------------------------------------------------------------------
# Outputs: the table, loss.png, summary.json
# ----------------------------------------------------------------------------------------------

def table(runs: list[dict]) -> str:
    base = next((s for s in runs if s["recipe"] == "dense"), None)
    lines = ["| recipe | tokens/s | vs dense | whole run | final val loss | vs dense |", "|---|---|---|---|---|---|"]
    for s in runs:
        speed = f"{s['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        run = f"{s['run_tokens_per_s'] / base['run_tokens_per_s']:.2f}x" if base else f"{s['run_tokens_per_s']:,.0f}"
        loss = f"{100 * (s['final_val_loss'] / base['final_val_loss'] - 1):+.2f}%" if base else "-"
        lines.append(f"| {s['recipe']} | {s['tokens_per_s']:,.0f} | {speed} | {run} | {s['final_val_loss']:.4f} "
                     f"| {loss} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, s in enumerate(runs):
        ax.plot(range(1, len(s["train_loss"]) + 1), s["train_loss"], color=f"C{i}", alpha=0.3, lw=0.8,
                label=f"{s['recipe']} train")
        ax.plot([h["step"] for h in s["history"]], [h["val_loss"] for h in s["history"]], "o-", color=f"C{i}",
                ms=3, label=f"{s['recipe']} val")
    ax.set(xlabel="step", ylabel="cross-entropy", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else [str(a) for a in argv])
    try:
        # The data: bytes of a text file, or the token shards of prepare_data.py. The batch of step t
        # is a function of (seed, t), so every recipe sees the same batches.
        d = SIZE_DEFAULTS[args.size]
        data = load_data(args.data, d["seq_len"], args.batch_size, args.seed, d["eval_batches"])
        args.out.mkdir(parents=True, exist_ok=True)
    except (CLIError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    device = jax.devices()[0].device_kind
    print(f"{PROG}: {len(data.train):,} training {data.unit} from {data.path}, vocabulary {data.vocab_size or 256}; "
          f"{args.size} ({args.n_layer} layers), {args.steps} steps of {args.batch_size} x {data.seq_len} tokens on {device}", file=sys.stderr)
    try:
        runs = [train(args, recipe, data) for recipe in args.recipes]
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: no results written", file=sys.stderr)
        return 130

    summary = {"size": args.size, "n_layer": args.n_layer, "steps": args.steps, "batch_size": args.batch_size, "seq_len": data.seq_len,
               "data": str(data.path), "vocab_size": data.vocab_size or 256, "device": device,
               "runs": runs}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    try:
        plot(runs, args.out / "loss.png", f"{args.size}, {args.steps} steps")
    except ImportError:
        print(f"{PROG}: no loss.png: matplotlib is not installed (pip install -e '.[examples]')", file=sys.stderr)
    print(table(runs))
    print(f"{PROG}: wrote {args.out / 'loss.png'} and {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
