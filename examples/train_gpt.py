#!/usr/bin/env python
"""Pre-train a small GPT with every 2:4 sparse-training recipe of jax_sparse24.

First run (CPU, about two minutes, the loss falls from ~5.5 to ~1)::

    python examples/train_gpt.py --size tiny --steps 300 --out runs/tiny

Recipes (``--recipe``; the FFN linears are 2:4, the attention projections too with
``--sparse-attn``):

* ``dense`` — plain ``nn.Dense`` + AdamW (the baseline).
* ``srste`` — transposable SR-STE (Hu et al., ICML'24): transposable 2:4 masks refreshed from the
  weights every ``--mask-every`` optimizer steps, MVUE weight gradient, SR-STE masked decay on the
  pruned weights, and a dense fine-tune for the last ``--finetune-fraction`` (1/6) of the steps.
* ``sste`` — S-STE: soft-thresholded weights ``β·S(w)`` with β frozen at init, MVUE weight grad.
* ``step`` — STEP: ``adamw_step`` trains dense while it preconditions, freezes the second moment
  when it has converged (AutoSwitch clipped to 10%–50% of the steps) and the model then trains
  with hard 2:4 straight-through weights.
* ``ste`` — hard 2:4 magnitude mask of the weights recomputed every step, straight-through
  (torchao-style runtime weight sparsity).
* ``ast`` — AST (Adaptive Sparse Trainer): a 2:4 student distilled from a dense teacher,
  ``--recipe ast --teacher DIR`` where ``DIR`` is the ``--out`` (or its ``ckpt/``) of a
  ``--recipe dense`` run with the same model flags. The sparse linears are
  ``jax_sparse24.distill.Sparse24LowRankDense`` (2:4 mask recomputed from the weight on every
  call, straight-through, plus the SLoRB low-rank term of rank ``in // --slorb-group``); the
  student starts from the teacher's weights (``student_params_from_dense``) and trains on
  ``CE + --kd-alpha · KL(teacher ‖ student)`` (teacher forward under ``stop_gradient`` on the
  same batch) with SR-STE masked decay on the 2:4 kernels (ramped 0 → ``--decay-alpha`` over the
  first half) before AdamW. The train ``loss`` logged is the task cross-entropy; ``kd`` is logged
  beside it.

Outputs in ``--out``: ``metrics.jsonl`` (per-step train loss, lr; eval val loss; the mask flip
rate — srste: at each mask refresh, ste/sste/ast: of the update of every ``--log-every``-th step),
``summary.json``, ``loss.png`` (train/val loss and flip rate), and orbax checkpoints in
``ckpt/`` every ``--ckpt-every`` steps (params, sparsity collection, optimizer state including
the STEP phase, step, config). ``--resume`` continues bit-exactly from the latest checkpoint;
the batch of step ``t`` and the MVUE key of step ``t`` are pure functions of ``(--seed, t)``,
so the data position is the step. A corrupt checkpoint is refused with one line naming the newest
intact one; ``--resume-from STEP`` continues from it (deleting the checkpoints after it). A previous
run's files in ``--out`` (checkpoints, metrics, summary, plot) are never written over without
``--overwrite``. ``--compare dense,srste,...`` trains several recipes into
``--out/<recipe>`` and writes ``compare.png``, ``compare.md`` and ``compare.json``.

``--mesh data=2,model=1`` shards the batch over the ``data`` axis of a device mesh and the
linear layers Megatron-style over ``model`` (column-parallel ``qkv``/``fc``, row-parallel
``proj``); on a CPU try it with ``XLA_FLAGS=--xla_force_host_platform_device_count=2``.

``--grad-accum N`` splits each step's batch into N micro-batches (a ``lax.scan`` inside the step;
gradients averaged, each micro-batch its own MVUE key): the same update with 1/N of the activation
memory. The 2:4 weights are then prepared once per step (``jax_sparse24.nn.prepare``: masks, soft
threshold, compression) and shared by the micro-batches; ``--prepare-weights off`` redoes that work
per micro-batch (same math, for comparison).

``--attention auto`` (default) uses cuDNN's flash attention on a GPU with bfloat16 compute (2.4x
less kernel time per GPT-2 step than XLA's attention on the H100) and XLA's elsewhere; ``cudnn``
requires it, ``xla`` never uses it. It is a kernel choice, not part of the checkpointed config.
So is ``--sparse-backend`` (default ``auto``: each GEMM of a 2:4 layer on CUTLASS, cuSPARSELt or
XLA's dense GEMM, whichever the measured table says is fastest; ``cutlass`` / ``cusparselt`` force
one sparse kernel, ``dense`` the dense GEMM on the masked weight).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
try:
    import jax_sparse24  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(_HERE.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_sparse24 as s24  # noqa: E402
from jax_sparse24 import distill as s24distill  # noqa: E402
from jax_sparse24 import nn as s24nn  # noqa: E402
from jax_sparse24 import optim as s24optim  # noqa: E402

from gpt_model import GPT, GPTConfig, SIZES, attention_implementation, sparse_layer_paths  # noqa: E402

PROG = "train_gpt.py"
DEFAULT_DATA = _HERE / "data" / "corpus.txt"
VAL_FRACTION = 0.1

#: recipe -> Sparse24Dense settings and optimizer extras.
RECIPES: dict[str, dict[str, Any]] = {
    "dense": dict(method="dense", mvue=False),
    "srste": dict(method="srste", mvue=True, transposable=True, masked_decay=True, finetune=True),
    "sste": dict(method="soft", mvue=True),
    "step": dict(method="ste", mvue=False, step=True),
    "ste": dict(method="ste", mvue=False),
    # AST: Sparse24LowRankDense layers (mask recomputed every call, like ste), dense teacher.
    "ast": dict(method="ste", mvue=False, linear="lowrank", ast=True),
}

#: per-size defaults of the training flags (a flag given on the command line wins).
SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(steps=300, batch_size=16, seq_len=64, lr=2e-3, warmup=50, eval_every=25,
                 ckpt_every=100, log_every=5, eval_batches=4),
    "gpt2": dict(steps=5000, batch_size=16, seq_len=1024, lr=6e-4, warmup=200, eval_every=250,
                 ckpt_every=1000, log_every=10, eval_batches=4),
    "gpt2-medium": dict(steps=5000, batch_size=8, seq_len=1024, lr=3e-4, warmup=200,
                        eval_every=250, ckpt_every=1000, log_every=10, eval_batches=4),
    # LLaMA shapes: 8 x 2048 = 16384 tokens per step; every linear layer 2:4 (attention too).
    "llama-tiny": dict(steps=300, batch_size=16, seq_len=64, lr=2e-3, warmup=50, eval_every=25,
                       ckpt_every=100, log_every=5, eval_batches=4, sparse_attn=True),
    "llama-1b": dict(steps=5000, batch_size=8, seq_len=2048, lr=3e-4, warmup=200, eval_every=250,
                     ckpt_every=1000, log_every=10, eval_batches=4, sparse_attn=True),
    "llama-7b": dict(steps=5000, batch_size=8, seq_len=2048, lr=1.5e-4, warmup=200, eval_every=250,
                     ckpt_every=1000, log_every=10, eval_batches=4, sparse_attn=True),
}

#: flags that define the training run; a checkpoint is only resumed by an identical set.
CONFIG_KEYS = (
    "recipe", "size", "steps", "batch_size", "seq_len", "lr", "warmup", "min_lr_fraction",
    "weight_decay", "b1", "b2", "grad_clip", "decay_alpha", "mask_every", "finetune_fraction",
    "ffn", "sparse_attn", "untied_head", "dtype", "seed", "n_layer", "n_head", "n_embd", "grad_accum",
)
#: extra flags that define an ``ast`` run (only in the config of ast checkpoints).
AST_CONFIG_KEYS = ("teacher", "kd_alpha", "kd_temperature", "slorb_group")
#: flags a dense teacher must share with the ast student (they fix the parameter shapes).
TEACHER_MATCH_KEYS = ("size", "n_layer", "n_head", "n_embd", "seq_len", "ffn", "untied_head")


class CLIError(Exception):
    """A bad input: printed as one line, exit code 2, nothing written."""


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------


class ByteData:
    """Byte-level tokens of a text file, split 90/10 into train/val.

    The training batch of step ``t`` is a pure function of ``(seed, t)``: random windows drawn
    with ``numpy.random.default_rng([seed, t])``, so resuming at step ``t`` resumes the data
    stream exactly. Validation uses fixed, evenly spaced windows.
    """

    def __init__(self, path: Path, seq_len: int, batch_size: int, seed: int, eval_batches: int):
        path = Path(path)
        if not path.is_file():
            raise CLIError(f"--data {path}: no such file")
        raw = path.read_bytes()
        need = 10 * (seq_len + 1)
        if not raw:
            raise CLIError(f"--data {path}: the corpus is empty")
        tokens = np.frombuffer(raw, dtype=np.uint8)
        split = int(len(tokens) * (1 - VAL_FRACTION))
        self.train, self.val = tokens[:split], tokens[split:]
        if len(self.val) < seq_len + 1 or len(self.train) < seq_len + 1:
            raise CLIError(
                f"--data {path}: the corpus is too short ({len(raw)} bytes) for --seq-len {seq_len}: "
                f"the 10% validation split needs at least {seq_len + 1} bytes, i.e. a corpus of at "
                f"least {need} bytes"
            )
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.path, self.seq_len, self.batch_size, self.seed = path, seq_len, batch_size, seed
        self._train_win = np.lib.stride_tricks.sliding_window_view(self.train, seq_len + 1)
        val_win = np.lib.stride_tricks.sliding_window_view(self.val, seq_len + 1)
        n = eval_batches * batch_size
        offsets = np.linspace(0, len(val_win) - 1, n).astype(np.int64)
        self.val_batches = [
            val_win[offsets[i * batch_size:(i + 1) * batch_size]].astype(np.int32)
            for i in range(eval_batches)
        ]

    def batch(self, step: int) -> np.ndarray:
        """``(batch, seq_len + 1)`` int32 tokens of training step ``step`` (inputs + targets)."""
        rng = np.random.default_rng([self.seed, int(step)])
        idx = rng.integers(0, len(self._train_win), size=self.batch_size)
        return self._train_win[idx].astype(np.int32)


# ------------------------------------------------------------------------------------------------
# Experiment: model, optimizer, train/eval steps
# ------------------------------------------------------------------------------------------------


def _key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


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


def build_experiment(hp: dict) -> Experiment:
    recipe = RECIPES[hp["recipe"]]
    size = {k: v for k, v in SIZES[hp["size"]].items() if k not in ("ffn", "tie_head")}  # from hp below
    size["block_size"] = hp["seq_len"]
    for k in ("n_layer", "n_head", "n_embd"):
        size[k] = hp[k]
    cfg = GPTConfig(
        **size, ffn=hp["ffn"], tie_head=not hp["untied_head"], method=recipe["method"],
        mvue=recipe["mvue"], transposable=recipe.get("transposable", True),
        mask_every=hp["mask_every"], sparse_attn=hp["sparse_attn"], dtype=_resolve_dtype(hp["dtype"]),
        attention=hp.get("attention", "xla"), linear=recipe.get("linear", "sparse24"),
        slorb_group=hp.get("slorb_group", 64), backend=hp.get("sparse_backend", "auto"),
    )
    steps = hp["steps"]
    sched = lr_schedule(hp["lr"], hp["warmup"], steps, hp["min_lr_fraction"])
    paths = sparse_layer_paths(cfg)
    sparse_set = {"/".join(p) for p in paths}

    def where_sparse(path: str, leaf) -> bool:
        return path.endswith("/kernel") and path.rsplit("/", 1)[0] in sparse_set

    def wd_mask(params):
        return jax.tree.map(lambda p: p.ndim >= 2, params)

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
        ))
    else:
        chain.append(optax.adamw(sched, b1=hp["b1"], b2=hp["b2"], eps=1e-8,
                                 weight_decay=hp["weight_decay"], mask=wd_mask))
    tx = optax.chain(*chain)
    return Experiment(hp=hp, cfg=cfg, model=GPT(cfg), tx=tx, recipe=recipe, sparse_paths=paths,
                      switch_step=switch_step, teacher_model=teacher_model)


def init_state(exp: Experiment, seed: int):
    """``{"step", "params", "sparsity", "opt_state"}`` (a pure function: jit it with shardings)."""
    dummy = jnp.zeros((1, exp.cfg.block_size), jnp.int32)
    variables = exp.model.init(jax.random.key(seed), dummy)
    params = variables["params"]
    sparsity = variables.get(s24nn.SPARSITY, {})
    return {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "sparsity": dict(sparsity),
        "opt_state": exp.tx.init(params),
    }


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _sparse_kernels(exp: Experiment, params) -> list:
    return [_get(params, path)["kernel"] for path in exp.sparse_paths]


def _mask_flip_rate(old_kernels, new_kernels):
    """Flip rate of the 2:4 magnitude masks of the sparse kernels across one update."""
    flips, total = jnp.zeros((), jnp.float32), 0
    for old, new in zip(old_kernels, new_kernels):
        flips = flips + jnp.sum(s24.mask24(old, axis=0) != s24.mask24(new, axis=0), dtype=jnp.float32)
        total += old.size
    return flips / max(total, 1)


def kernel_plan(rt: "Runtime") -> dict:
    """``{"IxO": jax_sparse24.linear_plan(...)}`` per distinct sparse layer shape: which kernel each
    GEMM of the layer runs. ``backend="auto"`` decides on the per-device shapes, so they come from
    the runtime's shardings (tokens of one micro-batch on a ``data`` shard, the kernel's local
    block). Empty for dense models and for ``ast`` (its layers are not ``sparse24_linear``)."""
    exp = rt.exp
    if not exp.sparse_paths or exp.cfg.linear != "sparse24":
        return {}
    hp, cfg = exp.hp, exp.cfg
    tokens = micro_tokens_per_device(rt)
    reuse = int(hp.get("grad_accum", 1)) if prepares_weights(exp) else None
    params, shardings = rt.abstract_state["params"], rt.state_shardings["params"]
    plan = {}
    for path in exp.sparse_paths:
        kernel = _get(params, path)["kernel"]
        i, o = _get(shardings, path)["kernel"].shard_shape(kernel.shape)
        plan.setdefault("x".join(map(str, kernel.shape)), s24.linear_plan(
            tokens, i, o, cfg.dtype, backend=cfg.backend, transposable=cfg.transposable and cfg.method == "srste",
            mvue=cfg.mvue, reuse=reuse))
    return plan


def micro_tokens_per_device(rt: "Runtime") -> int:
    """Tokens of one micro-batch on one ``data`` shard (what ``backend="auto"`` plans for)."""
    hp = rt.exp.hp
    rows = rt.data_sharding.shard_shape((hp["batch_size"], hp["seq_len"] + 1))[0]
    return max(1, rows // hp.get("grad_accum", 1)) * hp["seq_len"]


def prepares_weights(exp: "Experiment") -> bool:
    """Whether the train step prepares the sparse weights once per step (``--grad-accum`` > 1 with
    ``--prepare-weights on``, 2:4 ``Sparse24Dense`` layers): masks and compressions are then
    computed once instead of once per micro-batch (``jax_sparse24.nn.prepare``)."""
    return (int(exp.hp.get("grad_accum", 1)) > 1 and exp.hp.get("prepare_weights", "on") == "on"
            and bool(exp.sparse_paths) and exp.cfg.linear == "sparse24" and exp.cfg.method != "dense")


def format_plan(plan: dict) -> str:
    """One line of :func:`kernel_plan`: ``IxO: fwd K, dx K, dW K; ...``."""
    return "; ".join(f"{k}: fwd {p['forward']}, dx {p['input_grad']}, dW {p['weight_grad']}" for k, p in plan.items())


def make_train_step(exp: Experiment, sparse: Optional[bool], tokens_per_device: Optional[int] = None):
    """``train_step(state, tokens) -> (state, metrics)`` with the model's ``sparse`` flag fixed.

    ``tokens`` is ``(B, T + 1)`` int32 (inputs and shifted targets). For ``ast`` the step is
    ``train_step(state, tokens, teacher_params)``. ``tokens_per_device``: micro-batch tokens per
    ``data`` shard, for planning prepared weights (default: the whole micro-batch).
    """
    seed = exp.hp["seed"]
    method = exp.cfg.method

    accum = int(exp.hp.get("grad_accum", 1))
    prepare = prepares_weights(exp) and sparse is not False

    def train_step(state, tokens, teacher_params=None):
        step, params, sparsity, opt_state = state["step"], state["params"], state["sparsity"], state["opt_state"]
        mvue_key = jax.random.fold_in(jax.random.key(seed + 1), step) if exp.cfg.mvue else None

        def loss_fn(p, tokens, key, prepared=None):
            x, y = tokens[:, :-1], tokens[:, 1:]
            rngs = {} if key is None else {"mvue": key}
            variables = {"params": p, s24nn.SPARSITY: sparsity} if sparsity else {"params": p}
            if prepared:
                variables[s24nn.PREPARED] = prepared
            logits = exp.model.apply(variables, x, sparse=sparse, rngs=rngs)
            ce = cross_entropy(logits, y)
            if exp.teacher_model is None:
                return ce, (ce, jnp.zeros((), jnp.float32))
            teacher = jax.lax.stop_gradient(exp.teacher_model.apply({"params": teacher_params}, x))
            total, aux = s24distill.ast_loss(ce, logits, teacher, alpha=exp.hp["kd_alpha"],
                                             temperature=exp.hp["kd_temperature"])
            return total, (ce, aux["kd"])

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if accum == 1:
            (_, (loss, kd)), grads = grad_fn(params, tokens, mvue_key)
        else:
            # Gradient accumulation: micro-batch j holds rows j, j + accum, ... (the leading axis
            # keeps its data-parallel sharding), its own MVUE key; the mean over micro-batches is
            # the gradient of the mean loss of the whole batch.
            micro = jnp.swapaxes(tokens.reshape(tokens.shape[0] // accum, accum, -1), 0, 1)
            prepared = None
            if prepare:
                # Weight work (masks, compression) once per step, not per micro-batch: XLA keeps
                # only the preparation of this pass (the forward feeds nothing).
                variables = {"params": params, s24nn.SPARSITY: sparsity} if sparsity else {"params": params}
                prepared = s24nn.prepare(exp.model, variables, micro[0][:, :-1], sparse=sparse,
                                         tokens=tokens_per_device, reuse=accum)

            def body(acc, inp):
                j, tok = inp
                key = None if mvue_key is None else jax.random.fold_in(mvue_key, j)
                (_, aux), g = grad_fn(params, tok, key, prepared)
                return jax.tree.map(jnp.add, acc, (aux, g)), None

            zero = ((jnp.zeros((), jnp.float32),) * 2, jax.tree.map(jnp.zeros_like, params))
            ((loss, kd), grads), _ = jax.lax.scan(body, zero, (jnp.arange(accum), micro))
            loss, kd, grads = loss / accum, kd / accum, jax.tree.map(lambda g: g / accum, grads)
        if exp.teacher_model is None:
            kd = None
        extra = {}
        if exp.recipe.get("masked_decay"):
            extra["masks"] = s24nn.masks_for_params(params, sparsity)
        updates, opt_state = exp.tx.update(grads, opt_state, params, **extra)
        new_params = optax.apply_updates(params, updates)
        if method == "srste":
            # Once per optimizer step: layers refresh when (updates applied) % mask_every == 0.
            sparsity, flip = s24nn.refresh_masks(new_params, sparsity, step=step + 1)
            flip = jnp.where((step + 1) % exp.cfg.mask_every == 0, flip, jnp.nan)
        elif method in ("ste", "soft"):
            # Measured on logging steps only (one cond for the model; only the sparse kernels are its
            # operands): two magnitude masks of every sparse weight per step cost ~2% of a
            # GPT-2-medium step on the H100 (profile_step: ste kernel time 43.9 -> 43.0 ms).
            every = exp.hp.get("flip_every", 1)
            flip = jax.lax.cond((step + 1) % every == 0, _mask_flip_rate,
                                lambda p, q: jnp.asarray(jnp.nan, jnp.float32),
                                _sparse_kernels(exp, params), _sparse_kernels(exp, new_params))
        else:
            flip = jnp.asarray(jnp.nan, jnp.float32)
        metrics = {
            "loss": loss,
            "flip": flip.astype(jnp.float32),
            "grad_norm": optax.tree.norm(grads) if hasattr(optax, "tree") else optax.global_norm(grads),
            "sparse": jnp.asarray(bool(sparse)),
        }
        if kd is not None:
            metrics["kd"] = kd
        if exp.needs_phase():
            st = _step_state(opt_state)
            metrics["step_z"] = st.z_avg
            metrics["phase"] = st.phase
        new_state = {"step": step + 1, "params": new_params, "sparsity": sparsity, "opt_state": opt_state}
        return new_state, metrics

    return train_step


def _step_state(opt_state) -> s24optim.AdamWStepState:
    is_step = lambda x: isinstance(x, s24optim.AdamWStepState)  # noqa: E731
    (found,) = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=is_step) if is_step(x)]
    return found


def make_eval_step(exp: Experiment, sparse: Optional[bool]):
    """``eval_step(state, tokens) -> loss`` with the model's ``sparse`` flag fixed."""

    def eval_step(state, tokens):
        sparsity = state["sparsity"]
        variables = {"params": state["params"], s24nn.SPARSITY: sparsity} if sparsity else {"params": state["params"]}
        logits = exp.model.apply(variables, tokens[:, :-1], sparse=sparse)
        return cross_entropy(logits, tokens[:, 1:])

    return eval_step


def step_phase(state) -> int:
    """STEP phase of a train state (host read; syncs)."""
    return int(jax.device_get(s24optim.step_phase(state["opt_state"])))


# ------------------------------------------------------------------------------------------------
# Mesh / sharding
# ------------------------------------------------------------------------------------------------


def parse_mesh(spec: Optional[str]):
    """``"data=2,model=1"`` -> a ``jax.sharding.Mesh`` over all devices (or None)."""
    if spec is None:
        return None
    sizes = {"data": 1, "model": 1}
    try:
        for part in spec.split(","):
            name, val = part.split("=")
            name = name.strip()
            if name not in sizes:
                raise ValueError(f"unknown axis {name!r}")
            sizes[name] = int(val)
            if sizes[name] < 1:
                raise ValueError("sizes must be >= 1")
    except ValueError as e:
        raise CLIError(f"--mesh {spec!r}: expected e.g. 'data=2,model=1' ({e})") from None
    n = sizes["data"] * sizes["model"]
    have = jax.device_count()
    if n != have:
        hint = (" (on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before starting)"
                if jax.default_backend() == "cpu" else "")
        raise CLIError(f"--mesh {spec}: the mesh has {n} devices but {have} are available{hint}")
    return _make_mesh((sizes["data"], sizes["model"]))


def single_device_mesh():
    return _make_mesh((1, 1), devices=jax.devices()[:1])


def _make_mesh(shape, devices=None):
    names = ("data", "model")
    kw = {} if devices is None else {"devices": devices}
    try:
        from jax.sharding import AxisType

        return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * 2, **kw)
    except (ImportError, TypeError):  # older jax: Auto is the only kind
        return jax.make_mesh(shape, names, **kw)


def _leaf_spec(path, leaf, model: int) -> P:
    """Megatron placement of one state leaf: qkv/fc column-parallel, proj row-parallel."""
    shape = getattr(leaf, "shape", ())
    if model == 1 or len(shape) == 0:
        return P()
    keys = [_key_str(k) for k in path]
    col = row = False
    for a, b in zip(keys, keys[1:]):
        if a in ("attn", "mlp"):
            col |= b in ("qkv", "fc")
            row |= b == "proj"
    if col and len(shape) == 2 and shape[1] % (4 * model) == 0:
        return P(None, "model")
    if col and len(shape) == 1 and shape[0] % model == 0:
        return P("model")
    if row and len(shape) == 2 and shape[0] % (4 * model) == 0:
        return P("model", None)
    return P()


def state_shardings(mesh, abstract_state):
    model = mesh.shape["model"]
    return jax.tree_util.tree_map_with_path(
        lambda p, x: NamedSharding(mesh, _leaf_spec(p, x, model)), abstract_state
    )


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------


@jax.jit
def _fingerprint(tree):
    """Per-leaf uint32 hash of the exact bits (detects corrupt checkpoint data)."""

    def one(x):
        x = jnp.asarray(x)
        if x.dtype == jnp.bool_:
            u = x.astype(jnp.uint32)
        elif jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            u = jax.random.key_data(x).astype(jnp.uint32)
        else:
            bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
            u = jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32)
        u = u.reshape(-1)
        i = jnp.arange(u.size, dtype=jnp.uint32)
        return jnp.sum((u ^ (i * jnp.uint32(2654435761))) * (i | jnp.uint32(1)), dtype=jnp.uint32) ^ jnp.uint32(u.size)

    return [one(x) for x in jax.tree.leaves(tree)]


def _quiet_orbax():
    for name in ("absl", "orbax", "orbax.checkpoint"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    warnings.filterwarnings("ignore", module=r"orbax(\.|$)")
    _ignore_orbax_teardown_errors()
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _OrbaxAsyncioFilter) for f in asyncio_log.filters):
        asyncio_log.addFilter(_OrbaxAsyncioFilter())


def _raised_in_orbax(exc) -> bool:
    """Raised by orbax's checkpoint reads: an orbax or TensorStore frame in the traceback, or (a read
    that TensorStore failed from its own threads, with no Python frames: seen in CI) TensorStore's
    message about the checkpoint's OCDBT database."""
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        if any(s in tb.tb_frame.f_code.co_filename for s in ("orbax", "tensorstore")):
            return True
        tb = tb.tb_next
    return exc is not None and "OCDBT database" in str(exc)


class _OrbaxAsyncioFilter(logging.Filter):
    """Drops asyncio's "exception was never retrieved" reports of orbax's abandoned reads (a failed
    restore has already been reported as one line); anything else asyncio logs passes."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        return not ("never retrieved" in record.getMessage() and _raised_in_orbax(exc))


def _is_orbax_teardown_error(unraisable) -> bool:
    """An exception orbax leaves behind after a failed restore: the reads still in flight when its
    event loop closed finish later (``RuntimeError: Event loop is closed`` from
    ``call_soon_threadsafe``), and its abandoned read coroutines raise when they are collected."""
    exc, obj = unraisable.exc_value, unraisable.object
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is None or "asyncio" in tb.tb_frame.f_code.co_filename
    code = getattr(obj, "cr_code", None)
    return code is not None and "orbax" in code.co_filename


def _ignore_orbax_teardown_errors():
    """Drop (only) those leftovers from ``sys.unraisablehook``: after the one-line error for a corrupt
    checkpoint they printed dozens of tracebacks that looked like a crash. Installed once; every
    other unraisable exception goes to the previous hook."""
    prev = sys.unraisablehook
    if getattr(prev, "_train_gpt_filter", False):
        return

    def hook(unraisable):
        if not _is_orbax_teardown_error(unraisable):
            prev(unraisable)

    hook._train_gpt_filter = True
    sys.unraisablehook = hook


class Checkpoints:
    """Orbax checkpoints of the train state + a JSON ``meta`` (config, fingerprints, history)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory).resolve()

    def steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.dir.iterdir() if p.is_dir() and p.name.isdigit())

    def _manager(self, read_only: bool):
        import orbax.checkpoint as ocp

        _quiet_orbax()
        opts = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=False,
                                            read_only=read_only, create=not read_only)
        return ocp.CheckpointManager(self.dir, options=opts)

    def read_meta(self, step: int) -> dict:
        import orbax.checkpoint as ocp

        meta_file = self.dir / str(step) / "meta"
        if not meta_file.exists():
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt or incomplete: no 'meta' item")
        try:
            meta = self._restore(step, ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt or unreadable: {_short(e)}") from None
        if not isinstance(meta, dict) or "config" not in meta or "fingerprint" not in meta:
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt: its meta has no config/fingerprint")
        return meta

    def _restore(self, step: int, args):
        """One orbax restore; the manager is closed however it ends, and a failed restore's
        abandoned reads are collected here (their leftovers are dropped, see _quiet_orbax)."""
        mngr = self._manager(read_only=True)
        try:
            return mngr.restore(step, args=args)
        except BaseException:
            gc.collect()
            raise
        finally:
            mngr.close()

    def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
        import orbax.checkpoint as ocp

        meta = self.read_meta(step)
        try:
            state = self._restore(step, ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))).state
        except Exception as e:  # noqa: BLE001
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt or unreadable: {_short(e)}") from None
        got = [int(v) for v in jax.device_get(_fingerprint(state))]
        if got != list(meta["fingerprint"]):
            bad = sum(a != b for a, b in zip(got, meta["fingerprint"]))
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt: {bad} arrays do not match "
                           "the fingerprints stored when it was written")
        return state, meta

    def newest_intact(self, below: int, abstract_state, config: dict) -> Optional[int]:
        """The newest checkpoint before step ``below`` that restores, matches its fingerprints and
        was written by ``config`` (None if there is none)."""
        for step in reversed([s for s in self.steps() if s < below]):
            try:
                check_config(self.read_meta(step)["config"], config, self.dir)
                self.restore(step, abstract_state)
            except CLIError:
                continue
            return step
        return None

    def with_intact_hint(self, err: CLIError, bad: int, abstract_state, config: dict) -> CLIError:
        """``err`` (checkpoint ``bad`` is corrupt) plus which older checkpoint can be resumed instead."""
        good = self.newest_intact(bad, abstract_state, config)
        if good is None:
            older = [s for s in self.steps() if s < bad]
            return CLIError(f"{err}; no older checkpoint is intact ({'steps ' + str(older) if older else 'there are none'}): "
                            "start over with --overwrite")
        return CLIError(f"{err}; the newest intact checkpoint is step {good}: continue from it with "
                        f"--resume-from {good} (this discards the checkpoints after it)")

    def discard_after(self, step: int) -> list[int]:
        """Delete the checkpoints after ``step`` (a resume from an older one rewrites them)."""
        later = [s for s in self.steps() if s > step]
        for s in later:
            shutil.rmtree(self.dir / str(s))
        return later

    def save(self, step: int, state, meta: dict) -> None:
        import orbax.checkpoint as ocp

        meta = dict(meta, fingerprint=[int(v) for v in jax.device_get(_fingerprint(state))])
        mngr = self._manager(read_only=False)
        if step in mngr.all_steps():
            return
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 meta=ocp.args.JsonSave(meta)))
        mngr.wait_until_finished()
        mngr.close()


def _short(e: Exception, n: int = 300) -> str:
    text = str(e).split(" See full TensorStore details")[0]  # orbax appends a page of spec
    if e.__cause__ is not None:  # e.g. tensorstore's OUT_OF_RANGE under orbax's generic Exception
        text += f" ({type(e.__cause__).__name__}: {e.__cause__})"
    s = f"{type(e).__name__}: {text}".replace("\n", " ")
    return s if len(s) <= n else s[:n] + "..."


#: flags added after checkpoints were first written: a checkpoint without one ran with this value.
CONFIG_DEFAULTS = {"grad_accum": 1}


def check_config(saved: dict, now: dict, where: Path) -> None:
    saved = {**CONFIG_DEFAULTS, **saved}
    diffs = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    if diffs:
        parts = ", ".join(f"{k}={saved.get(k)!r} in the checkpoint but {now.get(k)!r} now" for k in diffs[:6])
        raise CLIError(
            f"the checkpoint in {where} was written by a different configuration ({parts}); "
            "resume with the same flags, or start a fresh run in another --out"
        )


# ------------------------------------------------------------------------------------------------
# Progress, history, plots
# ------------------------------------------------------------------------------------------------


class Progress:
    """tqdm when installed, else one carriage-return line (a plain line per update off a tty)."""

    def __init__(self, total: int, initial: int, desc: str, quiet: bool = False):
        self.total, self.quiet, self.desc = total, quiet, desc
        self._bar = None
        self._tty = sys.stderr.isatty()
        if quiet:
            return
        try:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
        except ImportError:
            pass
        self.n = initial

    def update(self, n: int, **fields) -> None:
        if self.quiet:
            return
        self.n = n
        text = "  ".join(f"{k} {v}" for k, v in fields.items())
        if self._bar is not None:
            self._bar.update(n - self._bar.n)
            self._bar.set_postfix_str(text, refresh=True)
            return
        width = 24
        done = int(width * n / max(self.total, 1))
        line = f"{self.desc} [{'#' * done}{'.' * (width - done)}] {n}/{self.total}  {text}"
        if self._tty:
            sys.stderr.write("\r" + line + "\033[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _fmt(v, spec=".3f"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def _nan_to_none(x):
    x = float(x)
    return None if math.isnan(x) else x


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        print(f"{PROG}: matplotlib is not installed; skipping the plot "
              "(pip install 'jax_sparse24[examples]')", file=sys.stderr)
        return None


def _series(history: list[dict], key: str):
    xs, ys = [], []
    for r in history:
        if r.get(key) is not None:
            xs.append(r["step"])
            ys.append(r[key])
    return np.asarray(xs), np.asarray(ys, dtype=float)


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    if len(y) < 2 * k or k <= 1:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = (c[k:] - c[:-k]) / k
    return np.concatenate([y[: k - 1], out])


def plot_run(history: list[dict], path: Path, title: str, phase_step: Optional[int] = None,
             phase_label: str = "", flip_label: str = "mask flip rate") -> None:
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs, ys = _series(history, "loss")
    if len(xs):
        ax1.plot(xs, ys, color="tab:blue", alpha=0.25, lw=0.8)
        ax1.plot(xs, _smooth(ys, max(1, len(ys) // 50)), color="tab:blue", lw=1.5, label="train")
    vx, vy = _series(history, "val_loss")
    if len(vx):
        ax1.plot(vx, vy, "o-", color="tab:orange", ms=3, lw=1.5, label="val")
    if phase_step is not None:
        for ax in (ax1, ax2):
            ax.axvline(phase_step, color="gray", ls="--", lw=1)
        ax1.text(phase_step, ax1.get_ylim()[1], f" {phase_label}", va="top", fontsize=8, color="gray")
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy (nats/byte)")
    ax1.set_title(f"{title}: loss")
    ax1.grid(alpha=0.3)
    ax1.legend()
    fx, fy = _series(history, "flip")
    if len(fx):
        ax2.plot(fx, fy, ".-" if len(fx) < 60 else "-", color="tab:green", lw=1, ms=4)
        if (fy > 0).any():
            ax2.set_yscale("log")
    else:
        ax2.text(0.5, 0.5, "no 2:4 masks (dense)", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("step")
    ax2.set_ylabel(flip_label)
    ax2.set_title(f"{title}: flip rate")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_compare(runs: dict[str, list[dict]], path: Path, title: str) -> None:
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, history) in enumerate(runs.items()):
        color = f"C{i}"
        xs, ys = _series(history, "loss")
        if len(xs):
            ax1.plot(xs, _smooth(ys, max(1, len(ys) // 50)), color=color, alpha=0.35, lw=1)
        vx, vy = _series(history, "val_loss")
        if len(vx):
            ax1.plot(vx, vy, "o-", color=color, ms=3, lw=1.5, label=f"{name} (val)")
        fx, fy = _series(history, "flip")
        if len(fx):
            ax2.plot(fx, fy, "-", color=color, lw=1, label=name)
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy (nats/byte)")
    ax1.set_title(f"{title}: train (faint) / val loss")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("step")
    ax2.set_ylabel("mask flip rate")
    ax2.set_title("mask flip rate\n(srste: per mask refresh; others: per update, on logging steps)", fontsize=10)
    if ax2.lines:
        ax2.set_yscale("log")
        ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# One training run
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
        ffn=args.ffn or SIZES[args.size].get("ffn", "gelu"),
        sparse_attn=defaults.get("sparse_attn", False) if args.sparse_attn is None else args.sparse_attn,
        untied_head=args.untied_head or not SIZES[args.size].get("tie_head", True),
        dtype=args.dtype, seed=args.seed,
        attention=args.attention,  # not in CONFIG_KEYS: a kernel choice, the model is the same
        sparse_backend=args.sparse_backend,  # not in CONFIG_KEYS: a kernel choice, same math
        prepare_weights=args.prepare_weights,  # not in CONFIG_KEYS: same math, done once per step
        grad_accum=args.grad_accum,
        flip_every=_every(args, "log_every"),  # ste/soft flip rate: on logging steps (not in CONFIG_KEYS)
    )
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
    if hp["mask_every"] < 1:
        raise CLIError(f"--mask-every must be >= 1, got {hp['mask_every']}")
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


def _every(args, name):
    v = getattr(args, name)
    return SIZE_DEFAULTS[args.size][name] if v is None else v


class Runtime:
    """Jitted init/train/eval of an experiment over a mesh (see :func:`make_runtime`).

    ``train_step(sparse)`` / ``eval_step(sparse)`` return the jitted program for a (static)
    ``sparse`` flag, built on first use.
    """

    def __init__(self, exp: Experiment, mesh=None, teacher_params=None):
        if mesh is None:
            mesh = single_device_mesh()
        self.exp, self.mesh = exp, mesh
        self.teacher = self.teacher_shardings = None
        if exp.teacher_model is not None:
            if teacher_params is None:
                raise ValueError("the ast recipe needs the teacher's params (make_runtime(..., teacher_params=))")
            model = mesh.shape["model"]
            self.teacher_shardings = jax.tree_util.tree_map_with_path(
                lambda p, x: NamedSharding(mesh, _leaf_spec(p, x, model)), teacher_params)
            self.teacher = jax.device_put(teacher_params, self.teacher_shardings)
        init_fn = lambda: init_state(exp, exp.hp["seed"])  # noqa: E731
        self.abstract_state = jax.eval_shape(init_fn)
        self.state_shardings = state_shardings(mesh, self.abstract_state)
        self.data_sharding = NamedSharding(mesh, P("data", None))
        self._repl = NamedSharding(mesh, P())
        self._donate = () if jax.default_backend() == "cpu" else (0,)
        self.init = jax.jit(init_fn, out_shardings=self.state_shardings)
        self._train: dict = {}
        self._eval: dict = {}

    def put(self, tokens):
        return jax.device_put(tokens, self.data_sharding)

    def train_step(self, sparse: Optional[bool]):
        if sparse not in self._train:
            if self.teacher is None:
                self._train[sparse] = jax.jit(
                    make_train_step(self.exp, sparse, micro_tokens_per_device(self)), in_shardings=(self.state_shardings, self.data_sharding),
                    out_shardings=(self.state_shardings, self._repl), donate_argnums=self._donate)
            else:
                step = jax.jit(
                    make_train_step(self.exp, sparse),
                    in_shardings=(self.state_shardings, self.data_sharding, self.teacher_shardings),
                    out_shardings=(self.state_shardings, self._repl), donate_argnums=self._donate)
                self._train[sparse] = lambda state, tokens: step(state, tokens, self.teacher)
        return self._train[sparse]

    def init_from_teacher(self, state):
        """ast: the student's params copied from the teacher (SLoRB ``lora_b`` from the pruned
        weights) and a fresh optimizer state for them."""
        exp = self.exp

        def fn(st, teacher):
            params = s24distill.student_params_from_dense(st["params"], teacher)
            return dict(st, params=params, opt_state=exp.tx.init(params))

        return jax.jit(fn, in_shardings=(self.state_shardings, self.teacher_shardings),
                       out_shardings=self.state_shardings)(state, self.teacher)

    def eval_step(self, sparse: Optional[bool]):
        if sparse not in self._eval:
            self._eval[sparse] = jax.jit(
                make_eval_step(self.exp, sparse), in_shardings=(self.state_shardings, self.data_sharding),
                out_shardings=self._repl)
        return self._eval[sparse]

    def abstract_args(self):
        """``(state, tokens)`` as ``ShapeDtypeStruct`` with shardings, e.g. for ``.lower()``."""
        st = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          self.abstract_state, self.state_shardings)
        hp = self.exp.hp
        tok = jax.ShapeDtypeStruct((hp["batch_size"], hp["seq_len"] + 1), jnp.int32, sharding=self.data_sharding)
        return st, tok


def make_runtime(exp: Experiment, mesh=None, teacher_params=None) -> Runtime:
    """Jit init/train/eval with explicit shardings over ``mesh`` (default: a 1x1 mesh of device 0).

    The single-device case uses the same code path as a real mesh, so a resumed run (whose
    restored arrays carry these shardings) runs exactly the programs of a fresh run.
    """
    return Runtime(exp, mesh, teacher_params)


def run_config(hp: dict, data_sha256: str) -> dict:
    """The flags stored in (and compared against) a run's checkpoints."""
    keys = CONFIG_KEYS + (AST_CONFIG_KEYS if RECIPES[hp["recipe"]].get("ast") else ())
    config = {k: hp[k] for k in keys}
    config["data_sha256"] = data_sha256
    return config


def check_teacher(hp: dict) -> tuple["Checkpoints", int, dict]:
    """Validates ``--teacher`` for an ast run: ``(checkpoints, latest step, meta)``.

    The teacher must be a ``--recipe dense`` checkpoint of this script whose model flags
    (:data:`TEACHER_MATCH_KEYS`) equal the student's; anything else is a :class:`CLIError`.
    """
    path = Path(hp["teacher"])
    if not path.is_dir():
        raise CLIError(f"--teacher {path}: no such directory")
    ck = Checkpoints(path / "ckpt" if (path / "ckpt").is_dir() else path)
    steps = ck.steps()
    if not steps:
        raise CLIError(f"--teacher {path}: no checkpoint found (give the --out directory of a "
                       "`--recipe dense` run of this script, or its ckpt/)")
    meta = ck.read_meta(steps[-1])
    saved = meta["config"]
    if saved.get("recipe") != "dense":
        raise CLIError(f"--teacher {ck.dir}: the teacher must be a `--recipe dense` checkpoint, this one "
                       f"is recipe={saved.get('recipe')!r}")
    diffs = [k for k in TEACHER_MATCH_KEYS if saved.get(k) != hp[k]]
    if diffs:
        parts = ", ".join(f"{k}={saved.get(k)!r} in the teacher but {hp[k]!r} now" for k in diffs)
        raise CLIError(f"--teacher {ck.dir}: the teacher was trained with a different model configuration "
                       f"({parts}); the student needs the teacher's vocabulary, width, depth, heads and "
                       "sequence length: train the teacher with the same --size/--n-layer/--n-head/"
                       "--n-embd/--seq-len/--ffn/--untied-head flags")
    return ck, steps[-1], meta


def load_teacher(hp: dict):
    """The dense teacher's params from ``hp["teacher"]`` (validated, fingerprints checked)."""
    ck, step, meta = check_teacher(hp)
    teacher_exp = build_experiment(dict(meta["config"]))
    abstract = jax.eval_shape(lambda: init_state(teacher_exp, 0))
    state, _ = ck.restore(step, abstract)
    return state["params"]


#: files a run writes into --out (besides ckpt/); never replaced without --overwrite.
RUN_FILES = ("summary.json", "metrics.jsonl", "loss.png")
#: files --compare writes into --out.
COMPARE_FILES = ("compare.md", "compare.json", "compare.png")


def _check_out_is_dir(out: Path) -> None:
    """``--out`` (or the first of its parents that exists) must be a directory."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file" if p == out else f"is inside {p}, which is a file"
                raise CLIError(f"--out {out} {what}, not a directory; choose another --out")
            return


def _precheck_out(out: Path, resume: bool, overwrite: bool, resume_from: Optional[int] = None) -> None:
    """Refuse to write over a previous run (any of its files, not only ckpt/) without --overwrite."""
    _check_out_is_dir(out)
    ck = Checkpoints(out / "ckpt")
    steps = ck.steps()
    if resume and not steps:
        raise CLIError(f"--resume: no checkpoint found in {ck.dir}")
    if resume_from is not None and resume_from not in steps:
        raise CLIError(f"--resume-from {resume_from}: {ck.dir} has no checkpoint of that step (steps {steps})")
    if resume or overwrite:
        return
    held = [f"checkpoints (steps {steps})"] if steps or (ck.dir.exists() and any(ck.dir.iterdir())) else []
    held += [f for f in RUN_FILES if (out / f).exists()]
    if held:
        how = "--resume to continue it, " if steps else ""
        raise CLIError(f"--out {out} already holds a previous run ({', '.join(held)}); pass {how}--overwrite to "
                       "replace it, or choose another --out")


def train(args, recipe: str, out: Path, data: ByteData, mesh) -> dict:
    """Train one recipe into ``out``; return its summary."""
    hp = resolve_flags(args, recipe)
    hp["data_sha256"] = data.sha256
    exp = build_experiment(hp)
    steps = hp["steps"]
    stop = steps if args.stop_at is None else min(steps, args.stop_at)
    eval_every, ckpt_every, log_every = (_every(args, n) for n in ("eval_every", "ckpt_every", "log_every"))
    B, T = hp["batch_size"], hp["seq_len"]
    if mesh is not None and (B // hp["grad_accum"]) % mesh.shape["data"]:
        raise CLIError(f"--batch-size {B} / --grad-accum {hp['grad_accum']} is not divisible by the mesh's data "
                       f"axis ({mesh.shape['data']})")
    ckpts = Checkpoints(out / "ckpt")
    teacher_params = load_teacher(hp) if exp.teacher_model is not None else None

    rt = make_runtime(exp, mesh, teacher_params)
    init_jit, put = rt.init, rt.put
    plan = {} if args.quiet else kernel_plan(rt)
    if plan:
        where = "GPU kernels" if s24.cuda_kernels_available() else "no GPU kernels: dense reference"
        print(f"{PROG}: {recipe} GEMMs per sparse layer ({where}): {format_plan(plan)}", file=sys.stderr)
    st_sh, abstract = rt.state_shardings, rt.abstract_state
    abstract_sh = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, st_sh)

    config = run_config(hp, data.sha256)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    history: list[dict] = []
    if args.resume:
        step0 = args.resume_from if args.resume_from is not None else ckpts.steps()[-1]
        try:
            meta = ckpts.read_meta(step0)
            check_config(meta["config"], config, ckpts.dir)
            state, meta = ckpts.restore(step0, abstract_sh)
        except CLIError as e:
            if "corrupt" not in str(e):
                raise
            raise ckpts.with_intact_hint(e, step0, abstract_sh, config) from None
        discarded = ckpts.discard_after(step0)
        if discarded:
            print(f"{PROG}: discarded the checkpoints after step {step0} (steps {discarded}) in {ckpts.dir}",
                  file=sys.stderr)
        history = [r for r in _read_jsonl(metrics_path) if r.get("step", 0) <= step0]
        elapsed_prev = float(meta.get("train_time", 0.0))
        tokens_prev = int(meta.get("train_tokens", 0))
        print(f"{PROG}: resumed {recipe} from {ckpts.dir / str(step0)} (step {step0}/{steps})", file=sys.stderr)
    else:
        if ckpts.dir.exists():
            shutil.rmtree(ckpts.dir)  # --overwrite (checked before)
        for f in RUN_FILES:  # --overwrite: no file of the previous run survives a shorter new one
            (out / f).unlink(missing_ok=True)
        state = init_jit()
        if exp.teacher_model is not None:
            state = rt.init_from_teacher(state)
        step0, elapsed_prev, tokens_prev = 0, 0.0, 0

    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract["params"]))
    n_sparse = sum(int(np.prod(_get(abstract["params"], p)["kernel"].shape)) for p in exp.sparse_paths)

    def evaluate(st) -> float:
        eval_step = rt.eval_step(exp.sparse_at(step, phase))
        losses = [eval_step(st, put(b)) for b in data.val_batches]
        return float(np.mean(jax.device_get(losses)))

    def save(st, step, train_time, train_tokens):
        meta = {"config": config, "step": step, "train_time": train_time, "train_tokens": train_tokens,
                "n_params": n_params, "jax": jax.__version__}
        ckpts.save(step, st, meta)
        _write_jsonl(metrics_path, history)

    step = step0
    phase = step_phase(state) if exp.needs_phase() else 0  # STEP phase after `step` updates
    if step0 == 0 and not any("val_loss" in r for r in history):
        history.append({"step": 0, "val_loss": evaluate(state)})

    desc = f"{recipe:>5s}"
    bar = Progress(stop, step0, desc, quiet=args.quiet)
    last = {"loss": None, "val": history[-1].get("val_loss") if history else None, "flip": None, "tok_s": None}
    for r in reversed(history):
        if r.get("flip") is not None:
            last["flip"] = r["flip"]
            break
    train_time, train_tokens = elapsed_prev, tokens_prev
    pending: list[tuple[int, dict]] = []
    t_mark = None  # start of the timed interval (None: next step includes compilation)
    interval_tokens = 0
    phase_step = None

    def flush():
        nonlocal t_mark, interval_tokens, train_time, train_tokens
        if not pending:
            return
        got = jax.device_get([m for _, m in pending])
        now = time.perf_counter()
        if t_mark is not None and interval_tokens:
            dt = now - t_mark
            train_time += dt
            train_tokens += interval_tokens
            last["tok_s"] = interval_tokens / dt
        for (s, _), m in zip(pending, got):
            row = {"step": s, "loss": float(m["loss"]), "flip": _nan_to_none(m["flip"]),
                   "grad_norm": float(m["grad_norm"]), "sparse": bool(m["sparse"])}
            if "step_z" in m:
                row["step_z"] = float(m["step_z"])
            if "kd" in m:
                row["kd"] = float(m["kd"])
            history.append(row)
            last["loss"] = row["loss"]
            if row["flip"] is not None:
                last["flip"] = row["flip"]
        pending.clear()
        interval_tokens = 0
        t_mark = time.perf_counter()

    interrupted = False
    try:
        compiled = set()
        while step < stop:
            flag = exp.sparse_at(step, phase)
            new_program = flag not in compiled  # first step of a phase compiles: keep it out of tokens/s
            if new_program:
                flush()
                t_mark = None
                compiled.add(flag)
            tokens = put(data.batch(step))
            state, m = rt.train_step(flag)(state, tokens)
            step += 1
            if exp.needs_phase() and not phase:  # STEP's dense phase: read the switch (a sync)
                phase = step_phase(state)
            pending.append((step, m))
            if t_mark is not None:
                interval_tokens += B * T
            do_eval = step % eval_every == 0 or step == steps
            do_ckpt = ckpt_every > 0 and (step % ckpt_every == 0 or step == stop)
            if new_program or step % log_every == 0 or do_eval or do_ckpt:
                flush()  # ends the timed interval (after a new program: the untimed compile step)
                if new_program:
                    # Move what compiling left alive (jaxprs, lowered modules, ...) out of the
                    # collector's reach: a full collection that scans it stalls the step loop for up
                    # to ~0.7 s in the benchmark's process (bench_train_gpt.py --gc on). Undone below.
                    gc.collect()
                    gc.freeze()
                if do_eval:
                    last["val"] = evaluate(state)
                    history.append({"step": step, "val_loss": last["val"]})
                if do_ckpt:
                    save(state, step, train_time, train_tokens)
                if do_eval or do_ckpt:
                    t_mark = time.perf_counter()
                bar.update(step, loss=_fmt(last["loss"]), val=_fmt(last["val"]),
                           **{"tok/s": _fmt(last["tok_s"], ".0f"), "flip": _fmt(last["flip"], ".2e")})
    except KeyboardInterrupt:
        interrupted = True
        flush()
        bar.close()
        if ckpt_every > 0:
            save(state, step, train_time, train_tokens)
            print(f"\n{PROG}: interrupted at step {step}; checkpoint saved in {ckpts.dir}; continue with --resume",
                  file=sys.stderr)
    finally:
        gc.unfreeze()  # collectable again (callers that train several times); also undoes a caller's own gc.freeze()
    if not interrupted:
        bar.close()

    # Phase marker for the plot.
    phase_label = ""
    if exp.switch_step is not None:
        phase_step, phase_label = exp.switch_step, "dense fine-tune"
    elif exp.recipe.get("step"):
        switched = [r["step"] for r in history if r.get("sparse")]
        if switched:
            phase_step, phase_label = switched[0], "STEP: sparse phase"
    _write_jsonl(metrics_path, history)
    vals = [r["val_loss"] for r in history if "val_loss" in r]
    summary = {
        "recipe": recipe, "size": hp["size"], "steps_done": step, "steps": steps,
        "final_val_loss": vals[-1] if vals else None,
        "final_train_loss": last["loss"],
        "tokens_per_s": (train_tokens / train_time) if train_time > 0 else None,
        "train_time_s": train_time, "n_params": n_params, "n_sparse_params": n_sparse,
        "phase_step": phase_step, "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(), "config": config, "interrupted": interrupted,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    flip_label = (f"mask flip rate (per refresh, every {hp['mask_every']} steps)" if exp.cfg.method == "srste"
                  else "2:4 mask flip rate (per update, on logging steps)")
    plot_run(history, out / "loss.png", f"{recipe} ({hp['size']})", phase_step, phase_label, flip_label)
    summary["history"] = history
    if interrupted:
        raise KeyboardInterrupt
    return summary


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` once: not for flags without a default (None) or on/off switches, nor
    where the help already states the default (e.g. "default: per size")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


def _sizes_help() -> str:
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Pre-train a GPT on bytes with 2:4 sparse-training recipes (jax_sparse24).",
        formatter_class=_HelpFormatter,
    )
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="srste", help="2:4 training recipe")
    ap.add_argument("--compare", default=None,
                    help="comma-separated recipes to train one after another (e.g. dense,srste,sste,step,ste)")
    ap.add_argument("--size", choices=list(SIZES), default="tiny", help=_sizes_help())
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: per size)")
    ap.add_argument("--out", type=Path, default=Path("runs/gpt"), help="output directory")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="text corpus (bytes are the tokens)")
    ap.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: per size)")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="split each step's batch into this many micro-batches (gradients averaged; "
                         "activation memory of one micro-batch)")
    ap.add_argument("--sparse-backend", choices=s24.BACKENDS, default="auto",
                    help="GEMM backend of the 2:4 layers (Sparse24Dense(backend=)): auto picks per GEMM from "
                         "the measured table; cutlass / cusparselt force the sparse kernels (GPU)")
    ap.add_argument("--prepare-weights", choices=("on", "off"), default="on",
                    help="with --grad-accum > 1: mask and compress each 2:4 weight once per step instead of "
                         "once per micro-batch (jax_sparse24.nn.prepare; same math)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: per size)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per size)")
    ap.add_argument("--warmup", type=int, default=None, help="linear warm-up steps (default: per size)")
    ap.add_argument("--min-lr-fraction", type=float, default=0.1, help="cosine decays to lr * this")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decoupled weight decay")
    ap.add_argument("--b1", type=float, default=0.9, help="AdamW beta1: decay of the gradient's moving average")
    ap.add_argument("--b2", type=float, default=0.95,
                    help="AdamW beta2: decay of the squared gradient's moving average")
    ap.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clip (0: off)")
    ap.add_argument("--decay-alpha", type=float, default=2e-4, help="srste: masked decay strength")
    ap.add_argument("--mask-every", type=int, default=40, help="srste: mask refresh period (steps)")
    ap.add_argument("--finetune-fraction", type=float, default=1 / 6, help="srste: final dense fraction (default: 1/6)")
    ap.add_argument("--teacher", type=Path, default=None,
                    help="ast: dense teacher (the --out directory of a --recipe dense run, same model flags)")
    ap.add_argument("--kd-alpha", type=float, default=1.0, help="ast: weight of the KL distillation loss")
    ap.add_argument("--kd-temperature", type=float, default=1.0, help="ast: distillation temperature")
    ap.add_argument("--slorb-group", type=int, default=64,
                    help="ast: SLoRB group size k (low-rank term of rank in // k; groups of 4 if in %% k)")
    ap.add_argument("--n-layer", type=int, default=None, help="override the size's number of blocks")
    ap.add_argument("--n-head", type=int, default=None, help="override the size's number of heads")
    ap.add_argument("--n-embd", type=int, default=None, help="override the size's width")
    ap.add_argument("--ffn", choices=("gelu", "swiglu"), default=None,
                    help="FFN activation (default: per size; gelu for gpt sizes, swiglu for llama sizes); swiglu "
                         "fuses gate+up into one GEMM (plain jnp, no custom kernel)")
    ap.add_argument("--sparse-attn", action=argparse.BooleanOptionalAction, default=None,
                    help="2:4 attention projections too (default: per size; on for llama sizes)")
    ap.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto",
                    help="attention kernel: cudnn (flash attention; GPU, bfloat16), xla, or auto (cudnn "
                         "where it applies)")
    ap.add_argument("--untied-head", action="store_true", help="separate output head (default: tied to wte)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="compute dtype (auto: bfloat16 on GPU, float32 on CPU); params are float32")
    ap.add_argument("--eval-every", type=int, default=None, help="steps between val evals (default: per size)")
    ap.add_argument("--eval-batches", type=int, default=None, help="val batches per eval (default: per size)")
    ap.add_argument("--ckpt-every", type=int, default=None, help="steps between checkpoints (0: none; default: per size)")
    ap.add_argument("--log-every", type=int, default=None, help="steps between progress updates (and ste/sste/ast flip-rate measurements; default: per size)")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    ap.add_argument("--resume-from", type=int, default=None, metavar="STEP",
                    help="continue from the checkpoint of this step in --out (e.g. the newest intact one when "
                         "the latest is corrupt); the checkpoints after it are deleted")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a previous run in --out (its checkpoints, metrics.jsonl, summary.json, loss.png); "
                         "without it such a run is never written over")
    ap.add_argument("--stop-at", type=int, default=None,
                    help="stop (with a checkpoint) after this step, as if interrupted; --resume continues")
    ap.add_argument("--seed", type=int, default=0, help="init / data / MVUE seed")
    ap.add_argument("--mesh", default=None, help="device mesh, e.g. data=2,model=1 (default: one device)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def _write_compare(out: Path, summaries: list[dict], compare_speed: bool = True) -> None:
    """``compare.md`` / ``compare.json``. ``compare_speed=False`` (no GPU kernels: every 2:4 layer
    ran the dense reference) leaves out the tokens/s ratios, which would only measure noise."""
    dense = next((s for s in summaries if s["recipe"] == "dense"), None)
    lines = [
        f"# {summaries[0]['size']}: {', '.join(s['recipe'] for s in summaries)} "
        f"({summaries[0]['steps_done']} steps, {summaries[0]['backend']}: {summaries[0]['device']})",
        "",
        "| recipe | final val loss | vs dense | tokens/s | vs dense | final train loss |",
        "|---|---|---|---|---|---|",
    ]
    for s in summaries:
        vl, tps = s["final_val_loss"], s["tokens_per_s"]
        rel_l = rel_t = "-"
        if dense and vl is not None and dense["final_val_loss"]:
            rel_l = f"{100 * (vl / dense['final_val_loss'] - 1):+.1f}%"
        if compare_speed and dense and tps and dense["tokens_per_s"]:
            rel_t = f"{tps / dense['tokens_per_s']:.2f}x"
        lines.append(f"| {s['recipe']} | {_fmt(vl, '.4f')} | {rel_l} | {_fmt(tps, '.0f')} | {rel_t} | "
                     f"{_fmt(s['final_train_loss'], '.4f')} |")
    if not compare_speed:
        lines += ["", "no GPU kernels: speed not compared (every 2:4 layer ran the dense reference, so tokens/s "
                      "differences between recipes are noise)"]
    lines.append("")
    (out / "compare.md").write_text("\n".join(lines))
    (out / "compare.json").write_text(json.dumps([{k: v for k, v in s.items() if k != "history"}
                                                  for s in summaries], indent=2) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if args.compare is not None:
            recipes = [r.strip() for r in args.compare.split(",") if r.strip()]
            bad = [r for r in recipes if r not in RECIPES]
            if not recipes or bad:
                raise CLIError(f"--compare: unknown recipe(s) {bad or [args.compare]}; choose from {sorted(RECIPES)}")
            if len(set(recipes)) != len(recipes):
                raise CLIError(f"--compare: a recipe is listed twice: {args.compare}")
            outs = {r: args.out / r for r in recipes}
        else:
            recipes = [args.recipe]
            outs = {args.recipe: args.out}
        for name in ("eval_every", "ckpt_every", "log_every", "eval_batches"):
            if _every(args, name) < (0 if name == "ckpt_every" else 1):
                raise CLIError(f"--{name.replace('_', '-')} must be >= {0 if name == 'ckpt_every' else 1}")
        if args.stop_at is not None and args.stop_at < 1:
            raise CLIError("--stop-at must be >= 1")
        if args.resume_from is not None:
            if args.resume_from < 1:
                raise CLIError("--resume-from must be a checkpoint step (>= 1)")
            args.resume = True
        if args.resume and args.overwrite:
            raise CLIError("--overwrite starts over and --resume/--resume-from continue: pass one of them")
        if args.teacher is not None and not any(RECIPES[r].get("ast") for r in recipes):
            raise CLIError("--teacher is only used by --recipe ast")
        for r in recipes:
            hp = resolve_flags(args, r)  # validate every run's flags before writing anything
            if RECIPES[r].get("ast"):
                ck, _, _ = check_teacher(hp)
                if ck.dir == (outs[r] / "ckpt").resolve():
                    raise CLIError(f"--teacher {args.teacher} is the output directory of this run; "
                                   "choose another --out")
        mesh = parse_mesh(args.mesh)
        seq_len = args.seq_len or SIZE_DEFAULTS[args.size]["seq_len"]
        batch = args.batch_size or SIZE_DEFAULTS[args.size]["batch_size"]
        data = ByteData(args.data, seq_len, batch, args.seed, _every(args, "eval_batches"))
        if args.compare is not None:
            _check_out_is_dir(args.out)
            held = [f for f in COMPARE_FILES if (args.out / f).exists()]
            if held and not (args.overwrite or args.resume):
                raise CLIError(f"--out {args.out} already holds a comparison ({', '.join(held)}); pass "
                               "--overwrite to replace it, or choose another --out")
        for r in recipes:
            _precheck_out(outs[r], args.resume, args.overwrite, args.resume_from)
        if args.resume:  # refuse mismatched / corrupt checkpoints before training anything
            for r in recipes:
                ck = Checkpoints(outs[r] / "ckpt")
                hp = resolve_flags(args, r)
                cfg = run_config(hp, data.sha256)
                step = args.resume_from if args.resume_from is not None else ck.steps()[-1]
                try:
                    check_config(ck.read_meta(step)["config"], cfg, ck.dir)
                except CLIError as e:
                    if "corrupt" not in str(e):
                        raise
                    exp = build_experiment(hp)
                    raise ck.with_intact_hint(e, step, jax.eval_shape(lambda: init_state(exp, hp["seed"])),
                                              cfg) from None
        print(f"{PROG}: {len(data.train)} train / {len(data.val)} val bytes from {data.path}; "
              f"{jax.device_count()} {jax.default_backend()} device(s)", file=sys.stderr)
        summaries = []
        for r in recipes:
            s = train(args, r, outs[r], data, mesh)
            summaries.append(s)
            if s["steps_done"] < s["steps"]:
                saved = Checkpoints(outs[r] / "ckpt").steps()
                how = (f"checkpoint of step {saved[-1]} in {outs[r] / 'ckpt'}; continue with the same flags and "
                       "--resume instead of --stop-at" if saved and saved[-1] == s["steps_done"] else
                       "no checkpoint was written (--ckpt-every 0), so it cannot be resumed")
                print(f"{PROG}: {r}: stopped at step {s['steps_done']} of {s['steps']} (--stop-at): {how} "
                      f"-> {outs[r]}", file=sys.stderr)
                continue
            print(f"{PROG}: {r}: final val loss {_fmt(s['final_val_loss'], '.4f')}, "
                  f"{_fmt(s['tokens_per_s'], '.0f')} tokens/s, {s['steps_done']} steps -> {outs[r]}",
                  file=sys.stderr)
        if args.compare is not None:
            plot_compare({s["recipe"]: s["history"] for s in summaries}, args.out / "compare.png",
                         f"{args.size}")
            _write_compare(args.out, summaries, compare_speed=s24.cuda_kernels_available())
    except CLIError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
