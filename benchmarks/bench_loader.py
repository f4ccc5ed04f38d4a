"""Benchmark: does the train step wait on data? The example's step fed by its loader vs a fixed batch.

Issue target: at GPT-2 124M on an H100 the step time with the loader (``--data DIR`` of
``examples/prepare_data.py``: random windows of the token memmap, read by a prefetch thread) equals the
step time on a fixed, already-placed batch within 1%.

Both modes run the same compiled train program of the example (``Runtime.run_step``, as
``train_gpt.py`` runs it) on one train state, interleaved: a round of ``--iters`` steps that take each
step's batch as the training loop does (``data.batch(step)`` from the prefetch queue, then
``Runtime.put`` to the devices), then a round on four batches placed before the rounds (cycled), and so
on for ``--rounds`` rounds after ``--warmup`` steps; one sync per round. The table gives the median step
time of each mode and their ratio; a second fixed-batch column (``fixed (control)``) is the noise floor.

    python benchmarks/bench_loader.py --data runs/data/realtext_bpe32k --size gpt2            # GPU
    python benchmarks/bench_loader.py --data DIR --size tiny --rounds 3 --iters 5 --out /tmp  # CPU check
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402

import bench_train_gpt  # noqa: E402
from result_files import write_result  # noqa: E402
import train_gpt  # noqa: E402
from data import load_data  # noqa: E402

MODES = ("loader", "fixed", "fixed (control)")


def measure(rt, exes, recipe: str, data, warmup: int, iters: int, rounds: int, log) -> dict:
    """Seconds per step of each mode in :data:`MODES` over interleaved rounds (the order rotates), after
    ``bench_train_gpt``'s warm-up (which also places the four fixed batches); the fixed rounds are its
    ``timed_steps``."""
    exe, state, fixed, _ = bench_train_gpt.warmed_up(rt, exes, recipe, data, warmup)
    step = fed = warmup  # fed: the loader's own step count: its rounds read consecutive batches, as training
    #                      does (a jump would restart the prefetch queue)
    times = {m: [] for m in MODES}
    for rnd in range(rounds):
        for mode in MODES[rnd % 3:] + MODES[:rnd % 3]:
            if mode == "loader":
                t0 = time.perf_counter()
                for i in range(iters):
                    state, _ = rt.run_step(state, rt.put(data.batch(fed + i)), step + i, None, train=exe)
                jax.block_until_ready(state)
                t, fed = (time.perf_counter() - t0) / iters, fed + iters
            else:
                state, t = bench_train_gpt.timed_steps(rt, exe, state, fixed, iters, step)
            times[mode].append(t)
            step += iters
        log(f"  round {rnd + 1}/{rounds}: " + ", ".join(f"{m} {1e3 * times[m][-1]:.2f} ms" for m in MODES))
    return times


def to_markdown(res: dict) -> str:
    lines = [f"# The loader's cost in the train step ({res['device']}, jax {res['jax']})", "",
             f"Command: `{res['command']}`", "",
             f"{res['size']}, recipe {res['recipe']}, batch {res['batch_size']} x {res['seq_len']} tokens, data "
             f"`{res['data']}` ({res['train_tokens']:,} train tokens); median of {res['rounds']} interleaved rounds x "
             f"{res['iters']} steps after {res['warmup']} warm-up steps.", "",
             "| batches from | step (ms) | tokens/s | vs fixed batch | spread |", "|---|---|---|---|---|"]
    for m in MODES:
        r = res["modes"][m]
        lines.append(f"| {m} | {1e3 * r['median_step_s']:.2f} | {r['tokens_per_s']:,.0f} | {r['vs_fixed']:.4f}x | "
                     f"{100 * r['spread']:.1f}% |")
    lines += ["", "`loader`: each step's batch from the example's loader (`data.batch(step)`: the prefetch "
              "thread's random windows of the memmap) and `Runtime.put`, as `train_gpt.py` feeds its steps; `fixed`: "
              "four batches placed on the device before the rounds. `vs fixed batch` is tokens/s over the `fixed` "
              "row's (target for `loader`: at least 0.99); `fixed (control)` is the same as `fixed`, timed in its own "
              "rounds (the noise floor). `spread` = (max − min) / median of the per-round step times.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a token directory of examples/prepare_data.py")
    ap.add_argument("--size", default="gpt2", choices=list(train_gpt.SIZES))
    ap.add_argument("--recipe", default="dense", help="the recipe whose step is timed (default dense: the fastest "
                                                      "step, where a slow loader shows most)")
    ap.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the size's)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the size's)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20, help="steps per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--flags", default="", help="more example flags, e.g. '--n-layer 1' (quoted)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default=None, help="results file name: loader_<tag>.json/.md (default: the backend)")
    a = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    d = train_gpt.SIZE_DEFAULTS[a.size]
    batch, seq = a.batch_size or d["batch_size"], a.seq_len or d["seq_len"]
    if not a.data.is_dir() or a.warmup < 1 or a.iters < 1 or a.rounds < 1:
        print("bench_loader.py: error: --data must be a token directory of examples/prepare_data.py, and --warmup, "
              "--iters and --rounds at least 1", file=sys.stderr)
        return 2
    try:
        data = load_data(a.data, seq, batch, seed=0, eval_batches=1)
    except train_gpt.CLIError as e:
        print(f"bench_loader.py: error: {e}", file=sys.stderr)
        return 2
    try:
        extra = shlex.split(a.flags)
        rt = train_gpt.make_runtime(bench_train_gpt.experiment(a.size, a.recipe, batch, seq, 10**6, extra,
                                                                data.vocab_size), None)
        exes = bench_train_gpt.compile_all({a.recipe: rt}, False, 1, log)
        times = measure(rt, exes, a.recipe, data, a.warmup, a.iters, a.rounds, log)
    finally:
        if hasattr(data, "close"):
            data.close()
    base = statistics.median(times["fixed"])
    res = {"device": f"{jax.default_backend()}: {jax.devices()[0].device_kind}", "jax": jax.__version__,
           "command": "python benchmarks/bench_loader.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "size": a.size, "recipe": a.recipe, "batch_size": batch, "seq_len": seq, "data": str(a.data),
           "train_tokens": len(data.train), "warmup": a.warmup, "iters": a.iters, "rounds": a.rounds,
           "modes": {}}
    for m, ts in times.items():
        med = statistics.median(ts)
        res["modes"][m] = {"median_step_s": med, "tokens_per_s": batch * seq / med, "vs_fixed": base / med,
                           "spread": (max(ts) - min(ts)) / med, "step_times_s": ts}
    tag = a.tag or jax.default_backend()
    md = to_markdown(res)
    write_result(a.out, f"loader_{tag}", res, md, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
