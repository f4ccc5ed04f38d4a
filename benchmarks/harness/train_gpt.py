#!/usr/bin/env python
"""The measuring harness: pre-train a GPT with every 2:4 sparse-training recipe of jax_sparse24 and every knob
the benchmarks turn (``benchmarks/bench_train_gpt.py``, ``bench_step_breakdown.py``, ``bench_quality.py``, ...).
The script a user copies is ``examples/train.py``; this one is for measuring.

First run (CPU, about a minute or two, on the bundled real text: the loss falls from ~5.5 to ~2.3)::

    python benchmarks/harness/train_gpt.py --size tiny --steps 300 --out runs/tiny

Recipes (``--recipe``; the FFN linears are 2:4, the attention projections too with
``--sparse-attn``):

* ``dense`` — plain ``nn.Dense`` + AdamW (the baseline).
* ``srste`` — transposable SR-STE (Hu et al., ICML'24): transposable 2:4 masks refreshed from the
  weights every ``--mask-every`` optimizer steps, MVUE weight gradient, SR-STE masked decay on the
  pruned weights, and a dense fine-tune for the last ``--finetune-fraction`` (1/6) of the steps,
  starting from the kernels as they are (``--finetune-start weights``) or pruned to their 2:4 masks
  (``masked``; ``masked-reset`` also zeroes the pruned weights' Adam moments), once, at the switch.
* ``sste`` — S-STE: soft-thresholded weights ``β·S(w)`` with β frozen at init, MVUE weight grad.
* ``step`` — STEP: ``adamw_step`` trains dense while it preconditions, freezes the 2:4 kernels'
  second moment when it has converged (AutoSwitch clipped to 10%–50% of the steps) and the model
  then trains with hard 2:4 straight-through weights; embeddings, norms, biases and the layers that
  stay dense keep AdamW's live second moment (freezing theirs too diverged on GPT-2).
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

``srste``, ``sste`` and ``ste`` train the 2:4 kernels at ``--sparse-lr-scale`` times the learning
rate while the model runs sparse (``jax_sparse24.optim.sparse_lr_scale``): a 2:4 layer has half the
inputs per output, so at the dense learning rate its output moves half as far per AdamW step. The
default is 2 for srste (with its default short dense fine-tune) and for every recipe on the tiny
sizes: there the FFNs lag, attention takes over and the loss spikes (srste 2.30x the running loss
at step 29 of the tiny model on real text, +3.3% final val loss vs dense; with the factor 2: no
spike, +0.6%; ``benchmarks/results/quality_tiny_cpu_realtext.json``). It is 1 for sste and ste at the GPT-2 and
LLaMA sizes: on GPT-2 124M (100M tokens of real text) the factor 2 cost them 2-3 points (sste
+2.33%, ste +3.32% against +0.35%, 0.00% with 1; ``quality_gpt2_h100_realtext_100m_lr1.md``), and 1
for srste with a long dense tail there (``--finetune-fraction`` above 1/4: half dense ended +1.73%
with 2, +0.39% with 1).

Data (``--data``): a text file whose bytes are the tokens (vocabulary 256; default: the bundled real,
public-domain English prose ``examples/data/realtext_small_{train,val}.txt.xz``, 20.4 MB / 1.8 MB, sources
in ``examples/data/SOURCES.md``), or a directory written by ``examples/prepare_data.py`` (a byte-level
BPE tokenizer, e.g. ``--vocab-size 32000``, and its token shards): the model's vocabulary is then the
tokenizer's, training reads windows of the memmapped shards (each process its rows of the global batch,
prefetched in a thread; ``examples/data.py``), and the tokenizer's sha256 is part of the checkpointed config
(a ``--resume`` with other data or another tokenizer is refused)::

    python examples/prepare_data.py --data examples/data/realtext_small_train.txt.xz \\
        --val examples/data/realtext_small_val.txt.xz --out data/realtext_small_bpe32k --vocab-size 32000
    python benchmarks/harness/train_gpt.py --data data/realtext_small_bpe32k --size gpt2 --compare dense,srste

Outputs in ``--out``: ``metrics.jsonl`` (per-step train loss, lr; eval val loss; the mask flip
rate — srste: at each mask refresh, ste/sste/ast: of the update of every ``--log-every``-th step),
``summary.json``, ``loss.png`` (train/val loss and flip rate), and orbax checkpoints in
``ckpt/`` every ``--ckpt-every`` steps (params, sparsity collection, optimizer state including
the STEP phase, step, config). ``--resume`` continues bit-exactly from the latest checkpoint;
the batch of step ``t`` and the MVUE key of step ``t`` are pure functions of ``(--seed, t)``,
so the data position is the step. A corrupt checkpoint is refused with one line naming the newest
intact one; ``--resume-from STEP`` continues from it (deleting the checkpoints after it); ``--resume`` of
a finished run says so and keeps its ``summary.json``. A previous
run's files in ``--out`` (checkpoints, metrics, summary, plot) are never written over without
``--overwrite``. Ctrl-C stops at the next safe point (after the current step, compilation, evaluation
or checkpoint write: the handler only sets a flag, ``gpt_errors.INTERRUPT``), saves a checkpoint and exits
with code 130 and one line saying what was saved and how to resume (or that nothing was, before step 1);
a second Ctrl-C quits at once. A non-finite training loss or gradient norm (every step's, read when the
loop logs), validation loss or train state (checked before each checkpoint) stops the run with exit code 1
and one line naming the step: the update is not skipped (as ``optax.apply_if_finite`` would), and no
checkpoint is written from that step on, so the newest one is the last good state.
``--compare dense,srste,...`` trains several recipes into
``--out/<recipe>`` and writes ``compare.png``, ``compare.md`` and ``compare.json``.

``--mesh data=2,model=1`` shards the batch over the ``data`` axis of a device mesh and the
linear layers Megatron-style over ``model`` (column-parallel ``qkv``/``fc``, row-parallel
``proj``); on a CPU try it with ``XLA_FLAGS=--xla_force_host_platform_device_count=2``.

``--grad-accum N`` splits each step's batch into N micro-batches (a ``lax.scan`` inside the step;
gradients averaged, each micro-batch its own MVUE key): the same update with 1/N of the activation
memory. The 2:4 weights are then prepared once per step (``jax_sparse24.preparation.prepare``: masks, soft
threshold, compression) and shared by the micro-batches; ``--prepare-weights off`` redoes that work
per micro-batch (same math, for comparison). ``--prepare-weights always`` prepares once per step at
``--grad-accum 1`` too: one batched pass over the weights writes the operands of the forward and the
backward, instead of each GEMM call masking and compressing its weight (same math). Dense models,
``--fp8`` layers and dense phases (STEP's first, srste's fine-tune) never prepare.

``--fp8`` runs the forward and input-gradient GEMMs of the 2:4 layers in float8_e4m3fn with
per-tensor current scaling (``Sparse24Dense(fp8=True)``; the sparse fp8 kernel on a GPU built with
it, XLA's fp8 math elsewhere); with ``--recipe dense`` the same layers run XLA's fp8 dense GEMMs
(the fp8 dense baseline). The MVUE weight gradient of a 2:4 layer runs in fp8 where it runs sparse;
embeddings, head and the other weight gradients stay 16-bit. It changes the
numbers, so it is part of the checkpointed config (docs/fp8.md). ``--fp8-scaling delayed`` takes the
scales from amax histories (Flax's delayed scaling; the histories are part of the train state).
``--recipe dense --fp8 --fp8-scaling delayed --fp8-dense flax`` makes those layers Flax's own fp8 layer
(``nn.Dense(dot_general_cls=Fp8DirectDotGeneralOp)``: all three GEMMs in fp8, e5m2 gradients), the
fp8 dense baseline a Flax user would write.

``--attention auto`` (default) uses cuDNN's flash attention on a GPU with bfloat16 compute (2.4x
less kernel time per GPT-2 step than XLA's attention on the H100) and XLA's elsewhere; ``cudnn``
requires it, ``xla`` never uses it. It is a kernel choice, not part of the checkpointed config.
So is ``--sparse-backend`` (default ``auto``: each GEMM of a 2:4 layer on CUTLASS, cuSPARSELt or
XLA's dense GEMM, whichever the measured table says is fastest; ``cutlass`` / ``cusparselt`` force
one sparse kernel, ``dense`` the dense GEMM on the masked weight).

The script reads top to bottom: the flags (:func:`build_parser`), one training run (:func:`train`:
build the experiment, start or resume, the step loop and its logging, the summary) and the CLI
(:func:`main`). The rest lives beside it in ``benchmarks/harness/``, and in ``examples/``:

* ``examples/model.py`` — the GPT / LLaMA-style model (``SIZES``, attention kernels); ``gpt_model.py`` — its
  harness config (Flax's fp8 dense layer, AST's low-rank layers) and layout conversions;
* ``gpt_experiment.py`` — recipes, per-size defaults, flag resolution, the optimizer chain and the
  train/eval steps (``RECIPES``, ``resolve_flags``, ``build_experiment``, ``make_train_step``);
* ``gpt_runtime.py`` — ``--mesh``, shardings, the jitted ``Runtime``, the per-layer kernel plan;
* ``examples/data.py`` — ``ByteData`` (the byte corpus; the batch of step ``t`` from ``(seed, t)``),
  ``TokenData`` (the token shards of ``--data DIR`` written by ``prepare_data.py``: memmap windows, each
  process its rows, prefetched) and ``load_data``; ``examples/train.py`` — the Ctrl-C flag;
* ``gpt_checkpoints.py`` — orbax checkpoints with fingerprints, config checks, the ``--out`` /
  ``--resume`` / ``--resume-from`` rules, the ``ast`` teacher;
* ``gpt_report.py`` — progress line, ``metrics.jsonl``, the ``--compare`` table;
  ``gpt_plots.py`` — ``loss.png`` and ``compare.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shlex
import sys
import textwrap
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parents[1]
for _p in (_HERE, _ROOT / "examples"):  # the harness's modules; the example's model, data and Ctrl-C flag
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
try:
    import jax_sparse24  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(_ROOT))
from gpt_errors import INTERRUPT  # noqa: E402

if __name__ == "__main__":
    INTERRUPT.install()  # before the harness's imports: a Ctrl-C during them is reported by main() too

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_sparse24 as s24  # noqa: E402

from gpt_checkpoints import (  # noqa: E402
    Checkpoints, precheck_out, check_resume, check_teacher, load_teacher, precheck_compare_out, start_or_resume)
from data import DEFAULT_DATA, ByteData, CLIError, check_tokenizer, load_data  # noqa: E402
from gpt_errors import PROG, Diverged, Interrupted  # noqa: E402
from gpt_experiment import (  # noqa: E402
    FINETUNE_STARTS, RECIPES, SIZE_DEFAULTS, HelpFormatter, build_experiment, flag_or_size_default, resolve_flags,
    run_config, sizes_help, step_phase, subtree)
from gpt_model import FP8_DENSE_IMPLS  # noqa: E402
from model import SIZES  # noqa: E402
from gpt_plots import plot_compare, plot_run  # noqa: E402
from gpt_report import Progress, TrainLog, fmt, write_compare, write_jsonl  # noqa: E402
from gpt_runtime import format_plan, init_distributed, is_writer, kernel_plan, make_runtime, parse_mesh, writer_only  # noqa: E402
# several processes (--distributed): only process 0 writes metrics, plots and the comparison
write_jsonl, plot_run, plot_compare, write_compare = map(writer_only, (write_jsonl, plot_run, plot_compare, write_compare))


# ------------------------------------------------------------------------------------------------
# Flags
# ------------------------------------------------------------------------------------------------


#: the end of --help: example commands, what stops a run and what it leaves behind
EPILOG_EXAMPLES = """\
examples:
  # first run: CPU, the tiny model on the bundled text
  python benchmarks/harness/train_gpt.py --size tiny --steps 300 --out runs/tiny

  # subword tokens (a BPE tokenizer and token shards), then a LLaMA-shaped model, dense vs srste, on a GPU
  python examples/prepare_data.py --data examples/data/realtext_small_train.txt.xz \\
      --val examples/data/realtext_small_val.txt.xz --out data/realtext --vocab-size 32000
  python benchmarks/harness/train_gpt.py --data data/realtext --size llama-300m --compare dense,srste --out runs/llama-300m

  # 4 GPUs, one process each, parameters and optimizer state FSDP-sharded (add --resume to continue)
  python examples/launch.py --nproc 4 -- benchmarks/harness/train_gpt.py --distributed --mesh fsdp=4 \\
      --size llama-1b --remat dots --data data/realtext --out runs/llama-1b
"""
EPILOG = (
    "A non-finite loss or gradient norm (every step's, read at each --log-every step), validation loss or "
    "train state (checked before each checkpoint) stops the run with exit code 1 and one line naming the step; "
    "the update is not skipped (as optax.apply_if_finite would), and no checkpoint is written from that step "
    "on, so the last one in --out/ckpt is the last good state. Ctrl-C stops at the next safe point (after the "
    "current step, compilation, evaluation or checkpoint write), saves a checkpoint and exits with code 130 and "
    "one line saying what was saved and how to resume; a second Ctrl-C quits at once without saving."
)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """Each default shown once (``HelpFormatter``); the description and epilog as written (example commands)."""


def build_parser() -> argparse.ArgumentParser:
    fill = lambda text: textwrap.fill(text, 100, break_on_hyphens=False)  # noqa: E731
    ap = argparse.ArgumentParser(
        prog=PROG, formatter_class=_HelpFormatter, epilog=EPILOG_EXAMPLES + "\n" + fill(EPILOG),
        description=fill("Pre-train a GPT on bytes or subword tokens with 2:4 sparse-training recipes (jax_sparse24): "
                         "the full harness. examples/train.py is the short script to read and copy."),
    )
    model = ap.add_argument_group("model", "the network: a size preset and its overrides")
    model.add_argument("--size", choices=list(SIZES), default="tiny", help=sizes_help())
    model.add_argument("--n-layer", type=int, default=None, help="override the size's number of blocks")
    model.add_argument("--n-head", type=int, default=None, help="override the size's number of heads")
    model.add_argument("--n-embd", type=int, default=None, help="override the size's width")
    model.add_argument("--ffn", choices=("gelu", "swiglu"), default=None,
                       help="FFN activation (default: per size; gelu for gpt sizes, swiglu for llama sizes); swiglu "
                            "fuses gate+up into one GEMM (plain jnp, no custom kernel)")
    model.add_argument("--sparse-attn", action=argparse.BooleanOptionalAction, default=None,
                       help="2:4 attention projections too (default: per size; on for llama sizes)")
    model.add_argument("--untied-head", action="store_true", help="separate output head (default: tied to wte)")
    model.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                       help="compute dtype (auto: bfloat16 on GPU, float32 on CPU); params are float32")
    data = ap.add_argument_group("data", "what it trains and validates on")
    data.add_argument("--data", type=Path, default=DEFAULT_DATA,
                      help="a text file (bytes are the tokens; .xz/.gz decompressed; without --val-data its last 10%% "
                           "validates; the default, real public-domain prose, has its own validation file) or a "
                           "directory written by examples/prepare_data.py (subword tokens; the model's vocabulary is "
                           "its tokenizer's)")
    data.add_argument("--val-data", type=Path, default=None,
                      help="validation text: all of --data then trains and this file validates")
    data.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: per size)")
    data.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: per size)")
    data.add_argument("--seed", type=int, default=0, help="init / data / MVUE seed")
    data.add_argument("--eval-every", type=int, default=None, help="steps between val evals (default: per size)")
    data.add_argument("--eval-batches", type=int, default=None, help="val batches per eval (default: per size)")
    data.add_argument("--final-eval-tokens", type=float, default=0,
                      help="after the last step, also evaluate on about this many validation tokens (non-overlapping "
                           "windows over the whole validation text at most): summary's final_val_loss_full; 0: off")
    recipe = ap.add_argument_group("recipe", "how the 2:4 layers train (--recipe ast: the teacher flags)")
    recipe.add_argument("--recipe", choices=sorted(RECIPES), default="srste", help="2:4 training recipe")
    recipe.add_argument("--compare", default=None,
                        help="comma-separated recipes to train one after another (e.g. dense,srste,sste,step,ste)")
    recipe.add_argument("--mask-every", type=int, default=40, help="srste: mask refresh period (steps)")
    recipe.add_argument("--decay-alpha", type=float, default=2e-4, help="srste: masked decay strength")
    recipe.add_argument("--finetune-fraction", type=float, default=1 / 6,
                        help="srste: final dense fraction (default: 1/6)")
    recipe.add_argument("--finetune-start", choices=FINETUNE_STARTS, default="weights",
                        help="srste: what the dense fine-tune starts from: weights (the kernels as they are: the pruned "
                             "weights, decayed but unused by the 2:4 forward pass, come back at once), masked (the 2:4 "
                             "kernels pruned to their masks at the switch: the dense model starts from the 2:4 model's "
                             "function; SparseTrainState.prune_to_masks), masked-reset (masked, and the pruned weights' "
                             "Adam moments zeroed)")
    recipe.add_argument("--sparse-lr-scale", type=float, default=None,
                        help="srste/sste/ste: learning-rate multiplier of the 2:4 kernels while the model runs sparse "
                             "(jax_sparse24.optim.sparse_lr_scale; 2 = 1/density: a 2:4 layer's output moves half as far "
                             "per Adam step; 1: off). Default: 2 on the tiny sizes and for srste with its short dense "
                             "fine-tune (--finetune-fraction <= 1/4); 1 for sste, ste and srste with a longer dense tail "
                             "at the GPT-2 and LLaMA sizes (why: gpt_experiment.default_sparse_lr_scale)")
    recipe.add_argument("--fp8", action="store_true",
                        help="forward and input-gradient GEMMs of the 2:4 layers in float8_e4m3fn with current scaling "
                             "(Sparse24Dense(fp8=True), docs/fp8.md); with --recipe dense the same layers run XLA's fp8 "
                             "dense GEMMs. The MVUE weight gradient runs in fp8 where it runs sparse; other weight "
                             "gradients stay 16-bit")
    recipe.add_argument("--fp8-scaling", choices=("current", "delayed"), default="current",
                        help="with --fp8: scales from each call's amax (current) or from amax histories of the previous "
                             "steps (delayed, Flax's recipe; its state is checkpointed with the run)")
    recipe.add_argument("--fp8-dense", choices=FP8_DENSE_IMPLS, default="sparse24",
                        help="the fp8 layers of the dense recipe (--recipe dense --fp8, or dense in --compare, "
                             "where the 2:4 recipes keep theirs): sparse24 (Sparse24Dense(method='dense', fp8=True): "
                             "XLA's fp8 forward and input-gradient GEMMs, 16-bit weight gradient) or flax (Flax's "
                             "nn.Dense(dot_general_cls=Fp8DirectDotGeneralOp): every GEMM fp8, e5m2 gradients; "
                             "needs --fp8-scaling delayed)")
    recipe.add_argument("--teacher", type=Path, default=None,
                        help="ast: dense teacher (the --out directory of a --recipe dense run, same model flags)")
    recipe.add_argument("--kd-alpha", type=float, default=1.0, help="ast: weight of the KL distillation loss")
    recipe.add_argument("--kd-temperature", type=float, default=1.0, help="ast: distillation temperature")
    recipe.add_argument("--slorb-group", type=int, default=64,
                        help="ast: SLoRB group size k (low-rank term of rank in // k; groups of 4 if in %% k)")
    opt = ap.add_argument_group("optimizer", "AdamW with linear warm-up and cosine decay")
    opt.add_argument("--steps", type=int, default=None, help="optimizer steps (default: per size)")
    opt.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per size)")
    opt.add_argument("--warmup", type=int, default=None, help="linear warm-up steps (default: per size)")
    opt.add_argument("--min-lr-fraction", type=float, default=0.1, help="cosine decays to lr * this")
    opt.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decoupled weight decay")
    opt.add_argument("--b1", type=float, default=0.9, help="AdamW beta1: decay of the gradient's moving average")
    opt.add_argument("--b2", type=float, default=0.95,
                     help="AdamW beta2: decay of the squared gradient's moving average")
    opt.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clip (0: off)")
    par = ap.add_argument_group("parallelism and memory", "devices, processes and activation memory (the same math)")
    par.add_argument("--mesh", default=None, help="device mesh over all processes' devices, e.g. data=2,fsdp=2,model=1 "
                     "(data parallel x FSDP/ZeRO-3 x tensor parallel; default: one device)")
    par.add_argument("--distributed", action="store_true",
                     help="one process per GPU/host: jax.distributed.initialize from JAX_COORDINATOR_ADDRESS, "
                          "JAX_NUM_PROCESSES, JAX_PROCESS_ID (examples/launch.py sets them); process 0 logs and writes")
    par.add_argument("--grad-accum", type=int, default=1,
                     help="split each step's batch into this many micro-batches (gradients averaged; "
                          "activation memory of one micro-batch)")
    par.add_argument("--layers", choices=("scan", "unroll"), default="scan",
                     help="the blocks as one nn.scan stack (one block compiled for all; params 'h/...' with a leading "
                          "layer axis) or one module each ('h_0/...'); checkpoints resume in their own layout "
                          "(gpt_model.convert_layout converts)")
    par.add_argument("--remat", choices=("none", "dots", "full"), default="none",
                     help="rematerialise each block in the backward pass (jax.checkpoint): dots keeps the GEMM "
                          "outputs, full only the block input; less activation memory, more compute")
    out = ap.add_argument_group("checkpoint and output", "what --out receives, and how a run stops and resumes")
    out.add_argument("--out", type=Path, default=Path("runs/gpt"), help="output directory")
    out.add_argument("--overwrite", action="store_true",
                     help="replace a previous run in --out (its checkpoints, metrics.jsonl, summary.json, loss.png); "
                          "without it such a run is never written over")
    out.add_argument("--ckpt-every", type=int, default=None,
                     help="steps between checkpoints (0: none; default: per size)")
    out.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    out.add_argument("--resume-from", type=int, default=None, metavar="STEP",
                     help="continue from the checkpoint of this step in --out (e.g. the newest intact one when "
                          "the latest is corrupt); the checkpoints after it are deleted")
    out.add_argument("--stop-at", type=int, default=None,
                     help="stop (with a checkpoint) after this step, as if interrupted; --resume continues")
    out.add_argument("--log-every", type=int, default=None,
                     help="steps between progress updates (and ste/sste/ast flip-rate measurements; default: per size)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    bench = ap.add_argument_group("benchmarking", "kernel choices: the same math on other GEMM or attention kernels "
                                                  "(not part of a checkpoint's config)")
    bench.add_argument("--sparse-backend", choices=s24.BACKENDS, default="auto",
                       help="GEMM backend of the 2:4 layers (Sparse24Dense(backend=)): auto picks per GEMM from "
                            "the measured table; cutlass / cusparselt force the sparse kernels (GPU)")
    bench.add_argument("--prepare-weights", choices=("on", "off", "always"), default=None,
                       help="on: with --grad-accum > 1, mask and compress each 2:4 weight once per step instead of "
                            "once per micro-batch (jax_sparse24.preparation.prepare, all layers batched; same math); always: "
                            "once per step at any --grad-accum, before the forward/backward, instead of in each GEMM "
                            "call; off: in each GEMM call. Not for dense models, --fp8 or dense phases. Default: per "
                            "size (always at gpt2 and gpt2-medium, on elsewhere: gpt_experiment.SIZE_DEFAULTS)")
    bench.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto",
                       help="attention kernel: cudnn (flash attention; GPU, bfloat16), xla, or auto (cudnn "
                            "where it applies)")
    return ap


# ------------------------------------------------------------------------------------------------
# One training run
# ------------------------------------------------------------------------------------------------


def train(args, recipe: str, out: Path, data: ByteData, mesh) -> dict:
    """Train one recipe into ``out``; return its summary."""
    hp = resolve_flags(args, recipe)
    hp["data_sha256"] = data.sha256
    exp = build_experiment(hp)
    steps = hp["steps"]
    stop = steps if args.stop_at is None else min(steps, args.stop_at)
    eval_every, ckpt_every, log_every = (flag_or_size_default(args, n) for n in ("eval_every", "ckpt_every", "log_every"))
    B, T = hp["batch_size"], hp["seq_len"]
    if mesh is not None and (B // hp["grad_accum"]) % mesh.shape["data"]:
        raise CLIError(f"--batch-size {B} / --grad-accum {hp['grad_accum']} is not divisible by the mesh's data "
                       f"axis ({mesh.shape['data']})")
    ckpts = Checkpoints(out / "ckpt")
    teacher_params = load_teacher(hp) if exp.teacher_model is not None else None

    rt = make_runtime(exp, mesh, teacher_params)
    put = rt.put
    if hasattr(data, "use_sharding"):  # TokenData: read only the rows this process's devices hold
        data.use_sharding(rt.data_sharding)
    plan = {} if args.quiet else kernel_plan(rt)
    if plan:
        where = "GPU kernels" if s24.cuda_kernels_available() else "no GPU kernels: dense reference"
        print(f"{PROG}: {recipe} GEMMs per sparse layer ({where}): {format_plan(plan)}", file=sys.stderr)
    abstract = rt.abstract_state

    config = run_config(hp, data.sha256)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    state, step0, history, elapsed_prev, tokens_prev = start_or_resume(
        rt, ckpts, out, config, args.resume, args.resume_from)
    if exp.starts_finetune(step0):
        # resumed from the checkpoint of the switch: written after --finetune-start ran (idempotent:
        # running it again changes nothing) or, if interrupted in between, before it
        state = rt.start_finetune(state)

    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract["params"]))
    n_sparse = sum(int(np.prod(subtree(abstract["params"], p)["kernel"].shape)) for p in exp.sparse_paths)

    argv = getattr(args, "argv", None)  # main()'s command line: the resume hint
    label = f"{recipe}: " if getattr(args, "compare", None) is not None else ""
    if args.resume and step0 >= steps:
        done = _finished_summary(out, config, args)
        if done is not None:  # --resume of a finished run: its summary is kept as it is
            return dict(done, history=history, already_finished=True)
    saved = ckpts.steps()
    last_saved = saved[-1] if saved else None  # the newest checkpoint (written by this run or before)

    def stop_before_training():
        """Ctrl-C before the first step of this process: nothing new was saved."""
        if not stop_agreed():
            return
        if last_saved is None:
            raise Interrupted(f"{label}interrupted during start-up, before step {step0 + 1}: nothing was saved")
        raise Interrupted(f"{label}interrupted before step {step0 + 1}: nothing new saved; the latest checkpoint "
                          f"is step {last_saved} in {ckpts.dir}{_resume_hint(argv)}")

    stop_before_training()  # after the state's init / restore (compiled and run)

    def evaluate(st, batches=None, interruptible=False) -> float:
        """Mean val loss over ``batches`` (default: the evaluation batches of every ``--eval-every``);
        ``interruptible`` (the final evaluation, which may be long): NaN if Ctrl-C stopped it."""
        eval_step = rt.eval_step(exp.sparse_at(step, phase))
        losses = []
        for b in (data.val_batches if batches is None else batches):
            losses.append(eval_step(st, put(b)))
            if interruptible and len(losses) % 8 == 0:
                jax.block_until_ready(losses[-1])
                if stop_agreed():
                    return float("nan")
        return float(np.mean(jax.device_get(losses)))

    def save(st, step, log) -> bool:
        """Checkpoint of ``step`` and ``metrics.jsonl``; False (nothing written) if the state is not finite."""
        nonlocal last_saved
        INTERRUPT.pause("save")  # test hook
        if last_saved == step:
            return True
        if not bool(_all_finite(st)):
            return False
        meta = {"config": config, "step": step, "train_time": log.train_time, "train_tokens": log.train_tokens,
                "n_params": n_params, "jax": jax.__version__}
        ckpts.save(step, st, meta)
        write_jsonl(metrics_path, history)
        last_saved = step
        return True

    step = step0
    phase = step_phase(state) if exp.needs_phase() else 0  # STEP phase after `step` updates
    if step0 == 0 and not any("val_loss" in r for r in history):
        history.append({"step": 0, "val_loss": evaluate(state)})
    stop_before_training()

    rt.warm_host_programs(state)  # the mask refresh / flip-rate programs: compiled here, not inside timed steps
    stop_before_training()
    bar = Progress(stop, step0, f"{recipe:>5s}", quiet=args.quiet)
    log = TrainLog(history, elapsed_prev, tokens_prev)  # history, tokens/s, the progress line's numbers
    diverged = None  # what was not finite, at which step
    try:
        compiled = set()
        # Ctrl-C only sets INTERRUPT.requested (gpt_errors): read here, after each step (the first of a
        # phase compiles), its evaluation and its checkpoint; with several processes, on the steps that
        # log, where they agree (stop_agreed)
        multi = jax.process_count() > 1
        while step < stop and not (INTERRUPT.requested and not multi):
            flag = exp.sparse_at(step, phase)
            new_program = flag not in compiled  # first step of a phase compiles: keep it out of tokens/s
            if new_program:
                log.untimed()
                compiled.add(flag)
                INTERRUPT.pause("compile", wait=False)  # test hook
            tokens = put(data.batch(step))
            state, m = rt.run_step(state, tokens, step, flag)  # + srste's mask refresh when due
            step += 1
            if exp.needs_phase() and not phase:  # STEP's dense phase: read the switch (a sync)
                phase = step_phase(state)
            log.step(step, m, B * T)
            if exp.starts_finetune(step):
                # --finetune-start: the state the dense fine-tune starts from, before this step's
                # evaluation and checkpoint (so both see it) and the first dense step; its compilation
                # stays out of tokens/s
                log.untimed()
                state = rt.start_finetune(state)
            do_eval = step % eval_every == 0 or step == steps
            do_ckpt = ckpt_every > 0 and (step % ckpt_every == 0 or step == stop)
            if new_program or step % log_every == 0 or do_eval or do_ckpt:
                log.flush()  # ends the timed interval (after a new program: the untimed compile step)
                if log.bad is not None:  # a non-finite loss or gradient norm: stop before eval / checkpoint
                    diverged = _diverged_what(log.bad)
                    break
                if new_program:
                    # Move what compiling left alive (jaxprs, lowered modules, ...) out of the
                    # collector's reach: a full collection that scans it stalls the step loop for up
                    # to ~0.7 s in the benchmark's process (bench_train_gpt.py --gc on). Undone below.
                    gc.collect()
                    gc.freeze()
                if do_eval:
                    INTERRUPT.pause("eval")  # test hook
                    val = evaluate(state)
                    log.val(step, val)
                    if not math.isfinite(val):
                        diverged = (step, f"validation loss ({val})")
                        break
                if do_ckpt and not save(state, step, log):
                    diverged = (step, "train state (a parameter or optimizer moment)")
                    break
                if do_eval or do_ckpt:
                    log.restart_timer()
                bar.update(step, **log.fields())
                if multi and stop_agreed():
                    break
    except KeyboardInterrupt:  # no handler installed (train() called from a thread, or by another program)
        INTERRUPT.requested = True
    finally:
        gc.unfreeze()  # collectable again (callers that train several times); also undoes a caller's own gc.freeze()
    log.flush()
    if diverged is None and log.bad is not None:
        diverged = _diverged_what(log.bad)
    interrupted = diverged is None and stop_agreed()
    if interrupted and ckpt_every > 0 and step > step0 and not save(state, step, log):
        diverged = (step, "train state (a parameter or optimizer moment)")
        interrupted = False
    bar.close()

    # Phase marker for the plot.
    phase_step, phase_label = None, ""
    if exp.switch_step is not None:
        phase_step, phase_label = exp.switch_step, "dense fine-tune"
    elif exp.recipe.get("step"):
        switched = [r["step"] for r in history if r.get("sparse")]
        if switched:
            phase_step, phase_label = switched[0], "STEP: sparse phase"
    if interrupted and step == step0:  # stopped by the fallback above before any step: nothing new
        stop_before_training()
    write_jsonl(metrics_path, history)
    vals = [r["val_loss"] for r in history if "val_loss" in r]
    full = {}
    if not interrupted and diverged is None and args.final_eval_tokens > 0:  # outside the loop: not in tokens/s
        batches = data.final_val_batches(int(args.final_eval_tokens))
        full_loss = evaluate(state, batches, interruptible=True)
        if stop_agreed():
            interrupted = True
        else:
            full = {"final_val_loss_full": full_loss,
                    "final_eval_tokens": len(batches) * batches[0].shape[0] * (batches[0].shape[1] - 1)}
    interrupted = interrupted or (diverged is None and stop_agreed())
    train_losses = [r["loss"] for r in history if "loss" in r and math.isfinite(r["loss"])]
    summary = {
        "recipe": recipe, "size": hp["size"], "steps_done": step, "steps": steps,
        "final_val_loss": vals[-1] if vals else None,
        # from the history, so that a resumed run that trains no step keeps it
        "final_train_loss": train_losses[-1] if train_losses else None,
        "tokens_per_s": (log.train_tokens / log.train_time) if log.train_time > 0 else None,
        "train_time_s": log.train_time, "n_params": n_params, "n_sparse_params": n_sparse,
        "phase_step": phase_step, "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(), "config": config, "interrupted": interrupted, **full,
    }
    if diverged is not None:
        summary["diverged_at_step"] = diverged[0]
    if is_writer():
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    flip_label = (f"mask flip rate (per refresh, every {hp['mask_every']} steps)" if exp.cfg.method == "srste"
                  else "2:4 mask flip rate (per update, on logging steps)")
    plot_run(history, out / "loss.png", f"{recipe} ({hp['size']})", phase_step, phase_label, flip_label)
    summary["history"] = history
    if diverged is not None:
        at, what = diverged
        kept = (f"the last good checkpoint is step {last_saved} in {ckpts.dir} (resuming repeats the same updates: "
                "start over with other flags, e.g. a lower --lr)" if last_saved is not None else
                "no checkpoint was written")
        raise Diverged(f"{label}training diverged at step {at}: non-finite {what}; stopped without checkpointing "
                       f"it: {kept}")
    if interrupted or INTERRUPT.requested:
        if not interrupted:  # Ctrl-C after the run had finished (its summary and plot written)
            raise Interrupted(f"{label}interrupted after the run finished ({step} steps): everything was saved "
                              f"in {out}")
        if ckpt_every == 0:
            raise Interrupted(f"{label}interrupted at step {step}: no checkpoint saved (--ckpt-every 0), so it "
                              f"cannot be resumed; metrics.jsonl and summary.json are in {out}")
        saved_now = "saved" if last_saved == step else "is the latest"
        raise Interrupted(f"{label}interrupted at step {step}: checkpoint step {last_saved} {saved_now} in "
                          f"{ckpts.dir}{_resume_hint(argv)}")
    return summary


def stop_agreed() -> bool:
    """Whether to stop for Ctrl-C here (:data:`gpt_errors.INTERRUPT`). With several processes
    (``--distributed``) every process calls it at the same points and they stop together if any of them
    was interrupted (a collective: one process saving while another trains on would hang both)."""
    if jax.process_count() == 1:
        return INTERRUPT.requested
    from jax.experimental import multihost_utils

    if np.max(multihost_utils.process_allgather(np.int32(INTERRUPT.requested))):
        INTERRUPT.requested = True
    return INTERRUPT.requested


def _diverged_what(row: dict) -> tuple[int, str]:
    """``(step, what)`` of the first history row with a non-finite loss or gradient norm."""
    bad = [f"{k.replace('_', ' ')} ({row[k]})" for k in ("loss", "grad_norm") if not math.isfinite(row[k])]
    return row["step"], "training " + " and ".join(bad)


@jax.jit
def _all_finite(tree):
    """Whether every float array of ``tree`` (a train state) is finite (one device reduction)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.bool_(True)


def _finished_summary(out: Path, config: dict, args) -> "dict | None":
    """The summary of a finished run in ``out`` (all its steps, not interrupted, not diverged, the same
    config, the final evaluation if one is asked for); None if there is none to keep."""
    try:
        s = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if (not isinstance(s, dict) or s.get("interrupted") or "diverged_at_step" in s or s.get("config") != config
            or s.get("steps_done") != s.get("steps") or s.get("final_train_loss") is None
            or (args.final_eval_tokens > 0 and "final_val_loss_full" not in s)):
        return None
    return s


def _resume_hint(argv) -> str:
    """``; resume with: python benchmarks/harness/train_gpt.py ... --resume`` (the command line of ``main``, or
    ``; continue with --resume`` when train() was not called by it)."""
    if argv is None:
        return "; continue with the same flags and --resume"
    rest, skip = [], False
    for a in map(str, argv):
        if skip:
            skip = False
            continue
        if a in ("--resume", "--overwrite"):
            continue
        if a == "--resume-from":
            skip = True
            continue
        if a.startswith("--resume-from="):
            continue
        rest.append(a)
    script = os.path.relpath(_HERE / "train_gpt.py")
    if script.startswith(".."):
        script = str(_HERE / "train_gpt.py")
    if jax.process_count() > 1:  # --distributed: every process again, e.g. through examples/launch.py
        return f"; resume with the same launcher and: {shlex.join([script, *rest, '--resume'])}"
    return f"; resume with: python {shlex.join([script, *rest, '--resume'])}"


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    """The command line: exit code 0, 2 (bad input: one line, nothing written), 1 (training diverged:
    one line naming the step) or 130 (Ctrl-C: one line saying what was saved and how to resume)."""
    with INTERRUPT.handling():
        return _main(sys.argv[1:] if argv is None else list(argv))


def _main(argv: list) -> int:
    ap = build_parser()
    args = ap.parse_args([str(a) for a in argv])
    args.argv = [str(a) for a in argv]  # the resume hint of an interrupted run
    try:
        if args.distributed:  # before any other JAX call
            init_distributed()
            args.quiet = args.quiet or not is_writer()
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
            if flag_or_size_default(args, name) < (0 if name == "ckpt_every" else 1):
                raise CLIError(f"--{name.replace('_', '-')} must be >= {0 if name == 'ckpt_every' else 1}")
        if args.stop_at is not None and args.stop_at < 1:
            raise CLIError("--stop-at must be >= 1")
        if not args.final_eval_tokens >= 0:
            raise CLIError(f"--final-eval-tokens must be >= 0 (0: off), got {args.final_eval_tokens:g}")
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
        data = load_data(args.data, seq_len, batch, args.seed, flag_or_size_default(args, "eval_batches"), val_path=args.val_data)
        args.vocab_size, args.tokenizer_sha256 = data.vocab_size, data.tokenizer_sha256  # resolve_flags: hp
        if args.compare is not None:
            precheck_compare_out(args.out, args.resume, args.overwrite)
        for r in recipes:
            precheck_out(outs[r], args.resume, args.overwrite, args.resume_from)
        if args.resume:  # refuse mismatched / corrupt checkpoints before training anything
            for r in recipes:
                hp = resolve_flags(args, r)
                ck = Checkpoints(outs[r] / "ckpt")
                try:
                    saved_config = ck.read_meta(ck.steps()[-1] if args.resume_from is None else args.resume_from)["config"]
                except Exception:  # noqa: BLE001 (a corrupt checkpoint: check_resume says so)
                    saved_config = None
                if saved_config is not None:
                    check_tokenizer(saved_config, data, ck.dir)
                check_resume(Checkpoints(outs[r] / "ckpt"), hp, run_config(hp, data.sha256), args.resume_from)
        print(f"{PROG}: {len(data.train)} train / {len(data.val)} val {data.unit} from {data.path}"
              + (f" (val: {data.val_path})" if data.val_path else "")
              + (f" (vocabulary {data.vocab_size})" if data.vocab_size else "")
              + f"; {jax.device_count()} {jax.default_backend()} device(s)", file=sys.stderr)
        INTERRUPT.pause("startup")
        if stop_agreed():
            raise Interrupted("interrupted during start-up: nothing was saved")
        summaries = []
        for r in recipes:
            if stop_agreed():  # --compare: Ctrl-C after a recipe had finished
                raise Interrupted(f"interrupted after {', '.join(s['recipe'] for s in summaries)} finished: "
                                  f"{', '.join(recipes[len(summaries):])} not started")
            s = train(args, r, outs[r], data, mesh)
            summaries.append(s)
            if s.get("already_finished"):
                print(f"{PROG}: {r}: already finished ({s['steps_done']} steps, final val loss "
                      f"{fmt(s['final_val_loss'], '.4f')}); its summary.json is kept -> {outs[r]}", file=sys.stderr)
                continue
            if s["steps_done"] < s["steps"]:
                saved = Checkpoints(outs[r] / "ckpt").steps()
                how = (f"checkpoint of step {saved[-1]} in {outs[r] / 'ckpt'}; continue with the same flags and "
                       "--resume instead of --stop-at" if saved and saved[-1] == s["steps_done"] else
                       "no checkpoint was written (--ckpt-every 0), so it cannot be resumed")
                print(f"{PROG}: {r}: stopped at step {s['steps_done']} of {s['steps']} (--stop-at): {how} "
                      f"-> {outs[r]}", file=sys.stderr)
                continue
            full = ("" if "final_val_loss_full" not in s else
                    f" ({s['final_val_loss_full']:.4f} over {s['final_eval_tokens']:,} val tokens)")
            print(f"{PROG}: {r}: final val loss {fmt(s['final_val_loss'], '.4f')}{full}, "
                  f"{fmt(s['tokens_per_s'], '.0f')} tokens/s, {s['steps_done']} steps -> {outs[r]}",
                  file=sys.stderr)
        if args.compare is not None:
            plot_compare({s["recipe"]: s["history"] for s in summaries}, args.out / "compare.png",
                         f"{args.size}")
            write_compare(args.out, summaries, compare_speed=s24.cuda_kernels_available())
    except CLIError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except Diverged as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        INTERRUPT.done()  # no "still stopping" line after this one
        print(f"{PROG}: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # without the handler (main() called from a thread): anywhere
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
