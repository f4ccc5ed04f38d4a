"""Why a train step's speed differs between the benchmark's timed rounds and the example's loop.

``bench_train_gpt.py`` times AOT-compiled executables on four fixed batches in rounds without a
fetch; ``benchmarks/harness/train_gpt.py`` calls the jitted step on a fresh batch every step and fetches the
metrics every ``--log-every`` steps. This probe times the same programs both ways and in between,
rounds interleaved over (recipe, loop), and prints ms per step and the ratio to dense per loop:

* ``aot``: the benchmark's executable, fixed batches, one sync per round;
* ``jit``: the example's jitted step (``Runtime.train_step``), fixed batches;
* ``jit+put``: a new batch from the data each step (``rt.put(data.batch(step))``);
* ``jit+put+fetch``: and the round's metrics fetched at its end, timed from the previous fetch
  (the example's ``TrainLog``).

    python scripts/probe_loop.py --size gpt2 --recipes dense,srste,srste/prepared [--rounds 5 --iters 10]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402

import bench_train_gpt  # noqa: E402
import train_gpt  # noqa: E402

LOOPS = ("aot", "jit", "jit+put", "jit+put+fetch")


def run_round(loop, exe, jitted, state, batches, data, rt, step0, iters):
    """``iters`` steps of ``loop`` from ``state``: (state, seconds per step). ``aot`` and ``jit`` are
    the benchmark's own timed round (:func:`bench_train_gpt.timed_steps`) on either callable."""
    if loop in ("aot", "jit"):
        return bench_train_gpt.timed_steps(rt, exe if loop == "aot" else jitted, state, batches, iters, step0)
    t0 = time.perf_counter()
    metrics = []
    for i in range(iters):
        state, m = rt.run_step(state, rt.put(data.batch(step0 + i)), step0 + i, None, train=jitted)
        metrics.append(m)
    if loop == "jit+put+fetch":
        jax.device_get(metrics)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - t0) / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="gpt2", choices=sorted(train_gpt.SIZES))
    ap.add_argument("--recipes", default="dense,srste,srste/prepared",
                    help="bench_train_gpt.py labels; the first must be dense for the ratios")
    ap.add_argument("--n-layer", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args(argv)
    labels = a.recipes.split(",")
    if labels[0] != "dense":
        ap.error("the first of --recipes must be dense (the ratios' reference)")
    d = train_gpt.SIZE_DEFAULTS[a.size]
    batch, seq = d["batch_size"], d["seq_len"]
    extra = [] if a.n_layer is None else ["--n-layer", str(a.n_layer)]
    rts = {lb: train_gpt.make_runtime(bench_train_gpt.experiment(a.size, lb, batch, seq, 10**6, extra))
           for lb in labels}
    exes = bench_train_gpt.compile_all(rts, False, 4, lambda m: print(m, file=sys.stderr))
    data = train_gpt.ByteData(train_gpt.DEFAULT_DATA, seq, batch, seed=0, eval_batches=2)
    runs = {}
    for lb in labels:
        exe, state, batches, _ = bench_train_gpt.warmed_up(rts[lb], exes, lb, data, a.warmup)
        rt = rts[lb]
        jitted = rt.train_step(None if rt.exp.cfg.method == "dense" else True)
        state, _ = rt.run_step(state, batches[0], a.warmup, None, train=jitted)  # compile it outside the rounds
        jax.block_until_ready(state)
        runs[lb] = dict(exe=exe, jitted=jitted, state=state, batches=batches, rt=rt, times={lp: [] for lp in LOOPS},
                        step=a.warmup + 1)
    keys = [(lb, lp) for lb in labels for lp in LOOPS]
    gc.collect()
    gc.freeze()  # as the benchmark and the example: the compiled programs out of the collector's reach
    for rnd in range(a.rounds):
        for lb, lp in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
            r = runs[lb]
            r["state"], t = run_round(lp, r["exe"], r["jitted"], r["state"], r["batches"], data, r["rt"], r["step"],
                                      a.iters)
            r["step"] += a.iters
            r["times"][lp].append(t)
    med = {(lb, lp): statistics.median(runs[lb]["times"][lp]) for lb, lp in keys}
    print("| recipe | " + " | ".join(f"{lp} ms | vs dense" for lp in LOOPS) + " |")
    print("|---|" + "---|---|" * len(LOOPS))
    for lb in labels:
        cells = [f"{1e3 * med[(lb, lp)]:.2f} | {med[(labels[0], lp)] / med[(lb, lp)]:.3f}x" for lp in LOOPS]
        print(f"| {lb} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
