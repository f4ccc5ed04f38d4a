#!/usr/bin/env python
"""Train a GPT or LLaMA-style model with 2:4 sparse linear layers: the jax_sparse24 training script to copy.

    python examples/train.py --size tiny --steps 300 --out runs/tiny          # CPU, about a minute
    python examples/train.py --size tiny --compare dense,srste --out runs/cmp  # side by side
    python examples/train.py --data data/realtext --size llama-7b --n-layer 32 --mesh fsdp=4 --remat full
    python examples/launch.py --nproc 4 -- examples/train.py --distributed --mesh fsdp=4 ...  # one per GPU

Recipes: ``dense`` (``nn.Dense``, AdamW); ``srste`` (SR-STE: transposable masks refreshed every 40 steps, the MVUE
weight gradient, masked decay of the pruned weights, a dense fine-tune over the last sixth); ``sste``
(soft-thresholded weights); ``ste`` (the weights' 2:4 magnitude mask). The FFN linears are 2:4, at the LLaMA sizes
the attention projections too. ``--out`` gets ``loss.png``, ``summary.json`` and orbax checkpoints in
``ckpt/<recipe>/``; ``--resume`` continues from them, ``--overwrite`` starts over. Ctrl-C stops at the next step,
saves a checkpoint and exits 130 with one line saying how to resume. (``--data``: the token shards of
examples/prepare_data.py; several GPUs: docs/multi_gpu.md.)
"""

from __future__ import annotations

import signal
import sys
import threading

PROG = "train.py"


class StopFlag:
    """Ctrl-C as a flag that the loop reads between steps. (A ``KeyboardInterrupt`` raised while XLA compiles on
    its own threads tears the runtime down under the compilation: SIGSEGV.) A second Ctrl-C ends the process."""

    requested, _prev = False, None

    def on_sigint(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next Ctrl-C ends the process

    def install(self) -> bool:
        """Install the handler (main thread only); True if it was not installed before."""
        if self._prev is not None or threading.current_thread() is not threading.main_thread():
            return False
        self._prev = signal.signal(signal.SIGINT, self.on_sigint)
        return True

    def uninstall(self) -> None:
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
            self._prev = None


STOP = StopFlag()
if __name__ == "__main__":
    STOP.install()  # before the slow imports: a Ctrl-C during them is a flag too

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model.py and data.py beside this file
import jax_sparse24 as s24  # noqa: E402
from jax_sparse24.training import SparseTrainState  # noqa: E402

from data import DEFAULT_DATA, CLIError, load_data  # noqa: E402
from model import GPT, SIZES, GPTConfig, sparse_layer_paths  # noqa: E402

#: recipe -> the method of the 2:4 layers and what the optimizer adds
RECIPES = {
    "dense": dict(method="dense"),
    "srste": dict(method="srste", mvue=True, masked_decay=2e-4, dense_tail=1 / 6, lr_scale=2.0),
    "sste": dict(method="soft", mvue=True),
    "ste": dict(method="ste"),
}
TINY = ("tiny", "llama-tiny")  # sste and ste: sparse_lr_scale 2 here (their 2:4 layers lag early), 1 above
#: per-size defaults of the flags; the LLaMA sizes make the attention projections 2:4 too
_SMALL = dict(steps=300, batch_size=16, seq_len=64, lr=2e-3, warmup=50, eval_batches=4)
_LARGE = dict(steps=5000, batch_size=8, seq_len=2048, warmup=200, eval_batches=4, sparse_attn=True)
SIZE_DEFAULTS = {
    "tiny": _SMALL, "llama-tiny": dict(_SMALL, sparse_attn=True),
    "gpt2": dict(_LARGE, batch_size=16, seq_len=1024, lr=6e-4, sparse_attn=False),
    "gpt2-medium": dict(_LARGE, seq_len=1024, lr=3e-4, sparse_attn=False),
    "llama-300m": dict(_LARGE, lr=6e-4), "llama-1b": dict(_LARGE, lr=3e-4), "llama-7b": dict(_LARGE, lr=1.5e-4),
}
MESH_AXES = ("data", "fsdp", "model")  # --mesh: data parallel, FSDP (ZeRO-3), Megatron tensor parallel
BATCH_AXES = ("data", "fsdp")  # the axes that split the batch
PINNED = "^(GPT|MLP|CausalSelfAttention)|Block"  # FSDP: the modules whose activations stay split by batch
RUN_FILES = ("summary.json", "loss.png", "ckpt")  # what a run writes into --out


def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="Train a GPT with 2:4 sparse layers (jax_sparse24).")
    ap.error = lambda msg: (print(f"{PROG}: error: {msg}", file=sys.stderr), sys.exit(2))  # one line, no usage
    add = ap.add_argument
    add("--size", choices=list(SIZES), default="tiny", help="model size (default: tiny)")
    add("--recipe", choices=list(RECIPES), default="srste", help="2:4 training recipe (default: srste)")
    add("--compare", metavar="R1,R2,...", help="train these recipes one after another and print a table")
    add("--n-layer", type=int, help="transformer blocks (default: the size's; fewer keep its width)")
    add("--steps", type=int, help="optimizer steps (default: per size)")
    add("--batch-size", type=int, help="sequences per step, all devices together (default: per size)")
    add("--lr", type=float, help="peak learning rate (default: per size)")
    add("--eval-every", type=int, help="steps between evaluations (default: a tenth of the steps)")
    add("--ckpt-every", type=int, help="steps between checkpoints (default: a third of the steps; 0: none)")
    add("--data", type=Path, default=DEFAULT_DATA, help="a text file (its bytes are the tokens) or a directory of "
        "examples/prepare_data.py (default: the bundled public-domain text)")
    add("--out", type=Path, help="output directory (default: runs/SIZE)")
    add("--resume", action="store_true", help="continue the run in --out from its latest checkpoints")
    add("--overwrite", action="store_true", help="replace a previous run in --out")
    add("--mesh", help=f"a device mesh, e.g. fsdp=4 or data=2,fsdp=2 (axes: {', '.join(MESH_AXES)})")
    add("--remat", choices=("none", "dots", "full"), default="none", help="recompute each block in the backward pass")
    add("--distributed", action="store_true", help="one process per GPU, started by examples/launch.py")
    add("--seed", type=int, default=0, help="seed of the init, the batches and the MVUE gradient")
    args = ap.parse_args(argv)
    args.argv = list(argv)
    args.recipes = [r.strip() for r in (args.compare or args.recipe).split(",") if r.strip()]
    if not args.recipes or any(r not in RECIPES for r in args.recipes) or len(set(args.recipes)) < len(args.recipes):
        ap.error(f"--compare {args.compare!r}: give distinct recipes from {', '.join(RECIPES)}")
    for flag, default in dict(SIZE_DEFAULTS[args.size], n_layer=SIZES[args.size]["n_layer"]).items():
        if getattr(args, flag, 0) is None:  # steps, batch_size, lr, n_layer
            setattr(args, flag, default)
    args.eval_every = max(1, args.steps // 10) if args.eval_every is None else args.eval_every
    args.ckpt_every = max(1, args.steps // 3) if args.ckpt_every is None else args.ckpt_every
    for flag in ("n_layer", "steps", "batch_size", "lr", "eval_every"):
        if not getattr(args, flag) > 0:
            ap.error(f"--{flag.replace('_', '-')} must be > 0")
    if args.ckpt_every < 0:
        ap.error("--ckpt-every must be >= 0 (0: no checkpoints)")
    if args.resume and args.overwrite:
        ap.error("--resume continues the run in --out and --overwrite starts it over: pass one of them")
    args.out = args.out or Path("runs") / args.size
    return args


def check_out(args) -> None:  # refuse to write over a previous run in --out unless asked
    p = next(p for p in (args.out, *args.out.parents) if p.exists())  # --out, or its first parent that exists
    if not p.is_dir():
        raise CLIError(f"--out {args.out}: {p} is a file, not a directory; choose another --out")
    held = [f for f in RUN_FILES if (args.out / f).exists()]
    if args.resume and not (args.out / "ckpt").is_dir():
        raise CLIError(f"--resume: {args.out} holds no checkpoints (ckpt/) to continue from")
    if held and not (args.resume or args.overwrite):
        how = "--resume to continue it, " if "ckpt" in held else ""
        raise CLIError(f"--out {args.out} holds a previous run ({', '.join(held)}); pass {how}--overwrite to "
                       "replace it, or choose another --out")


def init_devices(args):  # jax.distributed (--distributed), the mesh of --mesh (all devices; default: one)
    if args.distributed:
        env = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
        if not all(os.environ.get(k) for k in env):
            raise CLIError(f"--distributed needs {', '.join(env)}: start the processes with "
                           "examples/launch.py --nproc N -- examples/train.py --distributed ...")
        if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(os.environ[env[0]], int(os.environ[env[1]]), int(os.environ[env[2]]))
    try:
        given = dict(part.split("=") for part in args.mesh.replace(" ", "").split(",")) if args.mesh else {}
        sizes = {a: int(given.pop(a, 1)) for a in MESH_AXES}
        if given:
            raise ValueError(f"unknown axis {next(iter(given))!r}")
        mesh = s24.sharding.make_mesh(sizes, devices=jax.devices() if args.mesh else jax.devices()[:1])
    except ValueError as e:
        raise CLIError(f"--mesh {args.mesh!r}: {e} (axes {', '.join(MESH_AXES)}, e.g. fsdp=4; "
                       f"{jax.device_count()} devices)") from None
    if args.batch_size % (sizes["data"] * sizes["fsdp"]):
        raise CLIError(f"--batch-size {args.batch_size} is not divisible by the mesh's data x fsdp devices "
                       f"({sizes['data'] * sizes['fsdp']})")
    return mesh


def stop_now(step=None, every: int = 1) -> bool:
    """Whether to stop for Ctrl-C here; several processes agree (a collective) at the steps ``every`` divides."""
    if jax.process_count() == 1:
        return STOP.requested
    if step is None or step % every:
        return False
    return bool(multihost_utils.process_allgather(np.int32(STOP.requested)).max())


# --- One recipe: model, optimizer, the jitted steps, checkpoints, the loop ----------------------------------
def train(args, recipe: str, data, mesh) -> dict:
    r = RECIPES[recipe]
    steps, B, T = args.steps, args.batch_size, data.seq_len
    gpu = jax.default_backend() == "gpu"
    cfg = GPTConfig(**dict(SIZES[args.size], block_size=T, n_layer=args.n_layer), vocab_size=data.vocab_size or 256,
                    method=r["method"], mvue=r.get("mvue", False),
                    sparse_attn=SIZE_DEFAULTS[args.size].get("sparse_attn", False),
                    dtype=jnp.bfloat16 if gpu else jnp.float32, attention="auto", remat=args.remat,
                    layers="scan" if gpu else "unroll")  # scan: one block compiled for all; unrolled: faster on a CPU
    model = GPT(cfg)

    # The optimizer: AdamW with warm-up and cosine decay, plus the recipe's 2:4 transforms.
    dense_after = steps - round(steps * r["dense_tail"]) if "dense_tail" in r else None  # srste's dense fine-tune
    sparse_kernels = {"/".join(p) + "/kernel" for p in sparse_layer_paths(cfg)}
    decayed = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731 - weights, not biases or norms
        lambda path, _: path[-1].key in ("kernel", "embedding"), params)
    lr = optax.warmup_cosine_decay_schedule(0.0, args.lr, min(SIZE_DEFAULTS[args.size]["warmup"], steps // 5),
                                            steps, args.lr / 10)
    chain = [optax.clip_by_global_norm(1.0)]
    if "masked_decay" in r:  # SR-STE: decay the pruned weights (the masks come from the train state)
        chain.append(s24.optim.masked_decay(r["masked_decay"], active_until=dense_after))
    chain.append(optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1, mask=decayed))
    lr_scale = r.get("lr_scale", 2.0 if args.size in TINY else 1.0)
    if sparse_kernels and lr_scale != 1:  # a 2:4 layer's output moves half as far per Adam step
        chain.append(s24.optim.sparse_lr_scale(lr_scale, where=lambda path, _: path in sparse_kernels,
                                               active_until=dense_after))

    # The train state: params, masks, optimizer state, the key of the MVUE gradient.
    def fresh_state():
        variables = model.init(jax.random.key(args.seed), jnp.zeros((1, T), jnp.int32))
        return SparseTrainState.create(apply_fn=model.apply, params=variables["params"], tx=optax.chain(*chain),
                                       sparsity=variables.get("sparsity", {}),
                                       rng=jax.random.key(args.seed + 1) if cfg.mvue else None)

    # Where it lives: Megatron tensor parallel over `model` (qkv, fc by column, proj by row), >= 2-D leaves over `fsdp`.
    rules = s24.sharding.megatron_mlp_rules(r"(attn/qkv|mlp/fc)", r"(attn|mlp)/proj")
    try:
        shardings = s24.sharding.param_shardings(jax.eval_shape(fresh_state), mesh, rules, fsdp="fsdp",
                                                 stacked=r"(^|/)h/")
    except ValueError as e:
        raise CLIError(f"--mesh: {e}") from None
    batch_sharding, replicated = NamedSharding(mesh, P(BATCH_AXES)), NamedSharding(mesh, P())

    # The steps. `sparse` is a Python bool: one program for the 2:4 phase, one for the dense fine-tune.
    def loss_fn(params, state, tokens, sparse):
        logits = state.apply(tokens[:, :-1], params=params, sparse=sparse)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def pinned(step):  # FSDP: the blocks' and linear layers' activations stay split by batch (weights are gathered)
        def pinned_step(*args):
            with s24.sharding.batch_sharded_activations(mesh, BATCH_AXES, modules=PINNED):
                return step(*args)
        return pinned_step if mesh.shape["fsdp"] > 1 else step

    @pinned
    def train_step(state, tokens, sparse):
        if sparse and sparse_kernels:  # the 2:4 weights masked (on a GPU compressed) once, all layers together
            state = state.prepare(tokens[:, :-1], sparse=True)
        loss, grads = jax.value_and_grad(loss_fn)(state.params, state, tokens, sparse)
        # masked decay, the AdamW update, step + 1 (the masks are refreshed in a program of their own)
        return state.apply_gradients(grads=grads, sparse=sparse, refresh=False), loss

    donate = (0,) if gpu else ()  # on a GPU the step updates the state in place
    jit_train = jax.jit(train_step, static_argnums=2, donate_argnums=donate, in_shardings=(shardings, batch_sharding),
                        out_shardings=(shardings, replicated))
    eval_step = jax.jit(pinned(lambda state, tokens, sparse: loss_fn(state.params, state, tokens, sparse)),
                        static_argnums=2, in_shardings=(shardings, batch_sharding), out_shardings=replicated)
    refresh = jax.jit(lambda state: state.refresh_masks(), donate_argnums=donate, in_shardings=(shardings,),
                      out_shardings=shardings)  # srste: new 2:4 masks
    init = jax.jit(fresh_state, out_shardings=shardings)

    def put(tokens):  # each process passes its rows of the global batch
        rows = B // jax.process_count()
        return s24.sharding.shard_batch(tokens[jax.process_index() * rows:][:rows], mesh, BATCH_AXES)

    def evaluate(state, sparse, batches) -> float:
        return float(np.mean([eval_step(state, put(b), sparse) for b in batches]))

    # Checkpoints: the arrays of the train state (orbax, each process its shards) and the run's history.
    ckpt = ocp.CheckpointManager((args.out / "ckpt" / recipe).resolve(),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=1, create=args.ckpt_every > 0))
    config = dict(recipe=recipe, size=args.size, n_layer=args.n_layer, steps=steps, batch_size=B, seq_len=T,
                  lr=args.lr, seed=args.seed, data_sha256=data.sha256)
    arrays = lambda st: dict(step=st.step, params=st.params, opt_state=st.opt_state, sparsity=st.sparsity)  # noqa: E731

    def save(state, step):
        if ckpt.latest_step() != step:
            meta = dict(config=config, history=history, train_loss=train_loss, spans=spans, last=last)
            ckpt.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(arrays(state)),
                                                    meta=ocp.args.JsonSave(meta)))
            ckpt.wait_until_finished()

    start = ckpt.latest_step() if args.resume else None  # --resume: from the latest checkpoint, if any
    if start is not None:
        meta = ckpt.restore(start, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        if meta["config"] != config:
            diff = ", ".join(f"{k} {v!r} there, {config.get(k)!r} now" for k, v in meta["config"].items()
                             if config.get(k) != v)
            raise CLIError(f"--resume: the checkpoint in {ckpt.directory} is of another run ({diff}); resume with "
                           "its flags, or pass --overwrite to start over")

    # Compile every program (on a GPU also pick its kernels) by running it once on a throw-away state, before
    # the clock starts; then the state to train: fresh (the init is seeded) or the checkpoint's.
    t = time.perf_counter()
    state = init()
    periods = s24.masks.mask_periods(state.sparsity)  # () for the recipes without stored masks
    for sparse in [True] if dense_after is None else [True, False]:
        if not stop_now():
            state, _ = jit_train(state, put(data.batch(0)), sparse)
    if periods and not stop_now():
        state = refresh(state)
    jax.block_until_ready(state)
    del state  # its buffers are free before the state to train is allocated
    if stop_now():
        raise KeyboardInterrupt(f"interrupted while compiling {recipe}: nothing was saved")
    # spans: (2:4 phase?, steps, seconds) between two device syncs; spans[last:]: since the last evaluation
    state, history, train_loss, spans, last = init(), [], [], [], 0
    if start is not None:
        restore = ocp.args.StandardRestore(arrays(state))  # into the fresh state's shardings
        state = state.replace(**ckpt.restore(start, args=ocp.args.Composite(state=restore)).state)
        history, train_loss, spans, last = (meta[k] for k in ("history", "train_loss", "spans", "last"))
    start = start or 0
    leaves = jax.tree_util.tree_leaves_with_path(state.params)
    n_params = sum(x.size for _, x in leaves)
    n_sparse = sum(x.size for path, x in leaves if "/".join(k.key for k in path) in sparse_kernels)
    log(f"{recipe}: {n_params / 1e6:.1f}M params ({n_sparse / n_params:.0%} in 2:4 layers), compiled in "
        f"{time.perf_counter() - t:.0f} s" + (f"; resumed at step {start}" if start else ""))

    # The loop. The clock counts training steps only: it stops for the evaluations, checkpoints and at the
    # switch to the dense fine-tune, so each span between two device syncs runs one program.
    losses, stopped = [], False
    clock = time.perf_counter()
    for step in range(start, steps):
        if stop_now(step, args.eval_every):
            stopped = True
            break
        sparse = dense_after is None or step < dense_after
        state, loss = jit_train(state, put(data.batch(step)), sparse)
        if sparse and s24.masks.refresh_due(periods, step + 1):
            state = refresh(state)
        losses.append(loss)
        due = (step + 1) % args.eval_every == 0 or step + 1 == steps
        save_due = args.ckpt_every and ((step + 1) % args.ckpt_every == 0 or step + 1 == steps)
        if not (due or save_due or step + 1 == dense_after):
            continue
        train_loss += [float(x) for x in jax.device_get(losses)]  # waits for the device
        spans.append((sparse, len(losses), time.perf_counter() - clock))
        losses = []
        if due:
            n = sum(s[1] for s in spans[last:])
            rate, last = B * T * n / sum(s[2] for s in spans[last:]), len(spans)
            loss, val = float(np.mean(train_loss[-n:])), evaluate(state, sparse, data.val_batches)
            history.append({"step": step + 1, "loss": loss, "val_loss": val})
            log(f"{recipe:>5s} step {step + 1:5d}/{steps}  loss {loss:.4f}  val {val:.4f}  {rate:9,.0f} tokens/s  "
                f"{sum(s[2] for s in spans):6.1f} s", progress=True)
        if save_due:
            save(state, step + 1)
        clock = time.perf_counter()
    if losses:  # (stopped between two syncs)
        train_loss += [float(x) for x in jax.device_get(losses)]
        spans.append((sparse, len(losses), time.perf_counter() - clock))
    done = len(train_loss)
    if stopped:  # Ctrl-C: a checkpoint of the steps done, and how to continue
        if done == start:
            raise KeyboardInterrupt(f"interrupted before {recipe}'s first step: nothing was saved")
        if args.ckpt_every:
            save(state, done)
        command = [os.path.relpath(__file__), *[a for a in args.argv if a not in ("--overwrite", "--resume")]]
        where = (f"checkpoint saved in {ckpt.directory}; continue with: python {shlex.join(command)} --resume"
                 if args.ckpt_every else "no checkpoint (--ckpt-every 0)")
        raise KeyboardInterrupt(f"interrupted at step {done} of {recipe}: {where}")

    # Tokens/s: the steady state of the main phase (the 2:4 steps of a 2:4 recipe, every step of dense),
    # without its first span (the first steps after compiling); the whole run's rate includes the fine-tune.
    main_spans = [s for s in spans if s[0]] or spans
    main_spans = main_spans[1:] or main_spans
    final = evaluate(state, dense_after is None, data.final_val_batches(16 * B * T))  # more windows than the curve's
    rate = lambda sp: B * T * sum(s[1] for s in sp) / sum(s[2] for s in sp) if sp else None  # noqa: E731
    return {"recipe": recipe, "n_params": n_params, "final_val_loss": final, "tokens_per_s": rate(main_spans),
            "run_tokens_per_s": rate(spans), "train_time_s": sum(s[2] for s in spans), "resumed_at": start,
            "dense_after": dense_after, "sparse_lr_scale": lr_scale, "history": history, "train_loss": train_loss}


# --- Outputs: the table, loss.png, summary.json -------------------------------------------------------------
def log(line: str, progress: bool = False) -> None:
    """A line of process 0 (one process writes the logs and the files): progress on stdout, the rest on stderr."""
    if jax.process_index() == 0:
        print(line if progress else f"{PROG}: {line}", file=sys.stdout if progress else sys.stderr, flush=True)


def table(runs: list[dict]) -> str:
    base = next((s for s in runs if s["recipe"] == "dense"), None)
    ratio = lambda s, k: f"{s[k] / base[k]:.2f}x" if base and s[k] and base[k] else "-"  # noqa: E731
    lines = ["| recipe | tokens/s | vs dense | whole run | final val loss | vs dense |", "|---|---|---|---|---|---|"]
    for s in runs:
        loss = f"{100 * (s['final_val_loss'] / base['final_val_loss'] - 1):+.2f}%" if base else "-"
        lines.append(f"| {s['recipe']} | {s['tokens_per_s'] or 0:,.0f} | {ratio(s, 'tokens_per_s')} | "
                     f"{ratio(s, 'run_tokens_per_s')} | {s['final_val_loss']:.4f} | {loss} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path, title: str) -> None:
    from matplotlib.figure import Figure  # (not pyplot: no GUI backend)

    fig = Figure(figsize=(7, 4), layout="tight")
    ax = fig.subplots()
    for i, s in enumerate(runs):
        ax.plot(range(1, len(s["train_loss"]) + 1), s["train_loss"], color=f"C{i}", alpha=0.3, lw=0.8,
                label=f"{s['recipe']} train")
        ax.plot([h["step"] for h in s["history"]], [h["val_loss"] for h in s["history"]], "o-", color=f"C{i}",
                ms=3, label=f"{s['recipe']} val")
    ax.set(xlabel="step", ylabel="cross-entropy", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    """Exit code 0; 2 for bad input (one line, nothing written); 130 after Ctrl-C (one line)."""
    fresh = STOP.install()
    if fresh:  # (a Ctrl-C before main, during the imports, is kept)
        STOP.requested = False
    try:
        args = parse_args(sys.argv[1:] if argv is None else [str(a) for a in argv])
        mesh = init_devices(args)
        d = SIZE_DEFAULTS[args.size]  # the data first: a wrong --data is named before anything about --out
        data = load_data(args.data, d["seq_len"], args.batch_size, args.seed, d["eval_batches"])
        check_out(args)
        if args.overwrite and jax.process_index() == 0:
            for f in RUN_FILES:
                shutil.rmtree(args.out / f) if (args.out / f).is_dir() else (args.out / f).unlink(missing_ok=True)
        args.out.mkdir(parents=True, exist_ok=True)
        device = jax.devices()[0].device_kind
        log(f"{len(data.train):,} training {data.unit} from {data.path}, vocabulary {data.vocab_size or 256}; "
            f"{args.size} ({args.n_layer} layers), {args.steps} steps of {args.batch_size} x {data.seq_len} tokens "
            f"on {jax.device_count()} x {device}")
        if stop_now(0):
            raise KeyboardInterrupt
        runs = [train(args, recipe, data, mesh) for recipe in args.recipes]
        if jax.process_index() == 0:
            summary = {"size": args.size, "n_layer": args.n_layer, "steps": args.steps, "batch_size": args.batch_size,
                       "seq_len": data.seq_len, "data": str(data.path), "vocab_size": data.vocab_size or 256,
                       "device": device, "mesh": dict(mesh.shape), "runs": runs}
            (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
            try:
                plot(runs, args.out / "loss.png", f"{args.size}, {args.steps} steps")
            except ImportError:
                log("no loss.png: matplotlib is not installed (pip install -e '.[examples]')")
            print(table(runs))
            print(f"{PROG}: wrote {args.out / 'loss.png'} and {args.out / 'summary.json'}")
        return 0
    except (CLIError, OSError) as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt as e:
        log(str(e) or "interrupted before training: nothing was saved")
        return 130
    finally:
        if fresh:
            STOP.uninstall()


if __name__ == "__main__":
    sys.exit(main())
