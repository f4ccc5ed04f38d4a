#!/usr/bin/env python
"""Quality at a fixed token budget: dense vs every 2:4 recipe, from one seed on the same batches.

Every recipe is one run of the example's training loop (``benchmarks/harness/train_gpt.py``'s ``train``:
the same flags, init, data stream, schedules, srste's dense fine-tune and STEP's switch), with the
same ``--seed`` — so the same initial weights and the same batch at every step — and
``--tokens / (batch x seq_len)`` optimizer steps. Recipes: ``dense``, ``srste``, ``sste``, ``ste``,
``step`` and ``dense-tail`` (srste for the first ``1 - --tail-fraction`` of the steps, then dense:
srste with ``--finetune-fraction`` = ``--tail-fraction``). ``NAME:FLAGS`` adds example flags to one
entry, e.g. ``srste-a0:srste --decay-alpha 0`` (a label, a colon, the recipe and its flags).

Data (``--data``, as the example's): a text file whose UTF-8 bytes are the tokens (vocabulary
256; ``--val-data`` validates, else its last 10%), or a directory of token shards written by
``examples/prepare_data.py`` (its subword tokenizer; the model's vocabulary is the index's, the
validation split its ``val.bin``). The table and JSON name the tokenizer and the vocabulary.

Writes ``benchmarks/results/quality_<tag>.json`` / ``.md`` (final val loss, vs dense, final train
loss, tokens/s, the largest one-step loss spike) and ``quality_<tag>.png`` (validation curves, and
each recipe's gap to dense). Default tag: ``<size>_<backend>``.

The JSON is compact (:func:`compact_run`): per run every validation record (``val_history``), the
summaries the table takes from the per-step train records (spike and its step, the tail train loss,
the best val loss and its step) computed from all of them, and the train loss / gradient norm / flip
rate thinned to at most :data:`TRACE_POINTS` buckets (``train_trace``, mean / min / max of each). The
full per-step history goes to ``--history-out FILE`` on request (and stays in ``--runs DIR``);
``--compact FILE...`` rewrites a result JSON of the older full form in place.

    python benchmarks/bench_quality.py --size tiny \\
        --data /path/realtext_train.txt --val-data /path/realtext_val.txt        # CPU (bytes), a few minutes
    python benchmarks/bench_quality.py --size gpt2 --tokens 50e6 --data ... --val-data ...    # GPU

    # with a subword tokenizer: tokenize once, then train every recipe on the shards
    python examples/prepare_data.py --data /path/realtext_train.txt --val /path/realtext_val.txt \\
        --out data/realtext_bpe32k --vocab-size 32000
    python benchmarks/bench_quality.py --size gpt2 --tokens 100e6 --data data/realtext_bpe32k \\
        --tag gpt2_h100_realtext_bpe32k_100m                                       # GPU

    # the same in three processes of two recipes each, then the table of all six:
    python benchmarks/bench_quality.py --size gpt2 --tokens 50e6 --data ... --val-data ... \
        --runs runs/bq_gpt2 --recipes dense,srste          # then sste,ste and step,dense-tail
    python benchmarks/bench_quality.py --report-only --runs runs/bq_gpt2 --tag gpt2_h100_realtext

``spike`` = the largest ratio of a step's train loss to the mean of the 10 steps before it
(steps 11 onward); a value above 1.5 is a loss spike.

Several processes (e.g. one per GPU session slot): with ``--runs DIR`` every finished recipe is
saved as ``DIR/<label>/result.json``, and the table and plot are built from every result in
``DIR`` with the same setup (size, steps, batch, seed, data, evaluation, ``--flags``) — so
``--recipes dense,srste --runs DIR`` then ``--recipes sste,ste --runs DIR`` (same other flags)
leaves the table of all four; ``--report-only --runs DIR`` rebuilds it without training. A result
of another setup in ``DIR`` is an error (use another ``DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import train_gpt  # noqa: E402  (also puts the repo root on sys.path if needed)

ALL = ["dense", "srste", "sste", "ste", "step", "dense-tail"]
SPIKE_WINDOW = 10
#: the tokenizer of a text ``--data`` (and of results written before the table named one)
BYTES = "bytes (the UTF-8 bytes of the text)"


def describe_tokenizer(data) -> tuple[str, int]:
    """``(tokenizer, vocabulary size)`` of the example's data object (``ByteData`` or ``TokenData``)."""
    index = getattr(data, "index", None)
    if index is None:
        return BYTES, 256
    tok = index["tokenizer"]
    if tok["type"] == "bytes":
        return "bytes (prepare_data.py --tokenizer bytes)", int(data.vocab_size)
    return (f"byte-level BPE of prepare_data.py (Hugging Face tokenizers; tokenizer.json sha256 "
            f"{tok['sha256'][:12]})", int(data.vocab_size))


def parse_entry(entry: str, tail_fraction: float) -> tuple[str, str, list[str]]:
    """``NAME`` or ``NAME:RECIPE FLAGS...`` -> (label, recipe, extra example flags)."""
    label, sep, spec = entry.partition(":")
    label = label.strip()
    if sep:
        words = shlex.split(spec)
        if not words:
            raise ValueError(f"{entry!r}: no recipe after ':'")
        recipe, extra = words[0], words[1:]
    elif label == "dense-tail":
        recipe, extra = "srste", ["--finetune-fraction", repr(tail_fraction)]
    else:
        recipe, extra = label, []
    if recipe not in train_gpt.RECIPES or train_gpt.RECIPES[recipe].get("ast"):
        raise ValueError(f"{entry!r}: unknown recipe {recipe!r}")
    return label, recipe, extra


def split_entries(spec: str) -> list[str]:
    """Comma-separated entries; a comma inside ``NAME:FLAGS`` is not expected (flags take no commas)."""
    return [e.strip() for e in spec.split(",") if e.strip()]


def spike(history: list[dict], window: int = SPIKE_WINDOW) -> tuple[float, int | None]:
    """(largest loss / mean of the previous ``window`` losses, its step); (0, None) if too short."""
    rows = [r for r in history if "loss" in r]
    losses = np.array([r["loss"] for r in rows], dtype=np.float64)
    best, at = 0.0, None
    for i in range(window, len(losses)):
        ratio = losses[i] / losses[i - window:i].mean()
        if ratio > best:
            best, at = float(ratio), rows[i]["step"]
    return best, at


#: the fraction of the last steps whose train losses :func:`tail_train_loss` averages
TAIL_FRACTION = 0.05


def tail_train_loss(history: list[dict], fraction: float = TAIL_FRACTION) -> float | None:
    """Mean train loss of the last ``fraction`` of the logged steps (at least one): every recipe
    sees the same batches, so the ratio of two recipes' values is a paired comparison over many
    more tokens than the validation windows (but it is a *train* loss: on a corpus seen several
    times it also measures memorisation)."""
    losses = [r["loss"] for r in history if "loss" in r]
    if not losses:
        return None
    n = max(1, int(round(len(losses) * fraction)))
    return float(np.mean(losses[-n:]))


def _val_series(history):
    return [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]


#: the most points of a run's thinned train series (``train_trace``) in the result JSON
TRACE_POINTS = 300
#: the per-step series thinned, and the bucket statistics kept of each
TRACE_STATS = {"loss": ("mean", "min", "max"), "grad_norm": ("mean", "max"), "flip": ("mean",),
               "step_z": ("mean",)}
TRACE_DIGITS = 6


def _sig(x: float) -> float:
    return float(f"{x:.{TRACE_DIGITS}g}")


def thin_train(history: list[dict], points: int = TRACE_POINTS) -> dict:
    """The train records of ``history`` (rows with a ``loss``) in at most ``points`` buckets of ``k``
    consecutive logged steps (``k = ceil(n / points)``; the last bucket may be shorter): for each series of
    :data:`TRACE_STATS` present, the bucket's statistics as ``<series>_<stat>`` lists; ``step`` is each
    bucket's last step. ``sparse_steps``: the ``[first, last]`` step ranges that trained sparse (exact)."""
    rows = [r for r in history if "loss" in r]
    n = len(rows)
    k = max(1, -(-n // points))
    buckets = [rows[i:i + k] for i in range(0, n, k)]
    out = {"thinning": f"buckets of {k} consecutive logged train steps (the last may be shorter), at most {points}; "
                       f"step: each bucket's last step; <series>_<stat>: mean / min / max over the bucket's steps that "
                       f"logged the series (null: none did), {TRACE_DIGITS} significant digits",
           "bucket_steps": k, "steps_logged": n, "step": [b[-1]["step"] for b in buckets]}
    for key, stats in TRACE_STATS.items():  # over the steps that logged it (flip: the mask-update steps)
        vals = [np.array([r[key] for r in b if r.get(key) is not None], dtype=np.float64) for b in buckets]
        if not any(v.size for v in vals):
            continue
        for stat in stats:
            out[f"{key}_{stat}"] = [_sig(getattr(np, stat)(v)) if v.size else None for v in vals]
    ranges, prev = [], None  # prev: the previous logged step
    for r in rows:
        if r.get("sparse"):
            if ranges and ranges[-1][1] == prev:
                ranges[-1][1] = r["step"]
            else:
                ranges.append([r["step"], r["step"]])
        prev = r["step"]
    out["sparse_steps"] = ranges
    return out


def compact_run(run: dict) -> dict:
    """A run's record as the result JSON keeps it: without the per-step ``history``, with every validation
    record (``val_history``), the summaries the table and plots take from the per-step records computed from
    all of them (``tail_train_loss``, ``best_val_loss`` / ``best_val_step``, and ``spike`` / ``spike_step``
    where the record lacks them) and the thinned train series (``train_trace``, :func:`thin_train`). A record
    that is already compact is returned as it is."""
    if "history" not in run:
        return run
    out = {k: v for k, v in run.items() if k != "history"}
    history = run["history"]
    if "spike" not in out:
        out["spike"], out["spike_step"] = spike(history)
    out["tail_train_loss"] = tail_train_loss(history)
    out["best_val_loss"], out["best_val_step"] = best_val_loss(history)
    out["val_history"] = [{"step": r["step"], "val_loss": r["val_loss"]} for r in history if "val_loss" in r]
    out["train_trace"] = thin_train(history)
    return out


def compact_result(res: dict) -> dict:
    """``res`` with every run compact (:func:`compact_run`)."""
    return dict(res, runs={k: compact_run(r) for k, r in res["runs"].items()})


def best_val_loss(history: list[dict]) -> tuple[float, int] | tuple[None, None]:
    """``(lowest validation loss, its step)`` over the run's evaluations after step 0. When the budget covers
    the corpus several times the final value also measures memorisation (it rises again); the lowest one
    compares the recipes as early stopping would."""
    s = [(v, t) for t, v in _val_series(history) if t > 0]
    return min(s) if s else (None, None)


def plot(res: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    tok_step = res["batch_size"] * res["seq_len"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    res = compact_result(res)
    dense = dict(_val_series(res["runs"]["dense"]["val_history"])) if "dense" in res["runs"] else None
    late = []  # gaps of the last three quarters: the y range (an early spike would flatten the rest)
    for i, (label, r) in enumerate(res["runs"].items()):
        s = _val_series(r["val_history"])
        x = np.array([t for t, _ in s]) * tok_step / 1e6
        y = np.array([v for _, v in s])
        ax1.plot(x, y, "o-", ms=3, lw=1.5, color=f"C{i}", label=f"{label} ({y[-1]:.4f})")
        if dense is not None and label != "dense":
            gap = [(t, 100 * (v / dense[t] - 1)) for t, v in s if t in dense and t > 0]
            ax2.plot(np.array([t for t, _ in gap]) * tok_step / 1e6, [g for _, g in gap], "o-", ms=3, lw=1.5,
                     color=f"C{i}", label=label)
            late += [g for t, g in gap if t >= res["steps"] // 4]
    title = f"{res['size']} ({res['n_params'] / 1e6:.1f}M params), {res['tokens'] / 1e6:.2f}M tokens, {res['data_name']}"
    ax1.set_xlabel("training tokens (M)")
    ax1.set_ylabel(f"validation loss (nats/{'byte' if res.get('unit', 'bytes') == 'bytes' else 'token'})")
    ax1.set_title(title, fontsize=10)
    ax1.set_yscale("log")
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xlabel("training tokens (M)")
    ax2.set_ylabel("val loss vs dense (%)")
    ax2.set_title("gap to dense at each evaluation (y range: the last 3/4 of the steps)", fontsize=10)
    if late:
        lo, hi = min(late + [0.0]), max(late + [0.0])
        pad = max(0.5, 0.15 * (hi - lo))
        ax2.set_ylim(lo - pad, hi + pad)
    ax2.grid(alpha=0.3)
    if ax2.lines[1:]:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def to_markdown(res: dict) -> str:
    res = compact_result(res)  # the summaries of the per-step records: computed at write time
    commands = list(dict.fromkeys(r.get("command", res["command"]) for r in res["runs"].values())) or [res["command"]]
    lines = [f"# Quality at a fixed token budget: {res['size']} on {res['data_name']} ({res['device']})", ""]
    corpus = ("" if res.get("train_tokens") is None else
              f"; {res['train_tokens']:,} train / {res['val_tokens']:,} val tokens")
    if len(commands) == 1:
        lines += [f"Command: `{commands[0]}`", ""]
    else:
        lines += [f"Commands ({len(commands)} processes, one `--runs` directory, merged):", ""]
        lines += [f"* `{c}`" for c in commands] + [""]
    lines += [
             f"Tokenizer: {res.get('tokenizer', BYTES)}; vocabulary {res.get('vocab_size', 256):,}{corpus}.", "",
             f"{res['steps']} steps x {res['batch_size']} x {res['seq_len']} = {res['tokens']:,} training tokens per "
             f"recipe, seed {res['seed']} (same init, same batches); val loss over {res['eval_batches']} x "
             f"{res['batch_size']} windows of {res['val_name']}; jax {res['jax']}.", "",
             f"| recipe | flags | final val loss | vs dense | full val | vs dense | best val loss (M tokens) | vs dense "
             f"| train loss, last {100 * TAIL_FRACTION:g}% of steps | vs dense | tokens/s | spike (step) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    seen = res.get("train_tokens") or res.get("train_bytes")
    if seen:
        passes = res["tokens"] / seen
        lines[-2:-2] = [f"The budget covers the training text {passes:.1f} times." if passes >= 1 else
                        f"The budget covers {100 * passes:.2g}% of the training text.", ""]
    dense = res["runs"].get("dense")
    dense_tail = None if dense is None else dense["tail_train_loss"]

    def ratio(a, b):
        return "-" if a is None or b is None else f"{100 * (a / b - 1):+.2f}%"

    for label, r in res["runs"].items():
        vs = "-" if not dense or label == "dense" else ratio(r["final_val_loss"], dense["final_val_loss"])
        full = r.get("final_val_loss_full")
        vs_full = "-" if not dense or label == "dense" else ratio(full, dense.get("final_val_loss_full"))
        full_s = "-" if full is None else f"{full:.4f}"
        best, at = r["best_val_loss"], r["best_val_step"]
        best_s = "-" if best is None else f"{best:.4f} ({at * res['batch_size'] * res['seq_len'] / 1e6:.1f})"
        vs_best = "-" if not dense or label == "dense" else ratio(best, dense["best_val_loss"])
        tail = r["tail_train_loss"]
        vs_tail = "-" if not dense or label == "dense" else ratio(tail, dense_tail)
        flags = " ".join([r["recipe"], *r["extra"]])
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        sp = f"{r['spike']:.2f}" + ("" if r["spike_step"] is None else f" ({r['spike_step']})")
        tail_s = "-" if tail is None else f"{tail:.4f}"
        lines.append(f"| {label} | `{flags}` | {r['final_val_loss']:.4f} | {vs} | {full_s} | {vs_full} | "
                     f"{best_s} | {vs_best} | "
                     f"{tail_s} | {vs_tail} | "
                     f"{tps} | {sp} |")
    toks = sorted({r.get("final_eval_tokens") for r in res["runs"].values()} - {None})
    lines += ["", "`full val`: one more evaluation after the last step on "
              + (f"{', '.join(f'{t:,}' for t in toks)} val tokens" if toks else "many more val tokens")
              + " (non-overlapping windows over the val text; `--final-eval-tokens`); `-`: a run without it.",
              "", "`best val loss`: the lowest of the run's evaluations and when it came (millions of training "
              "tokens) — where the budget covers the text more than once the final loss rises again as the model "
              "memorises, and the best one compares the recipes as early stopping would.",
              "", f"`train loss, last {100 * TAIL_FRACTION:g}%`: the mean train loss of the last "
              f"{100 * TAIL_FRACTION:g}% of the steps — the same batches for every recipe, so a paired comparison "
              "over far more tokens than the validation windows (but a train loss: it also counts memorisation "
              "when the budget covers the corpus more than once).",
              "", f"`spike` = the largest ratio of a step's train loss to the mean of the {SPIKE_WINDOW} steps before "
              "it (above 1.5: a loss spike). tokens/s excludes compilation and evaluation. Plot: "
              f"`quality_{res['tag']}.png`.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=list(train_gpt.SIZES))
    ap.add_argument("--tokens", type=float, default=None,
                    help="training tokens per recipe (default: the size's default steps x batch x seq_len)")
    ap.add_argument("--recipes", default=",".join(ALL),
                    help="comma-separated entries: a recipe, dense-tail, or NAME:RECIPE FLAGS (example flags)")
    ap.add_argument("--tail-fraction", type=float, default=0.5, help="dense-tail: the dense fraction of the steps")
    ap.add_argument("--data", type=Path, default=train_gpt.DEFAULT_DATA,
                    help="training text (bytes are the tokens) or a token directory of examples/prepare_data.py "
                         "(its subword tokenizer and vocabulary); the example's --data")
    ap.add_argument("--val-data", type=Path, default=None,
                    help="validation text of a text --data (the example's --val-data; a token directory has its own)")
    ap.add_argument("--evals", type=int, default=12, help="validation evaluations per run (besides step 0)")
    ap.add_argument("--eval-batches", type=int, default=None, help="val batches per evaluation (default: per size)")
    ap.add_argument("--final-eval-tokens", type=float, default=2**20,
                    help="a last evaluation of each recipe on about this many val tokens (non-overlapping windows, "
                         "at most the whole val text; the example's --final-eval-tokens): the table's 'full val' "
                         "column (0: off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flags", default="",
                    help="example flags for every recipe, e.g. '--batch-size 8 --n-layer 1' (quoted)")
    ap.add_argument("--runs", type=Path, default=None,
                    help="keep each run's metrics.jsonl/summary.json/loss.png here (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default=None, help="results file name: quality_<tag>.json/.md/.png")
    ap.add_argument("--history-out", type=Path, default=None,
                    help="also write every run's full per-step history here (JSON; the result JSON keeps the "
                         "validation records, the summaries and a thinned train series)")
    ap.add_argument("--compact", type=Path, nargs="+", metavar="JSON", default=None,
                    help="train nothing: rewrite these quality_<tag>.json files of the older form (a per-step "
                         "history per run) in the compact form, in place")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: build the table and plot from the results saved in --runs (all of them, "
                         "or the --recipes labels given, in that order)")
    a = ap.parse_args(argv)

    def fail(msg):
        print(f"bench_quality.py: error: {msg}", file=sys.stderr)
        return 2

    if a.compact:
        for path in a.compact:
            try:
                res = json.loads(path.read_text())
                res["runs"]  # noqa: B018
            except (OSError, ValueError, KeyError, TypeError) as e:
                return fail(f"{path}: not a bench_quality result ({e})")
            path.write_text(dump_result(compact_result(res)))
            print(f"compacted {path}", file=sys.stderr)
        return 0
    if a.report_only:
        if a.runs is None:
            return fail("--report-only needs --runs DIR (the directory the recipes were trained into)")
        try:
            labels = [e.partition(":")[0].strip() for e in split_entries(a.recipes)]
            res = load_runs(a.runs, None if a.recipes == ",".join(ALL) else labels)
        except ValueError as e:
            return fail(str(e))
        if a.tag:
            res["tag"] = a.tag
        return write_report(res, a.out, a.history_out)
    try:
        entries = [parse_entry(e, a.tail_fraction) for e in split_entries(a.recipes)]
    except ValueError as e:
        return fail(str(e))
    labels = [lab for lab, _, _ in entries]
    if not entries or len(set(labels)) != len(labels):
        return fail(f"--recipes: empty or a label twice: {a.recipes}")
    if not 0 < a.tail_fraction < 1 or a.evals < 1:
        return fail("--tail-fraction must be in (0, 1) and --evals >= 1")
    common = shlex.split(a.flags)
    base = train_gpt.build_parser().parse_args(["--size", a.size, *common])
    d = train_gpt.SIZE_DEFAULTS[a.size]
    batch, seq = base.batch_size or d["batch_size"], base.seq_len or d["seq_len"]
    steps = base.steps or d["steps"]
    if a.tokens is not None:
        steps = int(a.tokens) // (batch * seq)
        if steps < 1:
            return fail(f"--tokens {a.tokens:g} is less than one step ({batch} x {seq} tokens)")
    eval_every = max(1, steps // a.evals)
    eval_batches = a.eval_batches or d["eval_batches"]
    try:
        data = train_gpt.load_data(a.data, seq, batch, a.seed, eval_batches, val_path=a.val_data)
    except train_gpt.CLIError as e:
        return fail(str(e))
    tokenizer, vocab = describe_tokenizer(data)
    by_bytes = data.unit == "bytes"
    backend = jax.default_backend()
    tag = a.tag or f"{a.size}_{backend}"

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    res = {"size": a.size, "steps": steps, "batch_size": batch, "seq_len": seq, "tokens": steps * batch * seq,
           "seed": a.seed, "eval_every": eval_every, "eval_batches": eval_batches, "tag": tag,
           "data": str(a.data), "val_data": None if a.val_data is None else str(a.val_data),
           "data_name": a.data.name,
           "val_name": (a.val_data.name if a.val_data else data.val_path.name if data.val_path else
                        f"the last 10% of {a.data.name}" if by_bytes else f"{a.data.name}/val.bin"),
           "data_sha256": data.sha256, "tokenizer": tokenizer, "vocab_size": vocab,
           "tokenizer_sha256": data.tokenizer_sha256, "unit": data.unit,
           "train_tokens": len(data.train), "val_tokens": len(data.val),
           **({"train_bytes": len(data.train), "val_bytes": len(data.val)} if by_bytes else {}),
           "device": f"{backend}: {jax.devices()[0].device_kind}", "jax": jax.__version__,
           "flags": common,
           "command": "python benchmarks/bench_quality.py " + shlex.join(sys.argv[1:] if argv is None else argv),
           "runs": {}}
    if a.runs is not None:
        try:  # a results directory of another setup: refuse before training anything
            load_runs(a.runs, None, expect=res)
        except ValueError as e:
            return fail(str(e))
    log(f"{a.size}: {steps} steps x {batch} x {seq} = {res['tokens']:,} tokens per recipe; "
        f"{len(data.train):,} train / {len(data.val):,} val {data.unit}; tokenizer: {tokenizer}, vocabulary {vocab:,}")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = a.runs or Path(tmp)
        for label, recipe, extra in entries:
            argv_r = ["--size", a.size, "--recipe", recipe, *common, "--steps", str(steps), "--seed", str(a.seed),
                      "--eval-every", str(eval_every), "--eval-batches", str(eval_batches), "--ckpt-every", "0",
                      "--final-eval-tokens", repr(a.final_eval_tokens), "--quiet", "--overwrite", *extra]
            args = train_gpt.build_parser().parse_args(argv_r)
            args.vocab_size, args.tokenizer_sha256 = data.vocab_size, data.tokenizer_sha256  # as train_gpt.main
            try:
                s = train_gpt.train(args, recipe, runs_dir / _dir_name(label), data, None)
            except (train_gpt.CLIError, train_gpt.Diverged) as e:  # a diverged recipe: its step, not a traceback
                return fail(f"{label}: {e}")
            sp, at = spike(s["history"])
            res["runs"][label] = {
                "recipe": recipe, "extra": extra, "final_val_loss": s["final_val_loss"],
                "final_val_loss_full": s.get("final_val_loss_full"), "final_eval_tokens": s.get("final_eval_tokens"),
                "final_train_loss": s["final_train_loss"], "tokens_per_s": s["tokens_per_s"],
                "train_time_s": s["train_time_s"], "phase_step": s["phase_step"], "spike": sp, "spike_step": at,
                "n_params": s["n_params"], "device": res["device"], "command": res["command"],
                "config": s["config"], "history": s["history"]}
            res["n_params"] = s["n_params"]
            if a.runs is not None:
                header = {k: v for k, v in res.items() if k != "runs"}
                # atomically: processes sharing --runs merge each other's results when they finish
                tmp_file = runs_dir / _dir_name(label) / (RESULT + ".tmp")
                tmp_file.write_text(json.dumps({"setup": header, "run": res["runs"][label]}, indent=1) + "\n")
                os.replace(tmp_file, runs_dir / _dir_name(label) / RESULT)
            log(f"  {label:<12s} val {s['final_val_loss']:.4f}  spike {sp:.2f} (step {at})  "
                f"{s['tokens_per_s'] or 0:,.0f} tokens/s")
    if hasattr(data, "close"):  # TokenData: its prefetch thread
        data.close()
    res["total_time_s"] = time.perf_counter() - t_start
    log(f"trained {len(entries)} recipe(s) in {res['total_time_s']:.0f}s")
    if a.runs is not None:  # the table of every recipe in the runs directory (earlier processes too)
        try:
            merged = load_runs(a.runs, None, expect=res)
        except ValueError as e:  # another process's result that does not fit: this run's own is saved
            return fail(f"{e} (this run's results are saved in {a.runs}; merge with --report-only)")
        merged["tag"] = tag
        res = merged
    return write_report(res, a.out, a.history_out)


#: each recipe's result in a ``--runs`` directory: ``<runs>/<label>/result.json``
RESULT = "result.json"
#: setup fields that must agree for results to share a table
SETUP_KEYS = ("size", "steps", "batch_size", "seq_len", "tokens", "seed", "eval_every", "eval_batches",
              "data_sha256", "flags")


def _dir_name(label: str) -> str:
    return label.replace("/", "_")


def load_runs(runs: Path, labels: list[str] | None, expect: dict | None = None) -> dict:
    """The results saved in ``runs`` (``<label>/result.json``) as one ``res`` (the table's input).

    ``labels``: those labels in that order (each must be there); ``None``: all of them, the
    recipes of :data:`ALL` first. ``expect``: a setup every result must share (else every result
    must share the first one's). Raises ``ValueError`` naming the file that does not fit."""
    found = {}
    for path in sorted(Path(runs).glob(f"*/{RESULT}")):
        try:
            found[path] = json.loads(path.read_text())
            found[path]["setup"], found[path]["run"]  # noqa: B018 - the two parts of a result
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a bench_quality result ({e})") from None
    setup = None if expect is None else {k: expect.get(k) for k in SETUP_KEYS}
    res, by_label = None, {}
    for path, rec in found.items():
        mine = {k: rec["setup"].get(k) for k in SETUP_KEYS}
        if setup is None:
            setup = mine
        if mine != setup:
            diff = ", ".join(f"{k}={mine[k]!r} (not {setup[k]!r})" for k in SETUP_KEYS if mine[k] != setup[k])
            raise ValueError(f"{path} is from another setup ({diff}); use another --runs directory or delete it")
        label = path.parent.name
        by_label[label] = rec["run"]
        if res is None:
            res = dict(rec["setup"])
    if labels is None:
        if expect is not None and not found:
            return dict(expect)
        labels = [lab for lab in ALL if _dir_name(lab) in by_label] + sorted(
            lab for lab in by_label if lab not in {_dir_name(x) for x in ALL})
    missing = [lab for lab in labels if _dir_name(lab) not in by_label]
    if res is None or missing:
        raise ValueError(f"no result for {missing or 'any recipe'} in {runs} (train them with --runs {runs})")
    res = dict(expect or res, runs={lab: by_label[_dir_name(lab)] for lab in labels})
    devices = sorted({r.get("device", res["device"]) for r in res["runs"].values()})
    res["device"] = " / ".join(devices)
    res["n_params"] = next(iter(res["runs"].values())).get("n_params", res.get("n_params"))
    return res


def _dump(obj, depth: int = 0) -> str:
    pad, end = " " * (depth + 1), "\n" + " " * depth
    if isinstance(obj, dict) and obj:
        items = (f"{pad}{json.dumps(str(k))}: {_dump(v, depth + 1)}" for k, v in obj.items())
        return "{\n" + ",\n".join(items) + end + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(pad + _dump(v, depth + 1) for v in obj) + end + "]"
    return json.dumps(obj, separators=(",", ":"))  # a value, or a list of values (a thinned series) on one line


def dump_result(res: dict) -> str:
    """The result JSON's text: indented like ``json.dumps(indent=1)``, each list of plain values on one line."""
    return _dump(res) + "\n"


def write_report(res: dict, out: Path, history_out: Path | None = None) -> int:
    """``quality_<tag>.json`` (compact: :func:`compact_run`) / ``.md`` / ``.png`` in ``out``; prints the table.
    ``history_out``: also every run's full per-step history there."""
    tag = res["tag"]
    if history_out is not None:
        missing = [k for k, r in res["runs"].items() if "history" not in r]
        if missing:
            print(f"bench_quality.py: error: --history-out: no per-step history of {missing} (a compact result)",
                  file=sys.stderr)
            return 2
        history_out.parent.mkdir(parents=True, exist_ok=True)
        history_out.write_text(json.dumps({"tag": tag, "command": res["command"],
                                           "runs": {k: r["history"] for k, r in res["runs"].items()}},
                                          separators=(",", ":")) + "\n")
    res = compact_result(res)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"quality_{tag}.json").write_text(dump_result(res))
    md = to_markdown(res)
    (out / f"quality_{tag}.md").write_text(md)
    plot(res, out / f"quality_{tag}.png")
    print(md)
    print(f"wrote {out / f'quality_{tag}'}.json/.md/.png" + (f" and {history_out}" if history_out else ""),
          file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
