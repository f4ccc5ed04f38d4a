"""Weak-scaling table from ``bench_train_gpt.py`` results of one model on 1, 2, 4 ... GPUs.

``bash scripts/gpu_check.sh scaling`` times the same model with the same tokens per GPU on each GPU count
(FSDP over the GPUs; dense and the 2:4 recipes in one run per count, with a dense control) and calls this
script on its result files. Efficiency of a variant on N GPUs = its tokens/s on N / (N x its tokens/s on
one GPU); the target is >= 90% for srste, as for dense.

    python benchmarks/weak_scaling.py OUT/train_gpt_<gpu>x{1,2,4}_<size>_l<layers>_scaling.json \\
        --out benchmarks/results --tag <gpu>_<size>_l<layers>
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from bench_train_gpt import PEAK_TFLOPS  # the benchmark's own MFU convention
from result_files import write_result

CONTROL = "dense (control)"


#: bench_train_gpt.py flags that must agree across the GPU counts (besides the model read from the results)
SAME_FLAGS = ("--recipes", "--remat", "--seq-len", "--vocab-size", "--park", "--layers", "--attention")


def _flags(command: str) -> dict:
    words = shlex.split(command)
    return {f: words[words.index(f) + 1] if f in words[:-1] else None for f in SAME_FLAGS}


def load(paths: list[Path], log=None) -> dict:
    """``{n_devices: (throughput entry, command, device)}`` of the result files; one model and the same flags, one
    entry each. A file whose timing failed (no throughput entry: bench_train_gpt.py's ``failed``) is left out
    with a line to ``log``."""
    runs, model = {}, None
    for p in paths:
        d = json.loads(Path(p).read_text())
        if not d.get("throughput") and d.get("failed"):
            if log:
                log(f"{p}: not timed ({d['failed'][0].get('error', '?')}), left out")
            continue
        if len(d.get("throughput") or []) != 1:
            raise ValueError(f"{p}: expected one throughput entry of bench_train_gpt.py, got {len(d.get('throughput') or [])}")
        t = d["throughput"][0]
        key = (t["size"], t["n_layer"], t["tokens_per_step"] // t["n_devices"], t.get("vocab_size"),
               tuple(sorted(_flags(d["command"]).items())))
        if model is not None and key != model:
            raise ValueError(f"{p}: another model, tokens per GPU or flags ({key}, not {model})")
        model = key
        if t["n_devices"] in runs:
            raise ValueError(f"{p}: a second result on {t['n_devices']} GPU(s)")
        runs[t["n_devices"]] = (t, d["command"], d["device"])
    if 1 not in runs:
        raise ValueError("no result on one GPU: efficiency is relative to it")
    return dict(sorted(runs.items()))


def table(runs: dict) -> dict:
    """Rows per GPU count: tokens/s, efficiency and ratio to dense per variant (the control left out)."""
    one = {r["variant"]: r["tokens_per_s"] for r in runs[1][0]["rows"]}
    rows = []
    for n, (t, _, _) in runs.items():
        by = {r["variant"]: r for r in t["rows"] if r["variant"] != CONTROL}
        rows.append({"n_devices": n, "mesh": t.get("mesh") or "-", "tokens_per_step": t["tokens_per_step"],
                     "variants": {v: {"tokens_per_s": r["tokens_per_s"], "vs_dense": r["vs_dense"],
                                      "efficiency": r["tokens_per_s"] / (n * one[v]) if v in one else None,
                                      "mfu": r.get("model_tflops_per_gpu", 0) / PEAK_TFLOPS}
                                  for v, r in by.items()},
                     "control_vs_dense": next((r["vs_dense"] for r in t["rows"] if r["variant"] == CONTROL), None),
                     "peak_gib_per_device": t.get("peak_gib_per_device")})
    return {"rows": rows}


def to_markdown(res: dict) -> str:
    first = res["sources"][0]
    variants = list(res["rows"][0]["variants"])
    head = ["GPUs", "mesh", "tokens per step"]
    for v in variants:
        head += [f"{v} tokens/s", f"{v} efficiency"] + ([] if v == "dense" else [f"{v} vs dense"])
    head += ["control vs dense", "dense MFU"]
    lines = [f"# Weak scaling: {first['size']}, {first['n_layer']} layers, {first['tokens_per_gpu']:,} tokens per GPU "
             f"({res['device']})", "",
             "Each row is one `bench_train_gpt.py` run (dense and the 2:4 recipes interleaved, with a dense control); "
             "efficiency = tokens/s on N GPUs / (N x tokens/s on one GPU). Commands:", ""]
    lines += [f"* {s['n_devices']} GPU(s): `{s['command']}`" for s in res["sources"]] + [""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["rows"]:
        cells = [str(r["n_devices"]), r["mesh"], f"{r['tokens_per_step']:,}"]
        for v in variants:
            x = r["variants"].get(v, {})
            cells += [f"{x.get('tokens_per_s', float('nan')):,.0f}", f"{100 * x['efficiency']:.1f}%" if x.get("efficiency") else "-"]
            cells += [] if v == "dense" else [f"{x.get('vs_dense', float('nan')):.3f}x"]
        cells += ["-" if r["control_vs_dense"] is None else f"{r['control_vs_dense']:.3f}x",
                  f"{100 * r['variants']['dense']['mfu']:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench_train_gpt.py JSON files, one per GPU count")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--tag", required=True, help="results file name: weak_scaling_<tag>.json/.md")
    a = ap.parse_args(argv)
    try:
        runs = load(a.results, log=lambda m: print(m, file=sys.stderr))
    except (OSError, ValueError, KeyError) as e:
        print(f"weak_scaling.py: error: {e}", file=sys.stderr)
        return 2
    res = table(runs)
    res["device"] = " / ".join(sorted({dev for _, _, dev in runs.values()}))
    res["sources"] = [{"n_devices": n, "command": cmd, "size": t["size"], "n_layer": t["n_layer"],
                       "tokens_per_gpu": t["tokens_per_step"] // n, "throughput": t} for n, (t, cmd, _) in runs.items()]
    md = to_markdown(res)
    write_result(a.out, f"weak_scaling_{a.tag}", res, md, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
