#!/usr/bin/env python
"""Train-step speedup vs model width: one point per recipe and result file, dense at 1.0.

Reads the throughput records of ``bench_train_gpt.py`` result files (``tokens/s`` and ``vs_dense``
per variant; the recipes on ``backend="auto"`` with the example's defaults: rows without
``@backend``, ``/per-call`` or ``/prepared``) and plots
tokens/s vs dense over the model width d, GPT-shaped and LLaMA-shaped models as separate lines.
Prints the same numbers as a markdown table.

    python benchmarks/plot_speedup.py                      # the committed H100 results
    python benchmarks/plot_speedup.py a.json b.json --out speedup.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

#: The current train-step result of each model size, all on backend="auto", one micro-batch per step
#: (the ``*_prepared`` files also time ``RECIPE/prepared``; their plain rows are the default;
#: ``*_all-prepared`` files ran every recipe prepared and are not listed).
DEFAULT_FILES = [
    "train_gpt_h100_gpt2_l12_prepared.json",
    "train_gpt_h100_gpt2-medium.json",
    "train_gpt_h100_width2048.json",
    "train_gpt_h100_width4096.json",
    "train_gpt_h100_llama-300m_l24_prepared.json",
    "train_gpt_h100_llama-1b_l4_prepared.json",
    "train_gpt_h100_llama-7b_l4_prepared.json",
]
RECIPES = ["srste", "sste", "ste", "step"]
_WIDTH = {"gpt2": 768, "gpt2-medium": 1024}  # older records leave n_embd out when it is the size's own
_COLORS = {"srste": "tab:blue", "sste": "tab:orange", "ste": "tab:green", "step": "tab:red"}


def load_points(paths):
    """One dict per (file, throughput record): family, width, layers, tokens, {recipe: vs dense}."""
    points = []
    for path in paths:
        res = json.loads(Path(path).read_text())
        for tp in res["throughput"]:
            if (tp.get("grad_accum") or 1) != 1:
                continue
            size = tp["size"]
            speedup = {r["variant"]: r["vs_dense"] for r in tp["rows"] if r["variant"] in RECIPES}
            points.append({
                "file": Path(path).name,
                "family": "LLaMA" if size.startswith("llama") else "GPT",
                "d": tp.get("n_embd") or _WIDTH[size],
                "layers": tp.get("n_layer"),
                "tokens": tp["tokens_per_step"],
                "speedup": speedup,
            })
    return sorted(points, key=lambda p: (p["family"], p["d"]))


def table(points) -> str:
    lines = ["| model | d | " + " | ".join(RECIPES) + " | file |", "|---|---|" + "---|" * len(RECIPES) + "---|"]
    for p in points:
        cells = [f"{p['speedup'][r]:.3f}×" if r in p["speedup"] else "–" for r in RECIPES]
        lines.append(f"| {p['family']} | {p['d']} | " + " | ".join(cells) + f" | `{p['file']}` |")
    return "\n".join(lines)


def plot(points, out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.axhline(1.0, color="black", lw=1.2, ls="--", label="dense")
    styles = (("GPT", "o", "-", "GPT, FFN 2:4"), ("LLaMA", "s", ":", "LLaMA-shaped, every linear 2:4"))
    for family, marker, ls, what in styles:
        fam = [p for p in points if p["family"] == family]
        for recipe in RECIPES:
            xs = [p["d"] for p in fam if recipe in p["speedup"]]
            ys = [p["speedup"][recipe] for p in fam if recipe in p["speedup"]]
            if xs:
                ax.plot(xs, ys, marker=marker, ls=ls, color=_COLORS[recipe], label=f"{recipe}: {what}")
    ax.set_xscale("log", base=2)
    widths = sorted({p["d"] for p in points})
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.minorticks_off()
    ax.set_xlabel("model width d")
    ax.set_ylabel("train-step tokens/s vs dense")
    ax.set_title(title or "2:4 training vs dense, whole train step (H100, bf16, backend=auto)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="bench_train_gpt result JSONs (default: the committed H100 results)")
    ap.add_argument("--out", type=Path, default=RESULTS / "speedup_vs_width.png")
    args = ap.parse_args(argv)
    points = load_points(args.files or [RESULTS / f for f in DEFAULT_FILES])
    if not points:
        print("no throughput records", file=sys.stderr)
        return 1
    print(table(points))
    print(f"wrote {plot(points, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
