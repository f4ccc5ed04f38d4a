"""The tables of the README and docs/, made from the result JSONs in benchmarks/results/.

A table sits in a markdown file between two marker comments; this script rewrites what is between them:

    <!-- table:NAME -->
    ...generated...
    <!-- /table -->

    python benchmarks/make_docs_tables.py           # rewrite every table in README.md and docs/*.md
    python benchmarks/make_docs_tables.py --check   # exit 1 (and name them) if a table differs from its JSON

Each table names the result files it reads; a number in a table comes from nowhere else.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)

# Flags of a recorded command that do not change what is measured (where it was written, its name, how
# many programs compiled at once).
_DROP = {"--out": 1, "--tag": 1, "--compile-workers": 1, "--runs": 1, "--dump-hlo": 1}


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def command(name: str) -> str:
    """The recorded command of a result file, without the flags that only say where it was written; a flag given
    twice with a value (a script's default, then the caller's) keeps its last value, where argparse reads it."""
    words = shlex.split(load(name)["command"])
    out, skip = [], 0
    for w in words:
        if skip:
            skip -= 1
        elif w.split("=")[0] in _DROP:
            skip = 0 if "=" in w else _DROP[w]
        else:
            out.append(w)
    last = {w: k for k, w in enumerate(out) if w.startswith("--") and k + 1 < len(out) and not out[k + 1].startswith("--")}
    keep = [k for k, w in enumerate(out) if not (w in last and last[w] != k
                                                 and k + 1 < len(out) and not out[k + 1].startswith("--"))]
    dropped_values = {k + 1 for k, w in enumerate(out) if k not in keep and w.startswith("--")}
    return shlex.join(out[k] for k in keep if k not in dropped_values)


def _x(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}×"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _throughput(name: str) -> dict:
    (t,) = load(name)["throughput"]
    return t


def _ratios(name: str) -> dict[str, float]:
    return {r["variant"]: r["vs_dense"] for r in _throughput(name)["rows"]}


_SIZES = {"gpt2": "GPT-2 124M", "gpt2-medium": "GPT-2 350M", "llama-300m": "LLaMA-300M", "llama-1b": "LLaMA-1B",
          "llama-7b": "LLaMA-7B"}


def _option(name: str, flag: str) -> str | None:
    """The value of ``flag`` in the recorded command of a result file (None if absent)."""
    words = shlex.split(load(name)["command"])
    return words[words.index(flag) + 1] if flag in words else None


def _vs(loss: float, base: float) -> str:
    """``loss`` against ``base`` in percent, signed, two decimals (never "-0.00%")."""
    return f"{round((loss / base - 1) * 100, 2) + 0.0:+.2f}%"


def _mfu(row: dict) -> str:
    """Model FLOP utilization per GPU, with the benchmark's own peak (– where the file has no FLOP rate)."""
    from bench_train_gpt import PEAK_TFLOPS  # the benchmark's own MFU convention

    tf = row.get("model_tflops_per_gpu")
    return "–" if tf is None else f"{100 * tf / PEAK_TFLOPS:.1f}%"


def _model(t: dict) -> str:
    shape = _SIZES[t["size"]]
    default_d = {"gpt2": 768, "gpt2-medium": 1024, "llama-300m": 1024, "llama-1b": 2048, "llama-7b": 4096}
    if t["n_embd"] != default_d[t["size"]]:
        shape = "GPT" if t["size"].startswith("gpt") else "LLaMA"
    return f"{shape}-shaped, d {t['n_embd']}, {t['n_layer']} layers"


# --- README -------------------------------------------------------------------------------------------

NODE_7B = "train_gpt_h200x4_llama-7b_l32_fsdp4_full_b32.json"
HEADLINE = [  # (what, file, variant): one kind of GPU (4 x H200), the current code
    ("LLaMA-7B (32 layers), 16,384 tokens per GPU", NODE_7B, "srste"),
    ("LLaMA-7B, 8,192 tokens per GPU", "train_gpt_h200x4_llama-7b_l32_fsdp4_full.json", "srste"),
    ("LLaMA-7B, 16,384 tokens per GPU, 2:4 GEMMs in fp8", "train_gpt_h200x4_llama-7b_l32_fsdp4_full_b32_fp8.json",
     "srste+fp8"),
    ("same run: dense with Flax's fp8 layers (no 2:4), the fp8 baseline", "train_gpt_h200x4_llama-7b_l32_fsdp4_full_b32_fp8.json",
     "dense+fp8-flax"),
    ("LLaMA-1B (16 layers), 8,192 tokens per GPU", "train_gpt_h200x4_llama-1b_l16_fsdp4.json", "srste"),
]


def table_headline() -> str:
    """One row per (file, variant), with dense's MFU where the run measured it; a row from the same run as the
    row above says so instead of repeating its command, file and MFU."""
    rows, prev = [], None
    for what, f, variant in HEADLINE:
        same = f == prev
        mfu = _mfu(next(r for r in _throughput(f)["rows"] if r["variant"] == "dense"))
        rows.append([what + ("" if same or mfu == "–" else f", dense at {mfu} MFU"), f"**{_x(_ratios(f)[variant])}**",
                     "same run" if same else f"`{command(f)}`",
                     "same run" if same else f"[`{f[:-5]}.md`](benchmarks/results/{f[:-5]}.md)"])
        prev = f
    return _table(["model (4 × H200, FSDP, full depth, vocabulary 32,000)", "tokens/s vs bf16 dense", "reproduce", "result"], rows)


# --- docs/performance.md --------------------------------------------------------------------------------

TRAIN_STEP = ["train_gpt_h100_gpt2_l12_prepared.json", "train_gpt_h100_llama-300m_l24_prepared.json"]


def table_train_step() -> str:
    rows = []
    for f in TRAIN_STEP:
        t, r = _throughput(f), _ratios(f)
        rows.append([_model(t), f"{t['tokens_per_step']:,}", *(_x(r.get(v), 3) for v in
                     ("srste", "srste/prepared", "sste", "ste", "step", "dense (control)")), f"`{f}`"])
    return _table(["model", "tokens / step", "srste", "srste, weights prepared", "sste", "ste", "step",
                   "dense control", "file"], rows)


FP8_STEP = ["train_gpt_h200x4_llama-7b_l32_fsdp4_full_b32_fp8.json"]
_FP8_LABELS = {"dense+fp8": "dense, our fp8 layer (`--recipe dense --fp8`)",
               "dense+fp8-delayed": "dense, our fp8 layer, delayed scaling (`--fp8 --fp8-scaling delayed`)",
               "dense+fp8-flax": "dense, Flax's fp8 layer (`--fp8 --fp8-scaling delayed --fp8-dense flax`)",
               "srste+fp8": "srste, fp8 2:4 GEMMs (`--recipe srste --fp8`)",
               "srste+fp8-delayed": "srste, fp8 2:4 GEMMs, delayed scaling (`--fp8 --fp8-scaling delayed`)"}


def table_fp8_step() -> str:
    """Each file is one interleaved run against its own bf16 dense (and dense control)."""
    rows = []
    for f in FP8_STEP:
        for r in _throughput(f)["rows"]:
            if r["variant"] == "dense":
                continue
            rows.append([_FP8_LABELS.get(r["variant"], r["variant"]), f"{r['median_step_s'] * 1e3:.1f}",
                         _x(r["vs_dense"], 3), f"`{f}`"])
    return _table(["variant (LLaMA-7B, 32 layers, FSDP on 4 × H200, 16,384 tokens per GPU)", "step (ms)",
                   "vs bf16 dense", "file"],
                  rows)


FP8_QUALITY = "quality_gpt2_h100_realtext_100m_fp8.json"


def table_fp8_quality() -> str:
    runs = load(FP8_QUALITY)["runs"]
    base = runs["dense"]["final_val_loss"]
    rows = [[k, f"{v['final_val_loss']:.4f}",
             "–" if k == "dense" else _vs(v["final_val_loss"], base),
             f"{v['tokens_per_s'] / 1e3:.0f}k"] for k, v in runs.items()]
    return _table(["recipe", "final val loss", "vs dense", "tokens/s"], rows)


NODE = [NODE_7B, "train_gpt_h200x4_llama-7b_l32_fsdp4_full.json", "train_gpt_h200x4_llama-7b_l32_fsdp4_full_b32_fp8.json",
        "train_gpt_h200x4_llama-1b_l16_fsdp4.json"]


def _callbacks_s(r: dict) -> str:
    d = r.get("compile_detail")
    return "–" if d is None else f"{d['partition_callback_s']:.1f}"


def table_node() -> str:
    """Per file: the run's shape, then each variant's throughput, MFU and compile time (the seconds of it spent
    in the 2:4 ops' partitioner callbacks: ``compile_detail``)."""
    out = []
    for name in NODE:
        t = _throughput(name)
        rows = [[r["variant"], f"{r['tokens_per_s']:,.0f}", _x(r["vs_dense"], 3), f"{r['model_tflops_per_gpu']:.0f}",
                 _mfu(r), f"{r['compile_s']:.1f}", _callbacks_s(r)] for r in t["rows"]]
        remat, preset = _option(name, "--remat"), _option(name, "--xla-preset")
        out.append(f"{_SIZES[t['size']]} ({t['n_layer']} layers, vocabulary {t['vocab_size']:,}"
                   + (f", `--remat {remat}`" if remat else "") + (f", `--xla-preset {preset}`" if preset else "") + f"), mesh `{t['mesh']}` over "
                   f"{t['n_devices']} GPUs ({load(name)['device'].split(': ')[-1]}), {t['tokens_per_step']:,} tokens per step, peak "
                   f"{t['peak_gib_per_device']:.1f} GiB per GPU ([`{name[:-5]}.md`](../benchmarks/results/{name[:-5]}.md)):\n\n"
                   + _table(["variant", "tokens/s", "vs dense", "model TFLOP/s per GPU", "MFU", "compile (s)",
                             "of it, partitioner callbacks (s)"], rows))
    return "\n".join(out)


def table_spmm() -> str:
    rows = [[f"{r['T']}, {r['I']}, {r['O']}", f"{r['baseline_tflops']:.0f}", _x(r["best_speedup"]),
             _x(r.get("cusparselt_speedup")), _x(r.get("cusparselt_speedup_with_compress"))]
            for r in load("spmm.json")["records"]]
    return _table(["T, I, O", "dense TFLOP/s", "CUTLASS", "cuSPARSELt", "cuSPARSELt + compression per call"], rows)


def table_fp8_gemm() -> str:
    cols = ["fp8 dense e4m3 dot", "fp8 2:4 gemm", "fp8 2:4 + compress", "bf16 2:4 gemm"]
    rows = [[f"{r['T']}, {r['I']}, {r['O']}", *(_x(r["gemm"][c]["vs_bf16_dense"]) for c in cols)]
            for r in load("fp8_gemm.json")["records"]]
    return _table(["T, I, O", "XLA fp8 dense", "fp8 2:4", "fp8 2:4 + compression", "bf16 2:4"], rows)


BREAKDOWN = "step_breakdown_h200_llama-7b_l32x4_fsdp4_full_b32.json"


def table_breakdown(name: str = BREAKDOWN) -> str:
    """Kernel time per category and recipe; the device span (first kernel start to last kernel end) and the wall
    time below it (on several GPUs the kernel time exceeds the span: collectives overlap compute)."""
    d = load(name)
    recipes = list(d["recipes"])
    cats = list(d["categories"])
    rows = [[c, *(f"{d['recipes'][r]['categories_ms'][c]:.1f}" for r in recipes)] for c in cats]
    rows.append(["**kernel time**", *(f"**{d['recipes'][r]['kernel_ms']:.1f}**" for r in recipes)])
    rows.append(["device span per step", *(f"{d['recipes'][r]['span_ms']:.1f}" for r in recipes)])
    rows.append(["wall time per step", *(f"{d['recipes'][r]['wall_ms']:.1f}" for r in recipes)])
    return _table(["ms per step", *recipes], rows)


QUALITY = ["quality_gpt2_h100_realtext_100m.json", "quality_gpt2_h100_realtext_100m_lr1.json"]
_QUALITY_LABELS = {"dense-tail": "srste, dense second half", "dense-tail-masked": "srste, dense second half from W ⊙ M",
                   "srste-sparse-attn": "srste, attention projections 2:4 too", "sste-lr1": "sste", "ste-lr1": "ste"}


def table_quality() -> str:
    """Every run of the quality files against the dense run of the first (same seed, same batches)."""
    base = load(QUALITY[0])["runs"]["dense"]["final_val_loss"]
    rows = []
    for f in QUALITY:
        for k, v in load(f)["runs"].items():
            rows.append([_QUALITY_LABELS.get(k, k), f"{v['config']['sparse_lr_scale']:g}",
                         f"{v['final_val_loss']:.4f}",
                         "–" if k == "dense" else _vs(v["final_val_loss"], base),
                         f"{v['tokens_per_s'] / 1e3:.0f}k", f"{v['spike']:.2f}×", f"`{f}`"])
    return _table(["recipe", "2:4 LR scale", "final val loss", "vs dense", "tokens/s", "largest loss spike", "file"],
                  rows)


QUALITY_BPE = "quality_gpt2_h100_bpe32k_100m.json"


def table_quality_bpe() -> str:
    """The subword-tokenizer run: final and best validation loss of every recipe against dense (the best one
    as bench_quality recorded it: ``best_val_loss`` / ``best_val_step``)."""
    d = load(QUALITY_BPE)
    runs, tok_step = d["runs"], d["batch_size"] * d["seq_len"]
    dense_final, dense_best = runs["dense"]["final_val_loss"], runs["dense"]["best_val_loss"]
    rows = []
    for k, v in runs.items():
        best, at = v["best_val_loss"], v["best_val_step"]
        rows.append([k, f"{v['final_val_loss']:.4f}", "–" if k == "dense" else _vs(v["final_val_loss"], dense_final),
                     f"{best:.4f} ({at * tok_step / 1e6:.1f}M)", "–" if k == "dense" else _vs(best, dense_best),
                     f"{v['tokens_per_s'] / 1e3:.0f}k"])
    return _table(["recipe", "final val loss (100M tokens)", "vs dense", "best val loss (at tokens)", "vs dense",
                   "tokens/s"], rows)


TABLES = {"headline": table_headline, "train-step": table_train_step, "fp8-step": table_fp8_step,
          "fp8-quality": table_fp8_quality, "node": table_node, "spmm": table_spmm, "fp8-gemm": table_fp8_gemm, "breakdown": table_breakdown,
          "quality": table_quality, "quality-bpe": table_quality_bpe}


def render(text: str) -> str:
    """``text`` with every marked table regenerated (an unknown table name is an error)."""
    def sub(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise KeyError(f"unknown table {m.group(2)!r}; known: {', '.join(TABLES)}")
        return m.group(1) + TABLES[m.group(2)]() + m.group(4)
    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its JSON")
    a = p.parse_args(argv)
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render(text)
        if new != text:
            stale.append(doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else str(doc))
            if not a.check:
                doc.write_text(new)
    if stale:
        print(("out of date: " if a.check else "rewrote: ") + ", ".join(stale))
    return 1 if (a.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
