"""Where a GPT train step's time goes: GPU kernel time by kernel name, dense vs a 2:4 recipe.

    python scripts/profile_step.py --size gpt2 --recipes dense,srste --out DIR

Builds each recipe's train program exactly as benchmarks/bench_train_gpt.py does (sparse phase),
runs a few steps under ``jax.profiler.trace``, then sums the device-side events of the trace per
kernel name and writes ``DIR/profile_step.md``: per recipe the total kernel time per step and the
kernels whose time differs most from the first recipe's, and a breakdown by kind of kernel
(:func:`category`: dense and sparse GEMMs, our compress / mask / MVUE kernels, attention, and the
rest — XLA's fusions: norms, activations, loss, optimizer).

    python scripts/profile_step.py --size llama-7b --n-layer 4 --recipes dense,srste --out DIR
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import jax  # noqa: E402

import bench_train_gpt as btg  # noqa: E402  (puts examples/ on sys.path)
import train_gpt  # noqa: E402


#: (category, pattern on the full kernel name), first match wins.
CATEGORIES = (
    ("GEMM, sparse (CUTLASS / cuSPARSELt)",
     re.compile(r"cutlass13device_kernel|cutlass::device_kernel|sparse_?gemm|xmma_sparse|spmma|cusparselt", re.I)),
    ("ours: compress (weights, MVUE of ∇y), masks", re.compile(r"jax_sparse24|compress|mvue|mask24", re.I)),
    ("GEMM, dense", re.compile(r"gemm|nvjet|xmma|cublas|cutlass|dot", re.I)),
    ("attention (cuDNN / XLA)", re.compile(r"sdpa|flash|fmha|cudnn|softmax", re.I)),
)
OTHER = "other (XLA fusions: norms, activations, loss, optimizer, copies)"


def category(name: str) -> str:
    """The kind of a kernel, from its full name (:data:`CATEGORIES`, else :data:`OTHER`).

    >>> category("void jax_sparse24::compress::(anonymous namespace)::CompressTileKernel<__nv_bfloat16>")
    'ours: compress (weights, MVUE of ∇y), masks'
    >>> category("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE")
    'GEMM, sparse (CUTLASS / cuSPARSELt)'
    >>> category("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT")
    'GEMM, dense'
    >>> category("loop_add_fusion_1")
    'other (XLA fusions: norms, activations, loss, optimizer, copies)'
    """
    for cat, pat in CATEGORIES:
        if pat.search(name):
            return cat
    return OTHER


KINDS = [c for c, _ in CATEGORIES] + [OTHER]


def tag(cat: str) -> str:
    """Short label of a category, appended to kernel names in the report (``[k1]``...)."""
    return f"k{KINDS.index(cat)}"


def kernel_times(trace_dir: str) -> tuple[dict, float, dict]:
    """{kernel name: total µs} over the device streams of the newest trace, the device span, and
    {kind (:func:`category` of the full name): total µs}."""
    path = max(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True), key=os.path.getmtime)
    with gzip.open(path) as f:
        trace = json.load(f)
    pids = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = {p for p, n in pids.items() if re.search(r"/device:GPU|GPU:\d|stream", n, re.I)}
    times, kinds = collections.Counter(), collections.Counter()
    t_min, t_max = float("inf"), 0.0
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("pid") in device and "dur" in e:
            name = re.sub(r"\.\d+$", "", e["name"])
            kind = category(name)
            times[name[:90] + ("\u2026" if len(name) > 90 else "") + f" [{tag(kind)}]"] += float(e["dur"])
            kinds[kind] += float(e["dur"])
            t_min, t_max = min(t_min, e["ts"]), max(t_max, e["ts"] + e["dur"])
    return dict(times), max(0.0, t_max - t_min), dict(kinds)


def write_report(results: dict, a, batch: int, seq: int, final: bool) -> None:
    """Write ``profile_step.md`` (after every recipe, so a run cut short keeps what it measured)."""
    names = list(results)
    base = results[names[0]][0]
    layers = f", {a.n_layer} layers" if a.n_layer else ""
    lines = [f"# Train-step kernel time by kernel, {a.size}{layers} (batch {batch} x {seq}), {jax.devices()[0].device_kind}",
             "", "| recipe | kernel time / step (ms) | device span / step (ms) |", "|---|---|---|"]
    for r in names:
        lines.append(f"| {r} | {sum(results[r][0].values()) / 1e3:.2f} | {results[r][1] / 1e3:.2f} |")
    lines += ["", "## Kernel time per step by kind (ms)", "",
              "| kind | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for c in KINDS:
        lines.append(f"| {c} [{tag(c)}] | " + " | ".join(f"{results[r][2].get(c, 0.0) / 1e3:.2f}" for r in names) + " |")
    lines += ["", f"## {names[0]}: largest kernels (µs per step)", "", "| kernel | µs | share |", "|---|---|---|"]
    total = sum(base.values())
    for k in sorted(base, key=lambda k: -base[k])[: a.top]:
        lines.append(f"| `{k}` | {base[k]:.1f} | {100 * base[k] / total:.1f}% |")
    for r in names[1:]:
        cur = results[r][0]
        keys = set(base) | set(cur)
        diff = sorted(keys, key=lambda k: -abs(cur.get(k, 0.0) - base.get(k, 0.0)))[: a.top]
        lines += ["", f"## {r} vs {names[0]}: largest differences (µs per step)", "",
                  f"| kernel | {names[0]} | {r} | difference |", "|---|---|---|---|"]
        for k in diff:
            lines.append(f"| `{k}` | {base.get(k, 0.0):.1f} | {cur.get(k, 0.0):.1f} | "
                         f"{cur.get(k, 0.0) - base.get(k, 0.0):+.1f} |")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "profile_step.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if final:
        print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="gpt2")
    ap.add_argument("--recipes", default="dense,srste",
                    help="comma-separated; RECIPE@ATTENTION picks the attention kernel (auto|xla|cudnn), "
                         "e.g. dense@xla,dense@cudnn,srste@cudnn; RECIPE@BACKEND the sparse backend "
                         "(srste@cutlass, srste@cusparselt)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--compile-workers", type=int, default=8, help="concurrent XLA compilations")
    ap.add_argument("--out", default=".")
    ap.add_argument("--n-layer", type=int, default=None, help="override the size's number of blocks")
    a = ap.parse_args(argv)
    d = train_gpt.SIZE_DEFAULTS[a.size]
    batch, seq = d["batch_size"], d["seq_len"]
    data = train_gpt.ByteData(train_gpt.DEFAULT_DATA, seq, batch, seed=0, eval_batches=1)
    rts = {}
    for name in a.recipes.split(","):
        recipe, _, attention = name.partition("@")
        if attention not in ("", "auto", "xla", "cudnn"):  # RECIPE@BACKEND (bench_train_gpt's label)
            recipe, attention = name, ""
        extra = ["--attention", attention] if attention else []
        extra += ["--n-layer", str(a.n_layer)] if a.n_layer else []
        rts[name] = train_gpt.make_runtime(btg._experiment(a.size, recipe, batch, seq, 10**6, extra))
    exes = btg.compile_all(rts, False, a.compile_workers, lambda m: print(m, flush=True))  # concurrently
    results = {}
    for name, rt in rts.items():
        recipe = name.replace("@", "_")
        exe = exes.pop((name, "train", None if rt.exp.cfg.method == "dense" else True))
        state = rt.init()
        if rt.exp.needs_phase():
            state = dict(state, opt_state=btg._force_step_phase(state["opt_state"]))
        batches = [rt.put(data.batch(i)) for i in range(2)]
        for i in range(3):
            state, _ = exe(state, batches[i % 2])
        jax.block_until_ready(state)
        tdir = tempfile.mkdtemp(prefix=f"trace_{recipe}_")
        with jax.profiler.trace(tdir):
            for i in range(a.steps):
                state, _ = exe(state, batches[i % 2])
            jax.block_until_ready(state)
        times, span, kinds = kernel_times(tdir)
        results[name] = ({k: v / a.steps for k, v in times.items()}, span / a.steps,
                         {k: v / a.steps for k, v in kinds.items()})
        print(f"{name}: {sum(times.values()) / a.steps / 1e3:.2f} ms kernel time per step, "
              f"{span / a.steps / 1e3:.2f} ms device span per step, {len(times)} kernel names", flush=True)
        del exe, state
        rts[name] = None
        write_report(results, a, batch, seq, final=False)
    write_report(results, a, batch, seq, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
