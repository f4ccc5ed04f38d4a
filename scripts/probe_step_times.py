"""Per-step times of one GPT recipe's train program: where do a timed round's slow steps come from?

``bench_train_gpt.py`` times rounds of N steps and reports the median round; a round with a slow
step shows up only as a large ``spread``. This script compiles the same program (the bench's
``_experiment`` / ``compile_all`` / ``warmed_up``), runs ``--steps`` steps with a sync after every step and
prints each slow step (above ``--slow`` × the median) with its optimizer step number, whether
``(step + 1) % mask_every == 0`` (srste mask refresh), and a summary: median, mean, p90, max.
Writes ``probe_step_times_<recipe>.json`` to ``--out``.

    python scripts/probe_step_times.py --size gpt2-medium --recipe srste [--steps 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402

import bench_train_gpt  # noqa: E402
import train_gpt  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="gpt2-medium", choices=sorted(train_gpt.SIZES))
    ap.add_argument("--recipe", default="srste",
                    help="RECIPE[@BACKEND][+fp8][/per-call|/prepared], as in bench_train_gpt.py")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--slow", type=float, default=1.2, help="report steps slower than this x the median")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 1:
        ap.error("--steps and --warmup must be >= 1")

    d = train_gpt.SIZE_DEFAULTS[a.size]
    batch, seq = a.batch_size or d["batch_size"], a.seq_len or d["seq_len"]
    rt = train_gpt.make_runtime(bench_train_gpt._experiment(
        a.size, a.recipe, batch, seq, 10**6, ["--grad-accum", str(a.grad_accum)]))
    exes = bench_train_gpt.compile_all({a.recipe: rt}, False, 1, lambda m: print(m, file=sys.stderr))
    data = train_gpt.ByteData(train_gpt.DEFAULT_DATA, seq, batch, seed=0, eval_batches=2)
    exe, state, batches, _ = bench_train_gpt.warmed_up(rt, exes, a.recipe, data, a.warmup)

    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        state, _ = rt.run_step(state, batches[i % 4], a.warmup + i, None, train=exe)  # + a due mask refresh
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    every = rt.exp.cfg.mask_every if rt.exp.cfg.method == "srste" else None
    slow = []
    for i, t in enumerate(times):
        if t > a.slow * med:
            step = a.warmup + i  # optimizer steps applied before this one
            slow.append({"index": i, "step": step, "ms": 1e3 * t,
                         "mask_refresh": bool(every and (step + 1) % every == 0)})
    srt = sorted(times)
    res = {"device": jax.devices()[0].device_kind, "size": a.size, "recipe": a.recipe, "batch": batch, "seq": seq,
           "grad_accum": a.grad_accum, "steps": a.steps, "mask_every": every, "median_ms": 1e3 * med,
           "mean_ms": 1e3 * statistics.fmean(times), "p90_ms": 1e3 * srt[int(0.9 * (len(srt) - 1))],
           "max_ms": 1e3 * srt[-1], "slow_steps": slow, "times_ms": [1e3 * t for t in times]}
    print(f"{a.recipe} {a.size}: median {res['median_ms']:.2f} ms, mean {res['mean_ms']:.2f}, p90 {res['p90_ms']:.2f}, "
          f"max {res['max_ms']:.2f}; {len(slow)} steps > {a.slow}x median")
    for s in slow:
        print(f"  step {s['step']:5d} {s['ms']:8.2f} ms" + ("  (mask refresh)" if s["mask_refresh"] else ""))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        name = a.recipe.replace("/", "_").replace("@", "_at_")
        (a.out / f"probe_step_times_{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
