#!/usr/bin/env python
"""Where a GPT train step's time goes, by kind of kernel, and the gap to the 2:4 GEMM ceiling.

    python benchmarks/bench_step_breakdown.py --size llama-300m --recipes dense,srste --tag h100_llama-300m
    python benchmarks/bench_step_breakdown.py --size llama-7b --n-layer 4 --recipes dense,srste,srste+fp8 \\
        --tag h100_llama-7b_l4

Builds each recipe's train program exactly as ``bench_train_gpt.py`` does (sparse phase; the same
``RECIPE@BACKEND``, ``RECIPE+fp8`` / ``+fp8-delayed`` / ``+fp8-flax``, ``RECIPE/per-call`` and ``RECIPE/prepared`` labels, plus ``RECIPE@xla`` /
``@cudnn`` / ``@auto`` for the attention kernel), then per recipe:

* the wall-clock step time: median over ``--rounds`` rounds of ``--iters`` steps after warm-up;
* ``--steps`` steps under ``jax.profiler.trace``: the device-side kernel time per step, summed by
  kernel and by category (:data:`CATEGORIES`, :func:`category`), and the device span per step.

Kernels are classified by name (our CUDA kernels, cuSPARSELt / CUTLASS / cuBLAS GEMMs, cuDNN
attention) and, for XLA's own kernels, by the ``op_name`` metadata of their HLO instruction in the
compiled program (:func:`hlo_op_names`): the example's train step runs the update under
``jax.named_scope("optimizer")`` and the model's attention under ``"attention"``.

For every 2:4 recipe against the dense one it estimates the step at the sparse GEMM ceiling
(:data:`SPARSE_GEMM_CEILING`) and splits the remaining gap by category (:func:`compare`).

Writes ``<out>/step_breakdown_<tag>.json`` and ``.md`` after every recipe (a run cut short keeps
what it measured) and prints the table at the end.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import datetime
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402

import bench_train_gpt as btg  # noqa: E402  (puts benchmarks/harness/ and examples/ on sys.path)
import model  # noqa: E402
import train_gpt  # noqa: E402
from model import ONE_HOT_MAX_VOCAB  # noqa: E402

#: The speedup of a 2:4 GEMM over the dense one that the ceiling assumes: cuSPARSELt's measured
#: 1.64x over XLA's dense GEMM at 8192^3 (benchmarks/results/spmm.md), rounded down.
SPARSE_GEMM_CEILING = 1.6

GEMM_SPARSE = "GEMM, sparse"
GEMM_DENSE = "GEMM, dense"
COMPRESS = "weight mask + compress"
MVUE = "MVUE of ∇y + compress"
MASKS = "masks"
ATTENTION = "attention"
OPTIMIZER = "optimizer"
COLLECTIVE = "collectives"
OTHER = "other"

#: category -> what it holds (the report's legend), in table order.
CATEGORIES = {
    GEMM_SPARSE: "CUTLASS / cuSPARSELt 2:4 GEMMs, fp8 ones included",
    GEMM_DENSE: "cuBLAS (nvjet, xmma), XLA's GEMM fusions (Triton)",
    COMPRESS: "our compressors of the weights: mask + compress, fused fp8 quantize + compress, "
              "the batched MaskCompressMany, CUTLASS's compressor",
    MVUE: "our kernels of the sparse weight gradient's operands: the MVUE draw of ∇y and its compression "
          "(fp8 quantized too), and the fp8 weight gradient's q(x)ᵀ",
    MASKS: "our mask kernels (2:4 masks, transposable masks, soft threshold)",
    ATTENTION: "cuDNN's attention kernels, and XLA's under the model's `attention` scope",
    OPTIMIZER: "XLA's kernels under the train step's `optimizer` scope (clipping, decay, AdamW, "
               "mask refresh)",
    COLLECTIVE: "NCCL's kernels (all-gather, reduce-scatter, all-reduce of a sharded step; they may overlap compute)",
    OTHER: "the rest of XLA's kernels (norms, activations, loss, casts, copies), memsets",
}


def _scope(name: str) -> re.Pattern:
    """A ``jax.named_scope(name)`` as one component of an HLO ``op_name`` (also inside
    ``jvp(...)`` / ``transpose(...)``)."""
    return re.compile(rf"(?:^|[/(;]){re.escape(name)}(?:[/);]|$)")


#: (category, "kernel" | "scope", pattern): the first rule whose pattern matches the kernel's name
#: ("kernel") or its HLO instruction's op_name ("scope") decides; no match: :data:`OTHER`. The
#: names are those of the trace, demangled (``CompressTileKernel<__nv_bfloat16, (...::Op)2, ...>``)
#: or, where the profiler could not demangle them, mangled (``CompressTileKernelI13__nv_bfloat16LNS1_2OpE2E``).
RULES = (
    # memsets and copies are the runtime's, whatever HLO instruction they run for
    (OTHER, "kernel", re.compile(r"^(memset|memcpy)", re.I)),
    (COLLECTIVE, "kernel", re.compile(r"nccl|all_?gather|reduce_?scatter|all_?reduce|collective_?permute", re.I)),
    # compress_kernels.cu: Op 2 = kMvue (0 prune, 1 mask, 3 soft threshold are weights);
    # mask_kernels.cu: GroupOp 2 = kMvue24
    (MVUE, "kernel", re.compile(r"CompressTileKernel<[^,]*, \([^,]*?::Op\)2,|CompressTileKernelI\w*?OpE2E"
                                r"|GroupKernel<[^,]*, \([^,]*?::GroupOp\)2,|GroupKernelI\w*?GroupOpE2E|mvue|QuantizeTranspose", re.I)),
    (MASKS, "kernel", re.compile(r"mask_kernels|TransposableMaskKernel|GroupKernel|mask24", re.I)),
    (COMPRESS, "kernel", re.compile(r"jax_sparse24|compress|FixMetadataKernel", re.I)),
    # this project's CUTLASS kernels are its 2:4 GEMMs, each with "Sparse" in its (mangled) name; a
    # CUTLASS kernel of XLA's or cuBLAS's is a dense GEMM (the rule below)
    (GEMM_SPARSE, "kernel", re.compile(r"cutlass13device_kernel\w*Sparse|cutlass::device_kernel<.*Sparse"
                                       r"|sparse_?gemm|xmma_sparse|spmma|cusparselt", re.I)),
    (ATTENTION, "kernel", re.compile(r"sdpa|flash|fmha|cudnn", re.I)),
    (ATTENTION, "scope", _scope("attention")),
    (GEMM_DENSE, "kernel", re.compile(r"gemm|nvjet|xmma|cublas|cutlass|matmul|dot", re.I)),
    (OPTIMIZER, "scope", _scope("optimizer")),
)


@functools.lru_cache(maxsize=None)  # a trace repeats few distinct (name, op_name) pairs many times
def category(name: str, op_name: str = "") -> str:
    """The category of a kernel from its name and its HLO instruction's ``op_name`` (:data:`RULES`).

    >>> category("void jax_sparse24::compress::(anonymous namespace)::CompressTileKernel<__nv_bfloat16, "
    ...          "(jax_sparse24::compress::(anonymous namespace)::Op)2, false, true>(...)")
    'MVUE of ∇y + compress'
    >>> category("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT")
    'GEMM, dense'
    >>> category("loop_multiply_fusion_3", "jit(train_step)/optimizer/mul")
    'optimizer'
    """
    for cat, where, pat in RULES:
        text = name if where == "kernel" else op_name
        if text and pat.search(text):
            return cat
    return OTHER


# ------------------------------------------------------------------------------------------------
# HLO metadata: instruction name -> op_name
# ------------------------------------------------------------------------------------------------

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")


def kernel_key(name: str) -> str:
    """An HLO instruction name as XLA names its kernel (``loop_add_fusion.4`` -> ``loop_add_fusion_4``)."""
    return re.sub(r"[^\w]", "_", name)


def hlo_op_names(hlo_text: str) -> dict:
    """{instruction name: op_name} of a compiled module's text (``compiled.as_text()``).

    An instruction without an op_name of its own (a fusion, usually) takes its called computation's
    root's. Every name is also listed as its kernel's name (:func:`kernel_key`) unless another
    instruction has that name.
    """
    own, calls, roots = {}, {}, {}
    computation = None
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            name = m.group(2)
            op = _OP_NAME.search(line)
            own[name] = op.group(1) if op else ""
            c = _CALLS.search(line)
            if c:
                calls[name] = c.group(1)
            if m.group(1) and computation:
                roots[computation] = name
            continue
        m = _COMPUTATION.match(line)
        if m:
            computation = m.group(1)

    def resolve(name, depth=0):
        if own.get(name) or depth > 8 or name not in calls:
            return own.get(name, "")
        return resolve(roots.get(calls[name], ""), depth + 1)

    out = {name: resolve(name) for name in own}
    for name in list(out):
        out.setdefault(kernel_key(name), out[name])
    return out


def compiled_text(exe) -> tuple[str | None, str]:
    """The compiled module's HLO text and how it was obtained (or None and why not)."""
    try:
        text = exe.as_text()
    except Exception as e:  # noqa: BLE001  (the report says what went wrong)
        return None, f"as_text() failed: {type(e).__name__}: {e}"
    if not isinstance(text, str) or not text:
        return None, "as_text() returned no text"
    return text, "compiled.as_text()"


# ------------------------------------------------------------------------------------------------
# Trace
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class KernelTimes:
    """Device-side kernel time of a trace (µs, summed over the traced steps)."""

    kernels: list  # [{"name", "category", "us", "launches"}], largest first
    span_us: float  # first kernel start to last kernel end
    categories: dict  # {category: µs}
    attribution: dict  # {where the op_name came from: µs} of the kernels only their op_name classifies

    @property
    def total_us(self) -> float:
        return sum(self.categories.values())


def _op_name(name: str, args: dict, op_names: dict) -> tuple[str, str]:
    """(op_name, source) of a kernel: its HLO instruction's, found by the trace's ``hlo_op``
    argument or by the kernel's name, else the trace's own annotation (``tf_op`` / ``name``)."""
    hlo_op = args.get("hlo_op")
    if hlo_op and hlo_op in op_names:
        return op_names[hlo_op], "HLO instruction by the trace's hlo_op"
    if name in op_names:
        return op_names[name], "HLO instruction by kernel name"
    for key in ("tf_op", "name"):
        v = args.get(key)
        if isinstance(v, str) and "/" in v:
            return v, "the trace's op annotation"
    return "", "none"


def _profile_options():
    """Profiler options: device kernels only (no HLO protos, no Python tracer)."""
    opts = jax.profiler.ProfileOptions()
    opts.enable_hlo_proto = False
    opts.python_tracer_level = 0
    return opts


def kernel_times(trace_dir: str, op_names: dict | None = None) -> KernelTimes:
    """The device kernels of the newest trace under ``trace_dir``, classified by :func:`category`
    (``op_names``: :func:`hlo_op_names` of the traced program). No trace or no device events (a CPU
    run): empty. Only the stream lines of a device count when it has any (not derived lines)."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        return KernelTimes([], 0.0, {}, {})
    with gzip.open(max(paths, key=os.path.getmtime)) as f:
        events = json.load(f).get("traceEvents", [])
    meta = [e for e in events if e.get("ph") == "M"]
    pids = {e["pid"]: e.get("args", {}).get("name", "") for e in meta if e.get("name") == "process_name"}
    device = {p for p, n in pids.items() if re.search(r"/device:GPU|GPU:\d|stream", n, re.I)}
    first = [p for p in device if re.search(r"GPU:0\b", pids[p])]
    device = set(first) or device  # a sharded step: the first GPU's kernels (the others run the same)
    threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in meta
               if e.get("name") == "thread_name" and e["pid"] in device}
    streams = {k for k, n in threads.items() if re.search(r"stream", n, re.I)}
    op_names = op_names or {}
    kernels, categories, attribution = {}, collections.Counter(), collections.Counter()
    t_min, t_max = float("inf"), 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device or "dur" not in e:
            continue
        if streams and (e["pid"], e.get("tid")) not in streams:
            continue
        raw, args, dur = e.get("name", ""), e.get("args") or {}, float(e["dur"])
        name = re.sub(r"\.\d+$", "", raw)
        op, source = _op_name(raw, args, op_names)
        cat = category(name, op)
        if category(name) == OTHER:  # XLA's kernels: only the op_name can tell
            attribution[source] += dur
        k = kernels.setdefault((name, cat), {"name": name, "category": cat, "us": 0.0, "launches": 0})
        k["us"] += dur
        k["launches"] += 1
        categories[cat] += dur
        t_min, t_max = min(t_min, float(e["ts"])), max(t_max, float(e["ts"]) + dur)
    return KernelTimes(sorted(kernels.values(), key=lambda k: -k["us"]), max(0.0, t_max - t_min),
                       dict(categories), dict(attribution))


# ------------------------------------------------------------------------------------------------
# GEMM FLOPs, the ceiling and the gap
# ------------------------------------------------------------------------------------------------


def _key(k) -> str:
    return str(getattr(k, "key", getattr(k, "name", k)))


def gemm_flops(params, sparse_paths, tokens: int, tie_head: bool) -> dict:
    """GEMM FLOPs per step of the model's linear layers, 2·tokens·in·out per GEMM.

    ``params``: the parameter tree (arrays or ``ShapeDtypeStruct``); every 2-D ``kernel`` is a
    linear layer (a ``kernel`` of more dimensions a stack of them, ``nn.scan``'s ``(L, in, out)``) with 3 GEMMs (forward, input gradient, weight gradient), 2:4 when its module path
    is in ``sparse_paths``. The byte embedding ``wte`` is a one-hot GEMM up to
    ``ONE_HOT_MAX_VOCAB`` rows (forward and weight gradient) and, with ``tie_head``, the head (3).
    Returns ``{"tokens", "sparse", "dense", "total", "fraction_sparse", "layers"}``: FLOPs of the 2:4
    layers and of the other GEMMs, and the layers grouped by (name, shape, 2:4, GEMMs).
    """
    sparse = {tuple(p) for p in sparse_paths}
    groups = collections.Counter()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(_key(k) for k in path)
        shape = tuple(getattr(leaf, "shape", ()))
        if keys[-1] == "kernel" and len(shape) >= 2:  # (a scanned stack (L, in, out): L layers)
            groups[(keys[-2], shape[-2:], keys[:-1] in sparse, 3)] += functools.reduce(lambda a, b: a * b, shape[:-2], 1)
        elif keys == ("wte", "embedding") and len(shape) == 2:
            vocab, d = shape
            if vocab <= ONE_HOT_MAX_VOCAB:
                groups[("wte (one-hot embedding)", shape, False, 2)] += 1
            if tie_head:
                groups[("wte (tied head)", (d, vocab), False, 3)] += 1
    layers = [{"layer": name, "in": shape[0], "out": shape[1], "sparse": sp, "gemms": n, "count": count,
               "flops": count * n * 2 * tokens * shape[0] * shape[1]}
              for (name, shape, sp, n), count in sorted(groups.items(), key=str)]
    fs = float(sum(r["flops"] for r in layers if r["sparse"]))
    fd = float(sum(r["flops"] for r in layers if not r["sparse"]))
    return {"tokens": tokens, "sparse": fs, "dense": fd, "total": fs + fd,
            "fraction_sparse": fs / (fs + fd) if fs + fd else 0.0, "layers": layers}


def ideal_categories(dense_ms: dict, fraction: float, ceiling: float = SPARSE_GEMM_CEILING) -> dict:
    """The step at the ceiling, by category: the dense step with the 2:4 layers' share
    (``fraction``) of its dense GEMM time run ``ceiling`` times faster, and no compress / MVUE /
    mask time. Its total is ``dense − fraction·GEMM_dense·(1 − 1/ceiling)``.

    >>> ideal_categories({GEMM_DENSE: 10.0, OTHER: 5.0}, 1.0, 2.0)[GEMM_SPARSE]
    5.0
    """
    ideal = {c: float(dense_ms.get(c, 0.0)) for c in CATEGORIES}
    moved = fraction * ideal[GEMM_DENSE]
    ideal[GEMM_DENSE] -= moved
    ideal[GEMM_SPARSE] += moved / ceiling
    for c in (COMPRESS, MVUE, MASKS):
        ideal[c] = 0.0
    return ideal


def compare(dense: dict, sparse: dict, fraction: float, ceiling: float = SPARSE_GEMM_CEILING) -> dict:
    """A 2:4 recipe against the dense one (records with ``categories_ms``, ``span_ms``,
    ``wall_ms``): the ceiling step, the speedups, and the gap by category.

    The gap is the recipe's kernel time minus the ceiling's; by construction
    ``sum(gap_ms.values()) == gap_total_ms`` (each category: recipe − ideal).
    """
    d_cat, s_cat = dense["categories_ms"], sparse["categories_ms"]
    d_total, s_total = sum(d_cat.values()), sum(s_cat.values())
    ideal = ideal_categories(d_cat, fraction, ceiling)
    ceiling_total = sum(ideal.values())
    gap = {c: float(s_cat.get(c, 0.0)) - ideal[c] for c in CATEGORIES}
    gap_total = s_total - ceiling_total

    def ratio(a, b):
        return a / b if a and b else None

    return {
        "ceiling": ceiling, "fraction_sparse": fraction,
        "dense_gemm_ms_of_sparse_layers": fraction * float(d_cat.get(GEMM_DENSE, 0.0)),
        "dense_ms": d_total, "ceiling_ms": ceiling_total, "recipe_ms": s_total,
        "ideal_ms": ideal, "gap_ms": gap, "gap_total_ms": gap_total,
        "gap_share": {c: (v / gap_total if gap_total else None) for c, v in gap.items()},
        "speedup": {"ceiling": ratio(d_total, ceiling_total), "kernel_time": ratio(d_total, s_total),
                    "device_span": ratio(dense.get("span_ms"), sparse.get("span_ms")),
                    "wall": ratio(dense.get("wall_ms"), sparse.get("wall_ms"))},
    }


def analyse(res: dict) -> None:
    """``res["comparisons"]``: :func:`compare` of every measured 2:4 recipe against the baseline."""
    recs = {k: r for k, r in res["recipes"].items() if "categories_ms" in r}
    base = res.get("baseline")
    res["comparisons"] = {}
    if base not in recs:
        return
    if not sum(recs[base]["categories_ms"].values()):
        res["comparisons_note"] = "no device kernel time in the baseline's trace: no ceiling"
        return
    for label, r in recs.items():
        if r.get("sparse_layers") and label != base:
            if not sum(r.get("categories_ms", {}).values()):  # its trace failed or came back empty
                res.setdefault("comparisons_skipped", []).append(label)
                continue
            res["comparisons"][label] = compare(recs[base], r, r["flops"]["fraction_sparse"])


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _short(name: str, n: int = 90) -> str:
    return (name[:n] + "\u2026" if len(name) > n else name).replace("|", "\\|").replace("`", "'")


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.3f}x"


def to_markdown(res: dict) -> str:
    cfg = res["config"]
    recs = res["recipes"]
    names = list(recs)
    measured = [n for n in names if "categories_ms" in recs[n]]
    base = res.get("baseline")
    lines = [f"# Train-step time breakdown: {cfg['size']} (d={cfg['n_embd']}, {cfg['n_layer']} layers, "
             f"{cfg['attention']} attention), {cfg['batch_size']} x {cfg['seq_len']} = {cfg['tokens']:,} tokens, "
             f"{res['device']}", "",
             f"Command: `{res['command']}` (jax {res['jax']}, {res['date']}, CUDA kernels built: {res['cuda_kernels']})",
             ""]
    lines += ["## Step time per recipe", "",
              f"Wall: median of {res['timing']['rounds']} rounds x {res['timing']['iters']} steps; kernel time "
              f"(sum of the kernels' durations) and device span (first kernel start to last kernel end): "
              f"{res['timing']['traced_steps']} traced steps, per step.", "",
              "| recipe | wall (ms) | kernel time (ms) | device span (ms) | vs " + str(base) + ": wall | kernel time "
              "| device span |", "|---|---|---|---|---|---|---|"]
    b = recs.get(base, {})
    for n in names:
        r = recs[n]
        if "error" in r and "wall_ms" not in r:
            lines.append(f"| {n} | failed: {_short(r['error'].strip().splitlines()[-1], 120)} | | | | | |")
            continue

        def vs(key):
            return _x(b[key] / r[key]) if b.get(key) and r.get(key) else "-"

        lines.append(f"| {n} | {_ms(r.get('wall_ms'))} | {_ms(r.get('kernel_ms'))} | {_ms(r.get('span_ms'))} | "
                     f"{vs('wall_ms')} | {vs('kernel_ms')} | {vs('span_ms')} |")
    plans = [(n, recs[n]["kernel_plan"]) for n in names if recs[n].get("kernel_plan")]
    if plans:
        lines += ["", "GEMM kernels per 2:4 layer shape (in x out, `backend` plan):", ""]
        lines += [f"* {n}: " + train_gpt.format_plan(p) for n, p in plans]
    if measured and not any(recs[n].get("kernel_ms") for n in measured):
        lines += ["", "**No device kernels in the traces** (a CPU run?): only the wall-clock times are measured."]

    if measured:
        lines += ["", "## Kernel time per step by category (ms)", "",
                  "| category | " + " | ".join(measured) + " |", "|---|" + "---|" * len(measured)]
        for c in CATEGORIES:
            lines.append(f"| {c} | " + " | ".join(_ms(recs[n]["categories_ms"].get(c, 0.0)) for n in measured) + " |")
        lines.append("| **total** | " + " | ".join(f"**{_ms(recs[n]['kernel_ms'])}**" for n in measured) + " |")
        lines += ["", "Categories: " + "; ".join(f"*{c}*: {d}" for c, d in CATEGORIES.items()) + "."]

    for n, cmp in res.get("comparisons", {}).items():
        r, fl = recs[n], recs[n]["flops"]
        lines += ["", f"## {n} vs {base}: the {cmp['ceiling']:g}x GEMM ceiling and where the gap goes", "",
                  f"GEMM FLOPs per step (2·tokens·in·out per GEMM; forward, input and weight gradient of every linear "
                  f"layer): {fl['sparse'] / 1e12:.2f} TFLOP in the 2:4 layers, {fl['dense'] / 1e12:.2f} TFLOP in the "
                  f"other GEMMs (LM head, embedding, dense layers): f = {fl['fraction_sparse']:.3f}. Estimated "
                  f"{base} GEMM time of the 2:4 layers: f x {_ms(recs[base]['categories_ms'].get(GEMM_DENSE, 0.0))} ms "
                  f"= {_ms(cmp['dense_gemm_ms_of_sparse_layers'])} ms. Ceiling step = {base} − that x "
                  f"(1 − 1/{cmp['ceiling']:g}) = {_ms(cmp['ceiling_ms'])} ms of kernel time.", "",
                  "| | ms per step | speedup over " + str(base) + " |", "|---|---|---|",
                  f"| {base} (kernel time) | {_ms(cmp['dense_ms'])} | 1.000x |",
                  f"| ceiling (kernel time) | {_ms(cmp['ceiling_ms'])} | {_x(cmp['speedup']['ceiling'])} |",
                  f"| {n} (kernel time) | {_ms(cmp['recipe_ms'])} | {_x(cmp['speedup']['kernel_time'])} |",
                  f"| {n} (device span) | {_ms(r.get('span_ms'))} | {_x(cmp['speedup']['device_span'])} |",
                  f"| {n} (wall) | {_ms(r.get('wall_ms'))} | {_x(cmp['speedup']['wall'])} |", "",
                  f"| category | {n} (ms) | ideal (ms) | {n} − ideal (ms) | share of the gap |", "|---|---|---|---|---|"]
        for c in CATEGORIES:
            share = cmp["gap_share"][c]
            lines.append(f"| {c} | {_ms(r['categories_ms'].get(c, 0.0))} | {_ms(cmp['ideal_ms'][c])} | "
                         f"{cmp['gap_ms'][c]:+.2f} | {'-' if share is None else f'{100 * share:.0f}%'} |")
        lines.append(f"| **total** | **{_ms(cmp['recipe_ms'])}** | **{_ms(cmp['ceiling_ms'])}** | "
                     f"**{cmp['gap_total_ms']:+.2f}** (the gap) | 100% |")
        lines += ["", f"Ideal: the 2:4 layers' GEMMs at {base}'s time / {cmp['ceiling']:g}, no compress / MVUE / mask "
                  f"time, every other category as in {base}. The rows sum to the gap: Σ ({n} − ideal) = {n} − "
                  f"ceiling. The FLOP attribution is an estimate: it assumes all of {base}'s dense GEMMs run at the "
                  f"same FLOP rate, so the 2:4 layers' share of its GEMM time is their share of its GEMM FLOPs."]
        if r.get("fp8") and recs.get(base, {}).get("fp8"):
            lines[-1] += (f" {n} and {base} both run fp8 GEMMs: the ceiling is the 2:4 GEMMs at 1/{cmp['ceiling']:g} "
                          f"of {base}'s fp8 GEMM time, and *other* includes each one's own quantization work.")
        elif r.get("fp8"):
            lines[-1] += (f" {n} runs the 2:4 layers' forward and input-gradient GEMMs (and a sparse MVUE weight gradient) in fp8: the ceiling is still "
                          f"the bf16 2:4 GEMM's over bf16 dense, which fp8 GEMMs can beat (negative rows).")
    if res.get("comparisons_note"):
        lines += ["", res["comparisons_note"] + "."]
    if res.get("comparisons_skipped"):
        lines += ["", "No ceiling for " + ", ".join(res["comparisons_skipped"]) + ": no device kernel time in "
                  "its trace."]

    for n in measured:
        r = recs[n]
        if not r["kernels"]:
            continue
        total = sum(k["us"] for k in r["kernels"])
        lines += ["", f"## {n}: largest kernels (µs per step)", "",
                  "| kernel | category | µs | launches | share |", "|---|---|---|---|---|"]
        for k in r["kernels"][: res["timing"]["top"]]:
            lines.append(f"| `{_short(k['name'])}` | {k['category']} | {k['us']:.1f} | {k['launches']:g} | "
                         f"{100 * k['us'] / total:.1f}% |")
    if base in measured:
        bk = {(k["name"], k["category"]): k["us"] for k in recs[base]["kernels"]}
        for n in measured:
            if n == base or not recs[n]["kernels"]:
                continue
            ck = {(k["name"], k["category"]): k["us"] for k in recs[n]["kernels"]}
            diff = sorted(set(bk) | set(ck), key=lambda k: -abs(ck.get(k, 0.0) - bk.get(k, 0.0)))
            lines += ["", f"## {n} vs {base}: largest differences (µs per step)", "",
                      f"| kernel | category | {base} | {n} | difference |", "|---|---|---|---|---|"]
            for k in diff[: res["timing"]["top"]]:
                lines.append(f"| `{_short(k[0])}` | {k[1]} | {bk.get(k, 0.0):.1f} | {ck.get(k, 0.0):.1f} | "
                             f"{ck.get(k, 0.0) - bk.get(k, 0.0):+.1f} |")

    notes = [f"{n} failed after its wall-clock time: {_short(recs[n]['error'].strip().splitlines()[-1], 200)}"
             for n in names if "error" in recs[n] and "wall_ms" in recs[n]]
    for n in measured:
        r = recs[n]
        att = r.get("attribution_ms") or {}
        tot = sum(att.values())
        if tot:
            notes.append(f"{n}: {tot:.2f} ms per step of XLA's kernels are classified by their HLO op_name (the "
                         "optimizer and attention scopes), found by "
                         + ", ".join(f"{src}: {100 * v / tot:.0f}%" for src, v in sorted(att.items(), key=lambda x: -x[1]))
                         + f" (HLO text: {r.get('hlo', '-')})")
        elif r.get("hlo") and not r["hlo"].startswith("compiled"):
            notes.append(f"{n}: HLO text {r['hlo']}")
    if any(not (recs[n].get("hlo") or "").startswith("compiled") for n in measured):
        notes.append("without the compiled HLO text the optimizer's kernels are counted under *other*, unless the "
                     "trace's own op annotation names the scope")
    if notes:
        lines += ["", "## Notes", ""] + [f"* {x}" for x in notes]
    return "\n".join(lines) + "\n"


def summary(label: str, res: dict) -> str:
    """One line of a comparison: the speedups and the categories that hold most of the gap."""
    cmp = res["comparisons"][label]
    sp = cmp["speedup"]
    top = sorted(cmp["gap_ms"].items(), key=lambda kv: -abs(kv[1]))[:3]
    return (f"{label} vs {res['baseline']}: kernel time {_x(sp['kernel_time'])}, wall {_x(sp['wall'])}, "
            f"ceiling {_x(sp['ceiling'])}; gap {cmp['gap_total_ms']:+.2f} ms: "
            + ", ".join(f"{c} {v:+.2f}" for c, v in top))


def write(res: dict, out: Path, tag: str) -> None:
    """``out/step_breakdown_<tag>.json`` and ``.md`` (replaced)."""
    analyse(res)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"step_breakdown_{tag}.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    (out / f"step_breakdown_{tag}.md").write_text(to_markdown(res))


# ------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------

ATTENTION_LABEL = re.compile(r"([^@]+)@(auto|xla|cudnn)((?:\+fp8(?:-delayed|-flax)?)?(?:/per-call|/prepared)?)")


def split_attention(label: str) -> tuple[str, str | None]:
    """``RECIPE@ATTENTION[+fp8|+fp8-delayed|+fp8-flax][/per-call|/prepared]`` -> (the label without it, the
    attention kernel or None).

    >>> split_attention("dense@xla"), split_attention("srste@cutlass"), split_attention("dense@xla+fp8-flax")
    (('dense', 'xla'), ('srste@cutlass', None), ('dense+fp8-flax', 'xla'))
    """
    m = ATTENTION_LABEL.fullmatch(label)
    return (m.group(1) + m.group(3), m.group(2)) if m else (label, None)


def measure(rec: dict, label: str, rt, exes: dict, data, a, log) -> None:
    """One recipe into ``rec`` (filled as it goes: what was measured before an error stays):
    wall-clock step time, then the traced steps' kernels (per step)."""
    exp = rt.exp
    cfg = exp.cfg
    rec.update(recipe=exp.hp["recipe"], method=cfg.method, fp8=cfg.fp8, fp8_scaling=cfg.fp8_scaling,
               fp8_dense=cfg.fp8_dense, backend=cfg.backend,
               attention=model.attention_implementation(cfg.attention, cfg.dtype, cfg.n_embd // cfg.n_head),
               sparse_layers=len(exp.sparse_paths))
    tokens = exp.hp["batch_size"] * exp.hp["seq_len"]
    rec["flops"] = gemm_flops(rt.abstract_state["params"], exp.sparse_paths, tokens, exp.cfg.tie_head)
    rec["kernel_plan"] = train_gpt.kernel_plan(rt)
    exe, state, batches, _ = btg.warmed_up(rt, exes, label, data, a.warmup)
    hlo, rec["hlo"] = compiled_text(exe)
    op_names = hlo_op_names(hlo) if hlo else {}
    times, step = [], a.warmup
    with btg.collector("freeze"):
        for _ in range(a.rounds):
            state, t = btg.timed_steps(rt, exe, state, batches, a.iters, step)
            times.append(t)
            step += a.iters
    rec["wall_ms"] = 1e3 * statistics.median(times)
    rec["wall_rounds_ms"] = [1e3 * t for t in times]
    safe = re.sub(r"[^\w.+-]", "_", label)
    tdir = tempfile.mkdtemp(prefix=f"trace_{safe}_")
    try:
        # no HLO protos and no Python tracing in the trace: a 4-layer LLaMA-7B step with them
        # exceeded the profiler's 2 GB protobuf limit (and came back empty); the kernels' names are
        # matched to the compiled HLO text instead
        with jax.profiler.trace(tdir, profiler_options=_profile_options()):
            for i in range(a.steps):  # as the example runs them (a due mask refresh included)
                state, _ = rt.run_step(state, batches[i % len(batches)], step + i, None, train=exe)
            jax.block_until_ready(state)
        kt = kernel_times(tdir, op_names)
        if a.trace_dir:
            keep = Path(a.trace_dir) / safe
            shutil.copytree(tdir, keep, dirs_exist_ok=True)
            if hlo:
                (keep / "train_step.hlo.txt").write_text(hlo)
    finally:
        shutil.rmtree(tdir, ignore_errors=True)
    n = a.steps
    rec["kernel_ms"] = kt.total_us / n / 1e3
    rec["span_ms"] = kt.span_us / n / 1e3
    rec["categories_ms"] = {c: kt.categories.get(c, 0.0) / n / 1e3 for c in CATEGORIES}
    rec["attribution_ms"] = {k: v / n / 1e3 for k, v in kt.attribution.items()}
    rec["kernels"] = [dict(k, us=k["us"] / n, launches=k["launches"] / n) for k in kt.kernels]
    log(f"{label}: wall {rec['wall_ms']:.2f} ms, kernel time {rec['kernel_ms']:.2f} ms, device span "
        f"{rec['span_ms']:.2f} ms per step, {len(kt.kernels)} kernels")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="llama-300m", help=f"one of {list(train_gpt.SIZES)}")
    ap.add_argument("--recipes", default="dense,srste",
                    help="comma-separated bench_train_gpt.py labels (RECIPE[@BACKEND][+fp8|+fp8-delayed|+fp8-flax][/per-call|/prepared]); "
                         "RECIPE@ATTENTION (auto|xla|cudnn) picks the attention kernel of that recipe")
    ap.add_argument("--baseline", default="dense", help="the dense recipe the 2:4 ones are compared with")
    ap.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto",
                    help="attention kernel of every recipe without an @ATTENTION")
    for flag in ("n-layer", "n-head", "n-embd", "batch-size", "seq-len"):
        ap.add_argument(f"--{flag}", type=int, default=None, help=f"override the size's {flag}")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps after compilation (>= 1)")
    ap.add_argument("--rounds", type=int, default=5, help="wall-clock rounds (the median is reported)")
    ap.add_argument("--iters", type=int, default=10,
                    help="steps per wall-clock round (each round ends in a sync, so short rounds add the "
                         "dispatch of their first step: 4-step rounds put GPT-2 srste at 0.93-0.97x dense "
                         "while its kernel time equalled dense's)")
    ap.add_argument("--steps", type=int, default=5, help="traced steps")
    ap.add_argument("--top", type=int, default=20, help="rows of the per-kernel tables")
    ap.add_argument("--compile-workers", type=int, default=4, help="concurrent XLA compilations")
    ap.add_argument("--trace-dir", default=None, help="keep each recipe's trace and compiled HLO text here")
    ap.add_argument("--mesh", default=None, help="the example's --mesh over every visible device (--batch-size global); "
                    "the kernel times are the first GPU's")
    ap.add_argument("--vocab-size", type=int, default=None, help="the model's vocabulary (default the byte data's 256)")
    ap.add_argument("--remat", choices=("none", "dots", "full"), default=None, help="the example's --remat")
    ap.add_argument("--xla-preset", choices=sorted(btg.XLA_PRESETS), default="none",
                    help="bench_train_gpt.py's --xla-preset: a named set of XLA flags added to XLA_FLAGS before JAX starts")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default=None, help="results file name: step_breakdown_<tag>.json/.md "
                                                "(default: the backend and the size)")
    a = ap.parse_args(argv)
    btg.apply_xla_preset(a.xla_preset)

    labels = [r for r in a.recipes.split(",") if r]
    parsed = {lb: split_attention(lb) for lb in labels}
    bad = btg.label_errors(rl for rl, _ in parsed.values())
    if a.size not in train_gpt.SIZES or bad or not labels or min(a.warmup, a.rounds, a.iters, a.steps) < 1:
        print(f"bench_step_breakdown.py: error: bad --size {a.size!r} / --recipes {bad} or a count < 1; sizes "
              f"{list(train_gpt.SIZES)}, recipes {sorted(train_gpt.RECIPES)}", file=sys.stderr)
        return 2
    tag = a.tag or f"{jax.default_backend()}_{a.size}"

    def log(msg):
        print(msg, flush=True)

    import jax_sparse24

    d = train_gpt.SIZE_DEFAULTS[a.size]
    batch, seq = a.batch_size or d["batch_size"], a.seq_len or d["seq_len"]
    extra = (["--remat", a.remat] if a.remat else [])
    for flag in ("n_layer", "n_head", "n_embd"):
        if getattr(a, flag) is not None:
            extra += [f"--{flag.replace('_', '-')}", str(getattr(a, flag))]
    res = {"device": f"{jax.default_backend()}: {jax.devices()[0].device_kind}", "jax": jax.__version__,
           "cuda_kernels": bool(jax_sparse24.cuda_kernels_available()),
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "command": "python benchmarks/bench_step_breakdown.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "baseline": a.baseline, "ceiling": SPARSE_GEMM_CEILING, "categories": CATEGORIES,
           "timing": {"warmup": a.warmup, "rounds": a.rounds, "iters": a.iters, "traced_steps": a.steps, "top": a.top},
           "recipes": {}}
    t_start = time.perf_counter()
    log(f"{a.size}: batch {batch} x {seq}, recipes {labels}")
    rts = {}
    for lb, (rl, attention) in parsed.items():
        ex = extra + ["--attention", attention or a.attention]
        mesh = train_gpt.parse_mesh(a.mesh) if a.mesh else None
        rts[lb] = train_gpt.make_runtime(btg.experiment(a.size, rl, batch, seq, 10**6, ex, a.vocab_size), mesh)
    cfg = next(iter(rts.values())).exp.cfg
    kinds = sorted({model.attention_implementation(rt.exp.cfg.attention, cfg.dtype, cfg.n_embd // cfg.n_head)
                    for rt in rts.values()})
    res["config"] = {"size": a.size, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                     "ffn": cfg.ffn, "ffn_hidden": cfg.ffn_hidden, "sparse_attn": cfg.sparse_attn,
                     "batch_size": batch, "seq_len": seq, "tokens": batch * seq, "attention": " / ".join(kinds)}
    if res["baseline"] not in rts:  # else the first dense recipe
        res["baseline"] = next((lb for lb, rt in rts.items() if rt.exp.cfg.method == "dense"), None)
    try:
        exes = btg.compile_all(rts, False, a.compile_workers, log)
    except Exception:  # noqa: BLE001  (recorded in the report)
        res["error"] = traceback.format_exc()
        log(res["error"])
        write(res, a.out, tag)
        return 1
    data = train_gpt.ByteData(train_gpt.DEFAULT_DATA, seq, batch, seed=0, eval_batches=1)
    failed = False
    for lb, rt in rts.items():
        rec = res["recipes"][lb] = {}
        try:
            measure(rec, lb, rt, exes, data, a, log)
        except Exception:  # noqa: BLE001  (recorded; the other recipes still run)
            failed = True
            rec["error"] = traceback.format_exc()
            log(f"{lb}: failed\n{rec['error']}")
        exes.pop((lb, "train", None if rt.exp.cfg.method == "dense" else True), None)
        rts[lb] = None
        res["total_time_s"] = time.perf_counter() - t_start
        write(res, a.out, tag)
        if lb in res["comparisons"]:
            log(summary(lb, res))
    print(to_markdown(res))
    log(f"wrote {a.out / f'step_breakdown_{tag}.json'} and .md ({res['total_time_s']:.0f}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
