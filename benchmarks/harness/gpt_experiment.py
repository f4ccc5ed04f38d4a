"""The experiment of ``train_gpt.py``: recipes, per-size defaults, flag resolution, and the
model / optimizer / train and eval steps built from the resolved flags.

* :data:`RECIPES`, :data:`SIZE_DEFAULTS`, :data:`CONFIG_KEYS` — what a run is;
* :func:`resolve_flags` — the parsed command line of one recipe -> ``hp`` (validated);
* :func:`build_experiment` -> :class:`Experiment` (model, optax chain, mask schedule);
* :func:`init_state`, :func:`make_train_step`, :func:`make_eval_step` — pure functions to jit
  (``gpt_runtime.Runtime`` jits them with shardings). The train state is the dict
  ``{"step", "params", "sparsity", "opt_state"}`` (what the checkpoints hold); the train step runs
  it as a :class:`jax_sparse24.training.SparseTrainState` (MVUE keys, prepared weights, masked
  decay, update) and logs STEP's phase (:func:`jax_sparse24.optim.step_state`);
* :func:`refreshes_masks`, :func:`measures_flips` — whether the loop runs the srste mask refresh /
  the ste/soft/ast flip rate, kept out of the train step (no conditional in it) and run on the
  steps that need them (``gpt_runtime.Runtime.run_step``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from jax_sparse24 import distill as s24distill
from jax_sparse24 import fp8 as s24fp8
from jax_sparse24 import nn as s24nn
from jax_sparse24 import masks as s24masks
from jax_sparse24 import preparation as s24prep
from jax_sparse24 import optim as s24optim
from jax_sparse24.training import SparseTrainState

import train as example  # the example's per-size defaults
from data import CLIError
from gpt_model import GPTConfig
from model import GPT, SIZES, STACK, attention_implementation, sparse_layer_paths

#: recipe -> Sparse24Dense settings and optimizer extras.
RECIPES: dict[str, dict[str, Any]] = {
    "dense": dict(method="dense", mvue=False),
    "srste": dict(method="srste", mvue=True, transposable=True, masked_decay=True, finetune=True, lr_scale=True),
    "sste": dict(method="soft", mvue=True, lr_scale=True),
    "step": dict(method="ste", mvue=False, step=True),
    "ste": dict(method="ste", mvue=False, lr_scale=True),
    # AST: Sparse24LowRankDense layers (mask recomputed every call, like ste), dense teacher.
    "ast": dict(method="ste", mvue=False, linear="lowrank", ast=True),
}

#: per-size defaults of the training flags (a flag given on the command line wins): the example's, with the
#: harness's evaluation, checkpoint and logging intervals
SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    size: dict(d, **(dict(eval_every=25, ckpt_every=100, log_every=5) if size in example.TINY else
                     dict(eval_every=250, ckpt_every=1000, log_every=10)))
    for size, d in example.SIZE_DEFAULTS.items()}
# prepare_weights "always" at both GPT-2 sizes: bench_train_gpt's interleaved rounds on the H200,
# srste vs dense prepared / per call: gpt2 1.016x / 0.987x, gpt2-medium 1.063x / 1.041x; ste and step
# gain too, sste at gpt2 does not (0.983x prepared vs 1.003x per call). The example's own loop, one
# process per run, cannot decide it: the card is power-capped (~690 W, SM clocks 1650-1900 MHz within
# one 1500-step GPT-2 run) and a run's clocks depend on when it runs
for _size in ("gpt2", "gpt2-medium"):
    SIZE_DEFAULTS[_size]["prepare_weights"] = "always"

#: sizes whose learning rate is high for their length (2e-3 over 300 steps): their 2:4 layers lag early
TINY_SIZES = example.TINY


def default_sparse_lr_scale(size: str, recipe: str, finetune_fraction: float = 1 / 6) -> float:
    """``--sparse-lr-scale`` when not given (measured on real text).

    2 (= 1/density) on the tiny sizes for every recipe: at the dense learning rate the tiny model's
    2:4 FFNs lag and the loss spikes (srste 2.30x, sste 1.94x, ``quality_tiny_cpu_realtext.json``).
    At the GPT-2 and LLaMA sizes (GPT-2 124M, 100M tokens):

    * srste with its default short dense fine-tune (``finetune_fraction`` <= 1/4): 2 -- +0.30% from
      dense on the validation windows (+0.46% on 1M val tokens); 1 ended +0.97% (+0.48%) on the H200;
    * srste with a long dense tail (``finetune_fraction`` > 1/4, e.g. the quality benchmark's
      dense-tail, 1/2 dense): 1 -- +0.39% (-0.17% on 1M val tokens) where 2 ended +1.73%;
    * sste and ste: 1 -- +0.35% / 0.00% where 2 ended +2.33% / +3.32%
      (``quality_gpt2_h100_realtext_100m_lr1.md``).

    Single runs (a dense repeat moved 0.33%); the 1/4 boundary lies between the two measured dense
    fractions (1/6 and 1/2), it was not itself measured.
    """
    if size in TINY_SIZES:
        return 2.0
    return 2.0 if recipe == "srste" and finetune_fraction <= 0.25 else 1.0


#: flags that define the training run; a checkpoint is only resumed by an identical set.
CONFIG_KEYS = (
    "recipe", "size", "steps", "batch_size", "seq_len", "lr", "warmup", "min_lr_fraction",
    "weight_decay", "b1", "b2", "grad_clip", "decay_alpha", "mask_every", "finetune_fraction",
    "ffn", "sparse_attn", "untied_head", "dtype", "seed", "n_layer", "n_head", "n_embd", "grad_accum", "fp8",
    "sparse_lr_scale", "finetune_start", "fp8_scaling", "fp8_dense", "layers",
)
#: extra flags that define an ``ast`` run (only in the config of ast checkpoints).
AST_CONFIG_KEYS = ("teacher", "kd_alpha", "kd_temperature", "slorb_group")
#: flags a dense teacher must share with the ast student (they fix the parameter shapes).
TEACHER_MATCH_KEYS = ("size", "n_layer", "n_head", "n_embd", "seq_len", "ffn", "untied_head")


# ------------------------------------------------------------------------------------------------
# Flags
# ------------------------------------------------------------------------------------------------


def resolve_flags(args: argparse.Namespace, recipe: str) -> dict:
    defaults = SIZE_DEFAULTS[args.size]
    hp = {}
    for k in ("steps", "batch_size", "seq_len", "lr", "warmup"):
        v = getattr(args, k)
        hp[k] = defaults[k] if v is None else v
    hp.update(
        recipe=recipe, size=args.size, min_lr_fraction=args.min_lr_fraction,
        weight_decay=args.weight_decay, b1=args.b1, b2=args.b2, grad_clip=args.grad_clip,
        decay_alpha=args.decay_alpha, mask_every=args.mask_every,
        finetune_fraction=args.finetune_fraction,
        # what the dense fine-tune starts from ("weights" where the recipe has none, so the checkpoint
        # config of the other recipes is unchanged)
        finetune_start=args.finetune_start if RECIPES[recipe].get("finetune") else "weights",
        # the 2:4 kernels' learning-rate multiplier (jax_sparse24.optim.sparse_lr_scale); 1 where the
        # recipe does not use it, so the checkpoint config of dense / step / ast runs is unchanged
        sparse_lr_scale=((default_sparse_lr_scale(args.size, recipe, args.finetune_fraction)
                          if args.sparse_lr_scale is None
                          else args.sparse_lr_scale) if RECIPES[recipe].get("lr_scale") else 1.0),
        ffn=args.ffn or SIZES[args.size].get("ffn", "gelu"),
        sparse_attn=defaults.get("sparse_attn", False) if args.sparse_attn is None else args.sparse_attn,
        untied_head=args.untied_head or not SIZES[args.size].get("tie_head", True),
        dtype=args.dtype, seed=args.seed,
        attention=args.attention,  # not in CONFIG_KEYS: a kernel choice, the model is the same
        sparse_backend=args.sparse_backend,  # not in CONFIG_KEYS: a kernel choice, same math
        # not in CONFIG_KEYS: same math, done once per step
        prepare_weights=args.prepare_weights or defaults.get("prepare_weights", "on"),
        grad_accum=args.grad_accum,
        fp8=bool(getattr(args, "fp8", False)),  # in CONFIG_KEYS: fp8 GEMMs change the numbers
        fp8_scaling=getattr(args, "fp8_scaling", "current"),  # in CONFIG_KEYS: the scales change the numbers
        # in CONFIG_KEYS: Flax's layer has fp8 weight gradients. Under --compare it is the dense recipe's
        # layer; the 2:4 recipes keep theirs (so --compare dense,srste --fp8-dense flax pairs them).
        fp8_dense=(getattr(args, "fp8_dense", "sparse24")
                   if recipe == "dense" or getattr(args, "compare", None) is None else "sparse24"),
        flip_every=flag_or_size_default(args, "log_every"),  # ste/soft flip rate: on logging steps (not in CONFIG_KEYS)
        layers=getattr(args, "layers", "scan"),  # in CONFIG_KEYS: the checkpoint's tree layout
        remat=getattr(args, "remat", "none"),  # not in CONFIG_KEYS: same math, recomputed
    )
    for k in ("vocab_size", "tokenizer_sha256"):  # --data DIR (train_gpt.main sets them from the data)
        if getattr(args, k, None) is not None:
            hp[k] = getattr(args, k)
    for k in ("n_layer", "n_head", "n_embd"):
        v = getattr(args, k)
        hp[k] = SIZES[args.size][k] if v is None else v
        if hp[k] < 1:
            raise CLIError(f"--{k.replace('_', '-')} must be >= 1, got {hp[k]}")
    if hp["n_embd"] % 4 or hp["n_embd"] % hp["n_head"]:
        raise CLIError(f"--n-embd {hp['n_embd']} must be a multiple of 4 (2:4 groups) and of n_head "
                       f"({hp['n_head']})")
    try:
        attention_implementation(hp["attention"], _resolve_dtype(hp["dtype"]), hp["n_embd"] // hp["n_head"])
    except ValueError as e:
        raise CLIError(f"--attention {hp['attention']}: {e}") from None
    for k in ("steps", "batch_size", "seq_len", "grad_accum"):
        if hp[k] < 1:
            raise CLIError(f"--{k.replace('_', '-')} must be >= 1, got {hp[k]}")
    if hp["batch_size"] % hp["grad_accum"]:
        raise CLIError(f"--batch-size {hp['batch_size']} must be a multiple of --grad-accum {hp['grad_accum']}")
    if hp["lr"] <= 0:
        raise CLIError(f"--lr must be > 0, got {hp['lr']}")
    if not 0 <= hp["finetune_fraction"] <= 1:
        raise CLIError(f"--finetune-fraction must be in [0, 1], got {hp['finetune_fraction']}")
    if args.sparse_lr_scale is not None and not args.sparse_lr_scale > 0:
        raise CLIError(f"--sparse-lr-scale must be > 0, got {args.sparse_lr_scale}")
    if hp["mask_every"] < 1:
        raise CLIError(f"--mask-every must be >= 1, got {hp['mask_every']}")
    if hp["fp8_scaling"] != "current" and not hp["fp8"]:
        raise CLIError(f"--fp8-scaling {hp['fp8_scaling']} needs --fp8")
    if hp["fp8_dense"] != "sparse24":
        if not (hp["fp8"] and recipe == "dense"):
            raise CLIError(f"--fp8-dense {hp['fp8_dense']} chooses the fp8 layer of the dense recipe with --fp8 "
                           f"(got recipe {recipe}{' with --fp8' if hp['fp8'] else ' without --fp8'})")
        if hp["fp8_scaling"] != "delayed":
            raise CLIError(f"--fp8-dense {hp['fp8_dense']} is Flax's delayed-scaling layer: add --fp8-scaling delayed")
    if hp["fp8"] and RECIPES[recipe].get("ast"):
        raise CLIError("--fp8 is not supported with --recipe ast (its low-rank layers have no fp8 path)")
    if RECIPES[recipe].get("ast"):
        if args.teacher is None:
            raise CLIError("--recipe ast needs --teacher DIR: the --out directory (or its ckpt/) of a "
                           "`--recipe dense` run of this script with the same model flags")
        if args.slorb_group < 1:
            raise CLIError(f"--slorb-group must be >= 1, got {args.slorb_group}")
        if args.kd_temperature <= 0:
            raise CLIError(f"--kd-temperature must be > 0, got {args.kd_temperature}")
        hp.update(teacher=str(Path(args.teacher).resolve()), kd_alpha=args.kd_alpha,
                  kd_temperature=args.kd_temperature, slorb_group=args.slorb_group)
    return hp


def flag_or_size_default(args, name):
    v = getattr(args, name)
    return SIZE_DEFAULTS[args.size][name] if v is None else v


def run_config(hp: dict, data_sha256: str) -> dict:
    """The flags stored in (and compared against) a run's checkpoints."""
    keys = CONFIG_KEYS + (AST_CONFIG_KEYS if RECIPES[hp["recipe"]].get("ast") else ())
    config = {k: hp[k] for k in keys}
    config["data_sha256"] = data_sha256
    if hp.get("tokenizer_sha256") is not None:  # --data DIR: its tokenizer (a byte corpus's config is unchanged)
        config["tokenizer_sha256"] = hp["tokenizer_sha256"]
        config["vocab_size"] = hp.get("vocab_size", 256)
    return config


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` once: not for flags without a default (None) or on/off switches, nor
    where the help already states the default (e.g. "default: per size")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


def sizes_help() -> str:
    """``--size`` help: each size's shape and default training length (from SIZES / SIZE_DEFAULTS)."""
    parts = []
    for name, shape in SIZES.items():
        d = SIZE_DEFAULTS.get(name, {})
        desc = (f"{shape['arch']}, " if shape.get("arch") else "") + (
            f"{shape.get('n_layer')} layers, width {shape.get('n_embd')}, {shape.get('n_head')} heads")
        if d:
            desc += f"; {d.get('steps')} steps of {d.get('batch_size')}x{d.get('seq_len')} tokens"
        parts.append(f"{name} ({desc})")
    return ("model size, which also sets the defaults of --steps/--batch-size/--seq-len/--lr/--warmup/"
            "--eval-every/--ckpt-every: " + "; ".join(parts) + " (default: %(default)s)")


# ------------------------------------------------------------------------------------------------
# Model, optimizer, train/eval steps
# ------------------------------------------------------------------------------------------------


def cross_entropy(logits, tokens_out):
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens_out).mean()


def lr_schedule(lr: float, warmup: int, steps: int, min_fraction: float):
    warmup = max(0, min(warmup, steps - 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else lr, peak_value=lr, warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1), end_value=lr * min_fraction,
    )


def _resolve_dtype(name: str):
    if name == "auto":
        return jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


@dataclasses.dataclass
class Experiment:
    """Everything a run needs, built from the resolved flags by :func:`build_experiment`."""

    hp: dict  # resolved flags that define the run (CONFIG_KEYS)
    cfg: GPTConfig
    model: GPT
    tx: optax.GradientTransformation
    recipe: dict
    sparse_paths: list
    switch_step: Optional[int]  # srste: first dense fine-tune step
    teacher_model: Optional[GPT] = None  # ast: the dense teacher (its params are not in the state)

    def sparse_at(self, step: int, phase: int) -> Optional[bool]:
        """The model's ``sparse`` flag for optimizer step ``step`` (host side, a Python value).

        ``phase`` is the STEP optimizer phase after ``step`` updates (ignored by other recipes).
        The flag is a Python constant, so each phase runs its own program with no ``lax.cond``
        on a traced flag (measured on an H100: such a cond costs ~10% of a GPT-2 train step).
        """
        if self.cfg.method == "dense":
            return None
        if self.recipe.get("finetune"):
            return int(step) < self.switch_step
        if self.recipe.get("step"):
            return bool(phase)
        return True

    def needs_phase(self) -> bool:
        return bool(self.recipe.get("step"))

    def starts_finetune(self, step: int) -> bool:
        """Whether :func:`start_finetune` runs on the state after ``step`` updates: the first dense
        step of the fine-tune (``step == switch_step``) with ``--finetune-start`` other than
        ``weights``, and only after a sparse phase and before the last step (``0 < switch_step <
        steps``). The operation is idempotent, so a run resumed from the checkpoint of
        ``switch_step`` (written after it) may run it again and stays bit-exact."""
        s = self.switch_step
        return (self.hp.get("finetune_start", "weights") != "weights" and s is not None
                and 0 < s < self.hp["steps"] and int(step) == s)


def build_experiment(hp: dict) -> Experiment:
    recipe = RECIPES[hp["recipe"]]
    size = {k: v for k, v in SIZES[hp["size"]].items() if k not in ("ffn", "tie_head")}  # from hp below
    size["block_size"] = hp["seq_len"]
    for k in ("n_layer", "n_head", "n_embd"):
        size[k] = hp[k]
    if hp.get("vocab_size"):  # benchmarks: a real vocabulary's embedding and head (default: the data's 256)
        size["vocab_size"] = hp["vocab_size"]
    cfg = GPTConfig(
        **size, ffn=hp["ffn"], tie_head=not hp["untied_head"], method=recipe["method"],
        mvue=recipe["mvue"], transposable=recipe.get("transposable", True),
        mask_every=hp["mask_every"], sparse_attn=hp["sparse_attn"], dtype=_resolve_dtype(hp["dtype"]),
        attention=hp.get("attention", "xla"), linear=recipe.get("linear", "sparse24"),
        slorb_group=hp.get("slorb_group", 64), backend=hp.get("sparse_backend", "auto"),
        fp8=bool(hp.get("fp8", False)), fp8_scaling=hp.get("fp8_scaling", "current"),
        fp8_dense=hp.get("fp8_dense", "sparse24"),
        # (a config without "layers" is from before the scanned stack: unrolled blocks)
        layers=hp.get("layers", "unroll"), remat=hp.get("remat", "none"),
    )
    steps = hp["steps"]
    sched = lr_schedule(hp["lr"], hp["warmup"], steps, hp["min_lr_fraction"])
    paths = sparse_layer_paths(cfg)
    sparse_set = {"/".join(p) for p in paths}

    def where_sparse(path: str, leaf) -> bool:
        return path.endswith("/kernel") and path.rsplit("/", 1)[0] in sparse_set

    def wd_mask(params):
        # weight decay on kernels and embeddings (rank >= 2 per layer), not on biases and norm scales;
        # a scanned stack's leaves carry one more (layer) axis
        def decays(path, p):
            stacked = cfg.layers == "scan" and getattr(path[0], "key", None) == STACK
            return p.ndim - int(stacked) >= 2

        return jax.tree_util.tree_map_with_path(decays, params)

    switch_step = None
    chain = [optax.clip_by_global_norm(hp["grad_clip"])] if hp["grad_clip"] > 0 else []
    if recipe.get("finetune"):
        switch_step = steps - int(round(steps * hp["finetune_fraction"]))
    if recipe.get("masked_decay"):
        chain.append(s24optim.masked_decay(hp["decay_alpha"], active_until=switch_step))
    teacher_model = None
    if recipe.get("ast"):
        # SR-STE decay of the pruned weights of the 2:4 kernels only (not the head, embeddings or
        # dense attention), ramped linearly over the first half as in AST; masks from |W|, the
        # same 2:4 magnitude masks the layers compute.
        ramp = max(steps // 2, 1)
        alpha = hp["decay_alpha"]
        chain.append(s24optim.masked_decay(lambda c: alpha * jnp.minimum(c / ramp, 1.0), where=where_sparse))
        teacher_model = GPT(dataclasses.replace(cfg, method="dense", linear="sparse24"))
    if recipe.get("step"):
        chain.append(s24optim.adamw_step(
            sched, b1=hp["b1"], b2=hp["b2"], eps=1e-8, weight_decay=hp["weight_decay"],
            clipping=(steps // 10, steps // 2), where=where_sparse,
            # v frozen for the 2:4 kernels only: freezing every v (embeddings, norms, dense
            # attention) diverged on GPT-2 when their gradients outgrew it
            freeze="sparse", mask=wd_mask,  # no decay of biases, norms (as the adamw recipes)
        ))
    else:
        chain.append(optax.adamw(sched, b1=hp["b1"], b2=hp["b2"], eps=1e-8,
                                 weight_decay=hp["weight_decay"], mask=wd_mask))
    if recipe.get("lr_scale") and hp["sparse_lr_scale"] != 1:
        # the 2:4 kernels' learning rate x --sparse-lr-scale (default_sparse_lr_scale) while the model
        # runs sparse (srste: until the dense fine-tune); see jax_sparse24.optim.sparse_lr_scale
        chain.append(s24optim.sparse_lr_scale(hp["sparse_lr_scale"], where=where_sparse, active_until=switch_step))
    tx = optax.chain(*chain)
    return Experiment(hp=hp, cfg=cfg, model=GPT(cfg), tx=tx, recipe=recipe, sparse_paths=paths,
                      switch_step=switch_step, teacher_model=teacher_model)


def init_state(exp: Experiment, seed: int):
    """``{"step", "params", "sparsity", "opt_state"}`` (a pure function: jit it with shardings), and
    ``"fp8_meta"`` (the delayed-scaling fp8 state) with ``--fp8-scaling delayed``."""
    dummy = jnp.zeros((1, exp.cfg.block_size), jnp.int32)
    variables = exp.model.init(jax.random.key(seed), dummy)
    params = variables["params"]
    sparsity = variables.get(s24masks.SPARSITY, {})
    state = {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "sparsity": dict(sparsity),
        "opt_state": exp.tx.init(params),
    }
    if s24nn.FP8_META in variables:
        state["fp8_meta"] = variables[s24nn.FP8_META]
    return state


def subtree(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def refreshes_masks(exp: Experiment) -> bool:
    """Whether the recipe's layers keep masks that the loop refreshes every ``--mask-every`` steps
    (srste: ``jax_sparse24.masks.refresh_masks`` in ``gpt_runtime.Runtime.run_step``)."""
    return exp.cfg.method == "srste" and bool(exp.sparse_paths)


def measures_flips(exp: Experiment) -> bool:
    """Whether the loop measures the flip rate across an update on logging steps (ste, soft and
    ast: masks recomputed from the kernels every call; ``jax_sparse24.masks.kernel_masks`` before the
    update, ``kernel_flip_rate`` after it, in ``gpt_runtime.Runtime.run_step``)."""
    return exp.cfg.method in ("ste", "soft") and bool(exp.sparse_paths)


def prepares_weights(exp: "Experiment") -> bool:
    """Whether the train step prepares the 2:4 weights once per step (``jax_sparse24.preparation.prepare``:
    masks and compressions of every layer computed together, batched, before the forward/backward,
    and read by every GEMM of the step): ``--prepare-weights always``, or ``on`` with ``--grad-accum``
    > 1 (then once instead of once per micro-batch). Only for 2:4 ``Sparse24Dense`` layers without
    fp8 (``prepare`` skips fp8 layers); phases where the model runs dense (``sparse=False``: STEP's
    first phase, srste's fine-tune) never prepare (:func:`make_train_step`)."""
    how = exp.hp.get("prepare_weights", "on")
    wanted = how == "always" or (how == "on" and int(exp.hp.get("grad_accum", 1)) > 1)
    return (wanted and bool(exp.sparse_paths) and exp.cfg.linear == "sparse24" and exp.cfg.method != "dense"
            and not exp.cfg.fp8)


def make_train_step(exp: Experiment, sparse: Optional[bool], tokens_per_device: Optional[int] = None):
    """``train_step(state, tokens) -> (state, metrics)`` with the model's ``sparse`` flag fixed.

    ``tokens`` is ``(B, T + 1)`` int32 (inputs and shifted targets). For ``ast`` the step is
    ``train_step(state, tokens, teacher_params)``. ``tokens_per_device``: micro-batch tokens per
    ``data`` shard, for planning prepared weights (default: the whole micro-batch).
    """
    seed = exp.hp["seed"]

    accum = int(exp.hp.get("grad_accum", 1))
    prepare = prepares_weights(exp) and sparse is not False

    def train_step(state, tokens, teacher_params=None):
        # The checkpointed dict {"step", "params", "sparsity", "opt_state"} (its layout is what
        # gpt_checkpoints writes and resumes) as a SparseTrainState for this step. The MVUE key
        # base is the run's: step s uses fold_in(key(seed + 1), s), micro-batch j fold_in(., j).
        st = SparseTrainState(step=state["step"], apply_fn=exp.model.apply, params=state["params"], tx=exp.tx,
                              opt_state=state["opt_state"], sparsity=state["sparsity"],
                              rng=jax.random.key(seed + 1) if exp.cfg.mvue else None,
                              flip_rate=jnp.zeros((), jnp.float32), fp8_meta=state.get("fp8_meta"))

        def loss_fn(pm, tokens, st, micro_batch=None):
            # pm: (params, fp8_meta): the delayed-scaling fp8 state, whose gradient is its new value
            # (None without delayed scaling: an empty pytree, so its gradient is None too)
            p, meta = pm
            x, y = tokens[:, :-1], tokens[:, 1:]
            # the Python flag (one program per phase; None: the model's default)
            logits = st.apply(x, params=p, sparse=sparse, micro_batch=micro_batch, fp8_meta=meta)
            ce = cross_entropy(logits, y)
            if exp.teacher_model is None:
                return ce, (ce, jnp.zeros((), jnp.float32))
            teacher = jax.lax.stop_gradient(exp.teacher_model.apply({"params": teacher_params}, x))
            total, aux = s24distill.ast_loss(ce, logits, teacher, alpha=exp.hp["kd_alpha"],
                                             temperature=exp.hp["kd_temperature"])
            return total, (ce, aux["kd"])

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        params = (st.params, st.fp8_meta)
        # Micro-batch j holds rows j, j + accum, ... (the leading axis keeps its data-parallel sharding).
        micro = jnp.swapaxes(tokens.reshape(tokens.shape[0] // accum, accum, -1), 0, 1)
        if prepare:
            # Weight work (masks, compression) once per step, batched across layers, before the
            # forward/backward; every GEMM of the step (of every micro-batch) reads it. XLA keeps
            # only the preparation of this pass (the forward feeds nothing).
            # (s24nn.prepare on the model, what SparseTrainState.prepare does with apply_fn)
            st = st.replace(prepared=s24prep.prepare(exp.model, st.variables(), micro[0][:, :-1], sparse=sparse,
                                                   tokens=tokens_per_device, reuse=accum) or None)
        if accum == 1:
            (_, (loss, kd)), (grads, new_meta) = grad_fn(params, tokens, st)
        else:
            # Gradient accumulation: each micro-batch its own MVUE key; the mean over micro-batches
            # is the gradient of the mean loss of the whole batch. The delayed-scaling state's
            # "gradients" (new values) are combined by maximum, not summed.

            def body(acc, inp):
                j, tok = inp
                (_, aux), (g, m) = grad_fn(params, tok, st, j)
                aux_acc, (g_acc, m_acc) = acc
                return (jax.tree.map(jnp.add, aux_acc, aux),
                        (jax.tree.map(jnp.add, g_acc, g), s24fp8.combine_meta(m_acc, m))), None

            # the max-combine starts from the smallest values
            lowest = jax.tree.map(lambda m: jnp.full_like(m, -jnp.inf), st.fp8_meta)
            zero = ((jnp.zeros((), jnp.float32),) * 2, (jax.tree.map(jnp.zeros_like, st.params), lowest))
            ((loss, kd), (grads, new_meta)), _ = jax.lax.scan(body, zero, (jnp.arange(accum), micro))
            loss, kd, grads = loss / accum, kd / accum, jax.tree.map(lambda g: g / accum, grads)
        if exp.teacher_model is None:
            kd = None
        # masked decay with the srste masks (the recipe's masked_decay stops itself at the fine-tune
        # switch), the update, step + 1. The named scope marks the update's kernels in the compiled
        # program (benchmarks/bench_step_breakdown.py). No conditional in the step (on a GPU the
        # host reads a conditional's predicate, waiting for the device: ~0.5% of a GPT-2 step): the
        # srste mask refresh and the ste/soft flip rate run in programs of their own on the steps
        # that need them (gpt_runtime.Runtime.run_step); "flip" is NaN here and filled in there.
        with jax.named_scope("optimizer"):
            new = st.apply_gradients(grads=grads, fp8_meta=new_meta, refresh=False)
        metrics = {
            "loss": loss,
            "flip": jnp.asarray(jnp.nan, jnp.float32),
            "grad_norm": optax.tree.norm(grads) if hasattr(optax, "tree") else optax.global_norm(grads),
            "sparse": jnp.asarray(bool(sparse)),
        }
        if kd is not None:
            metrics["kd"] = kd
        if exp.needs_phase():
            st_step = s24optim.step_state(new.opt_state)
            metrics["step_z"] = st_step.z_avg
            metrics["phase"] = st_step.phase
        new_state = {"step": new.step, "params": new.params, "sparsity": new.sparsity, "opt_state": new.opt_state}
        if new.fp8_meta is not None:
            new_state["fp8_meta"] = new.fp8_meta
        return new_state, metrics

    return train_step


FINETUNE_STARTS = ("weights", "masked", "masked-reset")


def start_finetune(exp: Experiment, state):
    """The train-state dict at the switch to the dense fine-tune, per ``--finetune-start``:
    ``masked``: the 2:4 kernels pruned to their masks (``SparseTrainState.prune_to_masks``: the dense
    model starts from the function the 2:4 model computed); ``masked-reset``: also their Adam moments
    zeroed at the pruned positions; ``weights``: unchanged (the pruned weights come back as they
    are). A pure function: jit it with the state's shardings."""
    how = exp.hp.get("finetune_start", "weights")
    if how == "weights":
        return state
    st = SparseTrainState(step=state["step"], apply_fn=exp.model.apply, params=state["params"], tx=exp.tx,
                          opt_state=state["opt_state"], sparsity=state["sparsity"])
    st = st.prune_to_masks(reset_moments=how == "masked-reset")
    return dict(state, params=st.params, opt_state=st.opt_state)


def make_eval_step(exp: Experiment, sparse: Optional[bool]):
    """``eval_step(state, tokens) -> loss`` with the model's ``sparse`` flag fixed."""

    def eval_step(state, tokens):
        sparsity = state["sparsity"]
        variables = {"params": state["params"], s24masks.SPARSITY: sparsity} if sparsity else {"params": state["params"]}
        if "fp8_meta" in state:  # delayed fp8 scaling: evaluation reads the state (its update is dropped)
            variables[s24nn.FP8_META] = state["fp8_meta"]
        logits = exp.model.apply(variables, tokens[:, :-1], sparse=sparse)
        return cross_entropy(logits, tokens[:, 1:])

    return eval_step


def step_phase(state) -> int:
    """STEP phase of a train state (host read; syncs)."""
    return int(jax.device_get(s24optim.step_phase(state["opt_state"])))
