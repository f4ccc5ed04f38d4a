"""The end-to-end benchmark scripts run on the CPU (tiny model) and write what they promise."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_train_gpt  # noqa: E402
import gpt_experiment  # noqa: E402

SHAPE = ["--n-embd", "32", "--n-layer", "1", "--n-head", "2"]


def test_partition_profile_counts_a_compile_and_profiles_it():
    """benchmarks/partition_profile.py (imported by bench_train_gpt) counts the partitioner callbacks of a
    compile per rule (the call and the tracing of the per-shard function), and a profile set with
    profile_partition_callbacks sees them."""
    import cProfile

    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_sparse24 as s24
    import partition_profile as pp
    from jax_sparse24 import sharding as shd

    if len(jax.devices("cpu")) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    cache = jax.config.jax_enable_compilation_cache  # a cache hit would skip the partitioner
    jax.config.update("jax_enable_compilation_cache", False)
    mesh = shd.make_mesh("data=2,model=4", devices=jax.devices("cpu")[:8])
    sh = NamedSharding(mesh, P("data", "model"))
    x = jnp.asarray(np.random.default_rng(1).normal(size=(32, 56)), jnp.float32)  # a shape no other test compiles
    before = pp.partition_callback_stats()
    prof = cProfile.Profile()
    pp.profile_partition_callbacks(prof)
    try:
        jax.jit(lambda x: s24.mask24(x, axis=0), in_shardings=sh, out_shardings=sh).lower(x).compile()
    finally:
        pp.profile_partition_callbacks(None)
        jax.config.update("jax_enable_compilation_cache", cache)
    after = pp.partition_callback_stats()
    grew = {r for r, (n, _) in after.items() if n > before.get(r, (0, 0.0))[0]}
    assert "mask24 (trace)" in grew and "mask24" in grew, grew
    assert all(after[r][1] >= before.get(r, (0, 0.0))[1] for r in grew)
    assert prof.getstats(), "the profile saw no callback"


def test_bench_train_gpt_width_override_and_quality(tmp_path):
    argv = ["--size", "tiny", "--quick", "--recipes", "dense,srste,srste/per-call", "--quality-steps", "2", "--rounds", "2",
            "--iters", "1", "--compile-workers", "2", "--grad-accum", "2", "--park", "host", *SHAPE, "--out", str(tmp_path),
            "--tag", "t"]
    assert bench_train_gpt.main(argv) == 0
    res = json.loads((tmp_path / "train_gpt_t.json").read_text())
    tp = res["throughput"][0]
    assert (tp["n_embd"], tp["n_layer"], tp["n_head"], tp["attention"]) == (32, 1, 2, "xla")
    assert [r["variant"] for r in tp["rows"]] == ["dense", "srste", "srste/per-call", "dense (control)"]
    assert all(r["median_step_s"] > 0 for r in tp["rows"])
    for r in tp["rows"]:  # the mean of the recorded rounds, and its ratio to dense's mean
        assert abs(r["mean_step_s"] - sum(r["step_times_s"]) / len(r["step_times_s"])) < 1e-12
    d_mean = tp["rows"][0]["mean_step_s"]
    assert all(abs(r["vs_dense_mean"] - d_mean / r["mean_step_s"]) < 1e-12 for r in tp["rows"])
    assert set(res["quality"]["recipes"]) == {"dense", "srste", "srste/per-call"}
    md = (tmp_path / "train_gpt_t.md").read_text()
    assert tp["auto_plan"] == {shape: {"forward": "dense", "input_grad": "dense", "weight_grad": "dense (exact)"}
                               for shape in ("32x128", "128x32")}  # CPU: every GEMM dense
    assert "32x128: fwd dense, dx dense, dW dense (exact)" in md
    assert tp["gc"] == "freeze" and set(tp["gc_pauses"]) == {"gen0", "gen1", "gen2"}
    assert "Python gc frozen" in md and not __import__("gc").get_freeze_count()  # unfrozen after the rounds
    assert "| vs dense (mean of rounds) |" in md and f"| {tp['rows'][1]['vs_dense_mean']:.3f}x |" in md
    assert "d=32, 1 layers, 2 micro-batches" in md and "xla attention" in md and tp["grad_accum"] == 2
    assert tp["park_idle"] and "the other variants' states in host memory during a round" in md
    assert bench_train_gpt.main(["--size", "huge", "--out", str(tmp_path)]) == 2
    assert bench_train_gpt.main(["--size", "tiny", "--recipes", "fast/per-call", "--out", str(tmp_path)]) == 2
    exp = bench_train_gpt.experiment("tiny", "srste/per-call", 4, 32, 10, ["--grad-accum", "2"])
    assert exp.hp["prepare_weights"] == "off" and exp.hp["recipe"] == "srste"
    assert bench_train_gpt.experiment("tiny", "srste", 4, 32, 10, ["--grad-accum", "2"]).hp["prepare_weights"] == "on"
    # RECIPE@BACKEND: the example's --sparse-backend, combinable with /per-call
    exp = bench_train_gpt.experiment("tiny", "srste@dense/per-call", 4, 32, 10, ["--grad-accum", "2"])
    assert (exp.hp["recipe"], exp.hp["sparse_backend"], exp.hp["prepare_weights"], exp.cfg.backend) == (
        "srste", "dense", "off", "dense")
    assert bench_train_gpt.experiment("tiny", "sste", 4, 32, 10, []).cfg.backend == "auto"
    assert bench_train_gpt.main(["--size", "tiny", "--recipes", "srste@fast", "--out", str(tmp_path)]) == 2


def test_shared_control_steps_the_dense_state_instead_of_a_third_one(tmp_path, monkeypatch):
    warmed, stepped = [], []
    real, real_timed = bench_train_gpt.warmed_up, bench_train_gpt.timed_steps
    monkeypatch.setattr(bench_train_gpt, "warmed_up", lambda rt, exes, recipe, *a: warmed.append(recipe) or real(rt, exes, recipe, *a))

    def timed(rt, exe, state, batches, iters, step):
        stepped.append((rt.exp.cfg.method, step))
        return real_timed(rt, exe, state, batches, iters, step)

    monkeypatch.setattr(bench_train_gpt, "timed_steps", timed)
    argv = ["--size", "tiny", "--quick", "--recipes", "dense,srste", "--quality-steps", "0", "--rounds", "2", "--iters", "1",
            "--compile-workers", "2", "--control", "shared", *SHAPE, "--out", str(tmp_path), "--tag", "s"]
    assert bench_train_gpt.main(argv) == 0
    assert warmed == ["dense", "srste"]  # no state of its own for the control
    tp = json.loads((tmp_path / "train_gpt_s.json").read_text())["throughput"][0]
    assert tp["control"] == "shared" and [r["variant"] for r in tp["rows"]] == ["dense", "srste", "dense (control)"]
    assert all(len(r["step_times_s"]) == 2 for r in tp["rows"])
    assert "the dense variant's own state stepped again in a round of its own (`--control shared`)" in (
        tmp_path / "train_gpt_s.md").read_text()
    # dense's rounds and the control's continue one step count (warm-up 3, then 1 step per round)
    assert sorted(s for m, s in stepped if m == "dense") == [3, 4, 5, 6]
    assert bench_train_gpt.main(["--size", "tiny", "--recipes", "srste", "--control", "shared", "--out", str(tmp_path)]) == 2


def test_clock_sampler_averages_the_samples_inside_each_label_s_windows():
    import time

    from gpu_clock import ClockSampler

    # a stand-in for nvidia-smi: a sample every 10 ms, the clock counting up, junk lines ignored
    fake = [sys.executable, "-u", "-c",
            "import time\nprint('[N/A], [N/A]', flush=True)\n"
            "for i in range(10**6):\n    print(f'{1000 + i}, 500.5', flush=True); time.sleep(0.01)"]
    with ClockSampler(command=fake) as clk:
        time.sleep(0.3)
        t0 = time.perf_counter()
        time.sleep(0.2)
        t1 = time.perf_counter()
        clk.window("a", t0, t1)
        time.sleep(0.2)
        clk.window("a", time.perf_counter() - 0.1, time.perf_counter())
        clk.window("nothing", t1 + 1e3, t1 + 2e3)  # no samples inside: left out
    summ = clk.summary()
    inside = [m for t, m, _ in clk.samples if t0 <= t <= t1 or clk.windows["a"][1][0] <= t <= clk.windows["a"][1][1]]
    assert set(summ) == {"a"} and summ["a"]["samples"] == len(inside) >= 10
    assert summ["a"]["sm_mhz"] == pytest.approx(sum(inside) / len(inside)) and summ["a"]["power_w"] == 500.5
    assert all(m >= 1000 for _, m, _ in clk.samples)  # the junk line is not a sample
    assert clk._proc.poll() is not None  # the sampler process ended with the block
    with ClockSampler(command=["/nonexistent/nvidia-smi"]) as none:  # no sampler: nothing, no error
        none.window("a", 0.0, 1e9)
    assert none.summary() == {}


def test_bench_train_gpt_markdown_shows_the_clock_column_only_with_samples():
    rows = [{"variant": "dense", "median_step_s": 0.025, "tokens_per_s": 6.5e5, "vs_dense": 1.0, "spread": 0.01,
             "vs_dense_mean": 1.0, "gpu_clock": {"sm_mhz": 1712.4, "power_w": 688.9, "samples": 9}},
            {"variant": "srste", "median_step_s": 0.024, "tokens_per_s": 6.8e5, "vs_dense": 1.04, "spread": 0.01,
             "vs_dense_mean": 1.04, "gpu_clock": None}]
    res = {"device": "gpu: X", "jax": "0", "command": "c", "cuda_kernels": True,
           "throughput": [{"size": "gpt2", "n_params": 1e8, "batch_size": 16, "seq_len": 1024, "rounds": 5, "iters": 10,
                           "rows": rows}]}
    md = bench_train_gpt.to_markdown(res)
    assert "| compile (s) | SM MHz / W |" in md and "| 1712 / 689 |" in md and "| - | – |" in md
    rows[0].update(model_tflops_per_gpu=445.2, compile_s=31.4)
    assert "| 445 | 45.0% | 31.4 |" in bench_train_gpt.to_markdown(res)  # MFU of the 989.4 TFLOP/s peak
    for r in rows:
        r["gpu_clock"] = None
    assert "SM MHz / W |" not in bench_train_gpt.to_markdown(res)


def test_bench_train_gpt_park_moves_a_state_to_host_and_back_unchanged():
    import jax

    exp = bench_train_gpt.experiment("tiny", "srste", 4, 32, 10, SHAPE)
    rt = bench_train_gpt.train_gpt.make_runtime(exp)
    state = rt.init()
    r = {"rt": rt, "state": state}
    bench_train_gpt.park(r)
    leaves = jax.tree.leaves(r["state"])
    assert leaves and not any(isinstance(x, jax.Array) for x in leaves)  # host copies, device buffers dropped
    bench_train_gpt.unpark(r)
    back = jax.tree.leaves(r["state"])
    assert all(isinstance(x, jax.Array) for x in back)
    assert jax.tree.structure(r["state"]) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), back):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for x, sh in zip(back, jax.tree.leaves(rt.state_shardings)):
        assert x.sharding.is_equivalent_to(sh, x.ndim)
    bench_train_gpt.unpark(r)  # already on the device: unchanged
    assert all(x is y for x, y in zip(back, jax.tree.leaves(r["state"])))
    state2, _ = rt.run_step(r["state"], rt.put(np.zeros((4, 32), np.int32)), 0, True)  # the runtime takes it
    assert jax.tree.structure(state2) == jax.tree.structure(state)


_LOOP_HLO = """HloModule m

%fused_computation.1 (a: bf16[8]) -> bf16[8] {
  %c = bf16[8] custom-call(a), custom_call_target="jax_sparse24_cutlass_spmm"
}

%region_0.2 (arg: (s32[], f32[8])) -> (s32[], f32[8]) {
  %x = bf16[8] custom-call(a), custom_call_target="jax_sparse24_masked_compress"
  %f = bf16[8] fusion(x), kind=kCustom, calls=%fused_computation.1
}

%cond.3 (arg: (s32[], f32[8])) -> pred[] {
  %lt = pred[] compare(a, b), direction=LT
}

ENTRY %main.4 (p: bf16[8]) -> f32[8] {
  %y = bf16[8] custom-call(p), custom_call_target="jax_sparse24_masked_compress"
  %w = (s32[], f32[8]) while(t), condition=%cond.3, body=%region_0.2
}
"""


def test_probe_hoist_places_custom_calls():
    """probe_hoist counts a call as in the loop when the while body reaches it (here via a fusion)."""
    import probe_hoist

    places = probe_hoist.custom_calls_by_place(_LOOP_HLO)
    assert places["in loop"] == {"jax_sparse24_masked_compress": 1, "jax_sparse24_cutlass_spmm": 1}
    assert places["outside"] == {"jax_sparse24_masked_compress": 1}


def test_every_benchmark_and_script_compiles():
    """GPU-only scripts cannot run here; at least they must parse (a syntax error would only show
    on the GPU machine)."""
    files = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    assert len(files) >= 8
    for f in files:
        compile(f.read_text(), str(f), "exec")  # SyntaxError names the file and line


def test_bench_layer_command_line(capsys):
    """bench_layer's options parse without a GPU (--help exits before any kernel is needed)."""
    import subprocess

    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_layer.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--tokens" in out and "--name" in out


def test_bench_spmm_cusparselt_table_and_options():
    """bench_spmm's markdown renders the cuSPARSELt rows beside CUTLASS (a record shaped like the
    GPU run's) and leaves them out for a run without them; its options parse without a GPU."""
    import json
    import subprocess

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_spmm

    data = json.loads((ROOT / "benchmarks" / "results" / "spmm.json").read_text())
    rec = data["records"][-1]
    assert {"cusparselt_ms", "cusparselt_speedup", "cusparselt_speedup_with_compress"} <= set(rec)
    md = bench_spmm.markdown(data["meta"], [rec])
    section = md.split("cuSPARSELt in the same trials", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| 8192, 8192, 8192 | bfloat16 |"))
    assert f"| {rec['cusparselt_ms']:.3f} |" in row
    assert f"**{rec['cusparselt_speedup']:.2f}×**" in row and f"{rec['best_speedup']:.2f}×" in row
    plain = {k: v for k, v in rec.items() if not k.startswith("cusparselt")}
    assert "cuSPARSELt in the same trials" not in bench_spmm.markdown(data["meta"], [plain])
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_spmm.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--dtypes" in out and "--no-cusparselt" in out


def test_collector_records_collections_and_restores_on_error():
    import gc

    import pytest

    n_callbacks = len(gc.callbacks)
    with bench_train_gpt.collector("freeze") as pauses:
        assert gc.get_freeze_count() > 0
        gc.collect()
    assert [g for g, _ in pauses] == [2] and pauses[0][1] >= 0
    with pytest.raises(RuntimeError), bench_train_gpt.collector("freeze"):
        raise RuntimeError("a failing round")
    assert gc.get_freeze_count() == 0 and len(gc.callbacks) == n_callbacks


def test_bench_layer_shapes_option():
    """--shapes I:O replaces the FFNs of --dims in the compress and gemm sections; bad shapes are refused."""
    import argparse

    import pytest

    import bench_layer

    assert bench_layer.parse_shape("4096:11008") == (4096, 11008)
    for bad in ("4096", "4096:11007", "a:b", "0:8"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_layer.parse_shape(bad)
    try:
        bench_layer.SHAPES = [(4096, 22016), (11008, 4096)]
        assert bench_layer._layers([768]) == [(4096, "4096x22016", 4096, 22016), (11008, "11008x4096", 11008, 4096)]
    finally:
        bench_layer.SHAPES = None
    assert bench_layer._layers([768]) == [(768, "up", 768, 3072), (768, "down", 3072, 768)]


def test_bench_layer_prepare_section_smoke(tmp_path):
    """bench_layer's prepare section (GPT-2's weights prepared per layer vs batched) in its CPU smoke
    mode: the nn.prepare rows only, the same bits both ways, the table written."""
    import bench_layer

    tokens = bench_layer.TOKENS
    try:
        bench_layer.main(["--smoke-cpu", "--sections", "prepare", "--prepare-layers", "1", "--trials", "1",
                          "--out", str(tmp_path), "--name", "p"])
    finally:
        bench_layer.TOKENS = tokens
    md = (tmp_path / "p.md").read_text()
    assert "per layer vs batched" in md and "Batched == per layer bit for bit: True" in md
    assert "| nn.prepare GPT-2 (1 layers): batched |" in md


def test_bench_quality_tiny(tmp_path):
    """bench_quality trains every recipe (dense-tail and a NAME:FLAGS entry too) from one seed on the
    same batches at a token budget, with a separate validation file, and writes the table and plot."""
    import bench_quality

    corpus = (ROOT / "examples" / "data" / "corpus.txt").read_bytes()
    (tmp_path / "train.txt").write_bytes(corpus[:30000])
    (tmp_path / "val.txt").write_bytes(corpus[-4000:])
    flags = "--n-layer 1 --n-embd 32 --n-head 2 --batch-size 4 --seq-len 32 --warmup 2 --mask-every 2"
    common = ["--size", "tiny", "--tokens", str(6 * 4 * 32), "--flags", flags, "--evals", "2", "--eval-batches", "1",
              "--data", str(tmp_path / "train.txt"), "--val-data", str(tmp_path / "val.txt"),
              "--runs", str(tmp_path / "runs"), "--out", str(tmp_path), "--tag", "t"]
    # two processes into one --runs directory: the second one's table has every recipe of both
    assert bench_quality.main([*common, "--recipes", "srste-a0:srste --decay-alpha 0,step,dense-tail"]) == 0
    assert list(json.loads((tmp_path / "quality_t.json").read_text())["runs"]) == ["step", "dense-tail", "srste-a0"]
    # (sste and ste go through the same generic path here; test_train_gpt trains them)
    assert bench_quality.main([*common, "--recipes", "dense,srste"]) == 0
    res = json.loads((tmp_path / "quality_t.json").read_text())
    assert res["steps"] == 6 and res["tokens"] == 6 * 4 * 32 and res["val_bytes"] == 4000
    assert list(res["runs"]) == ["dense", "srste", "step", "dense-tail", "srste-a0"]
    runs = res["runs"]
    assert runs["dense-tail"]["config"]["finetune_fraction"] == 0.5 and runs["dense-tail"]["phase_step"] == 3
    assert runs["srste-a0"]["config"]["decay_alpha"] == 0 and runs["srste"]["config"]["decay_alpha"] > 0
    first = {k: r["val_history"][0]["val_loss"] for k, r in runs.items()}  # same init: dense vs 2:4 at step 0 differ
    assert first["srste"] == first["dense-tail"] == first["srste-a0"]
    assert len({json.dumps(r["config"]["data_sha256"]) for r in runs.values()}) == 1
    # the compact result: no per-step history; the 6 train steps in the thinned trace (one step per bucket here)
    assert all("history" not in r and r["train_trace"]["steps_logged"] == 6 for r in runs.values())
    assert all(r["train_trace"]["step"] == list(range(1, 7)) for r in runs.values())
    md = (tmp_path / "quality_t.md").read_text()
    assert "| dense-tail | `srste --finetune-fraction 0.5` |" in md and "val.txt" in md
    assert "Commands (2 processes" in md and "--recipes dense,srste" in md
    assert (tmp_path / "quality_t.png").stat().st_size > 0
    assert (tmp_path / "runs" / "srste-a0" / "metrics.jsonl").is_file()
    # the final evaluation over the whole (small) val text: 4000 bytes hold 121 windows of 33 -> 30 batches of 4
    assert all(r["final_eval_tokens"] == 30 * 4 * 32 for r in runs.values())
    assert all(np.isfinite(r["final_val_loss_full"]) for r in runs.values())
    assert runs["dense"]["final_val_loss_full"] != runs["dense"]["final_val_loss"]  # more windows than the 1 batch
    full_vs = 100 * (runs["srste"]["final_val_loss_full"] / runs["dense"]["final_val_loss_full"] - 1)
    full = {k: json.loads((tmp_path / "runs" / k / "result.json").read_text())["run"]["history"]
            for k in ("dense", "srste")}  # --runs keeps each run's per-step history
    assert runs["srste"]["tail_train_loss"] == bench_quality.tail_train_loss(full["srste"])
    assert (runs["srste"]["spike"], runs["srste"]["spike_step"]) == bench_quality.spike(full["srste"])
    tail_vs = 100 * (runs["srste"]["tail_train_loss"] / runs["dense"]["tail_train_loss"] - 1)
    assert f"| {runs['srste']['final_val_loss_full']:.4f} | {full_vs:+.2f}% |" in md and f"| {tail_vs:+.2f}% |" in md
    assert "3,840 val tokens" in md
    # the lowest evaluation after step 0 and when it came; the budget over the text's size
    best = {k: min(h["val_loss"] for h in r["val_history"] if h["step"] > 0) for k, r in runs.items()}
    assert runs["srste"]["best_val_loss"] == best["srste"]
    assert bench_quality.best_val_loss(runs["srste"]["val_history"]) == (best["srste"], runs["srste"]["best_val_step"])
    assert f"| {best['srste']:.4f} (" in md and f"| {100 * (best['srste'] / best['dense'] - 1):+.2f}% |" in md
    assert "The budget covers 2.6% of the training text." in md  # 6 x 4 x 32 of 30,000 bytes
    assert bench_quality.best_val_loss([{"step": 0, "val_loss": 1.0}, {"step": 5, "val_loss": 2.0},
                                        {"step": 9, "val_loss": 1.5}]) == (1.5, 9)
    # the tail is the mean of the last 5% of the logged steps (at least one)
    assert bench_quality.tail_train_loss([{"step": i, "loss": float(i)} for i in range(40)]) == 38.5
    assert bench_quality.tail_train_loss([{"step": 0, "val_loss": 1.0}]) is None
    # --report-only: the table again from the saved results (a subset, in the order given), no training
    (tmp_path / "quality_t.json").unlink()
    assert bench_quality.main(["--report-only", "--runs", str(tmp_path / "runs"), "--recipes", "srste,dense",
                               "--out", str(tmp_path), "--tag", "r", "--history-out", str(tmp_path / "h.json")]) == 0
    rep = json.loads((tmp_path / "quality_r.json").read_text())
    assert list(rep["runs"]) == ["srste", "dense"] and rep["runs"]["srste"] == runs["srste"]
    # --history-out: the full per-step history of each run, outside the results
    hist = json.loads((tmp_path / "h.json").read_text())["runs"]
    assert list(hist) == ["srste", "dense"] and hist["srste"][0]["val_loss"] == first["srste"]
    assert [h for h in hist["srste"] if "loss" in h] == [h for h in full["srste"] if "loss" in h]
    assert "| srste | `srste` |" in (tmp_path / "quality_r.md").read_text()
    assert bench_quality.main(["--report-only", "--runs", str(tmp_path / "runs"), "--recipes", "fast",
                               "--out", str(tmp_path)]) == 2  # no such result
    assert bench_quality.main(["--report-only", "--out", str(tmp_path)]) == 2  # no --runs
    # a process of another setup (here: the seed) is refused before it trains anything
    assert bench_quality.main([*common, "--recipes", "dense", "--seed", "1"]) == 2
    assert not (tmp_path / "runs" / "dense" / "result.json").read_text().count('"seed": 1,')
    assert bench_quality.spike([{"step": i, "loss": 2.0} for i in range(12)] + [{"step": 12, "loss": 3.5}]) == (1.75, 12)
    assert bench_quality.main(["--recipes", "dense,fast", "--out", str(tmp_path)]) == 2
    assert bench_quality.main(["--recipes", "dense,dense", "--out", str(tmp_path)]) == 2


def test_bench_fp8_gemm_smoke(tmp_path):
    """The fp8 GEMM benchmark's CPU smoke mode: every variant that runs without the kernels, ratios
    against bf16 dense in one run, JSON and markdown written."""
    import bench_fp8_gemm

    assert bench_fp8_gemm.main(["--smoke", "--out", str(tmp_path), "--name", "f"]) == 0
    res = json.loads((tmp_path / "f.json").read_text())
    (rec,) = res["records"]
    assert (rec["T"], rec["I"], rec["O"]) == (64, 64, 32)
    assert {"bf16 dense", "bf16 dense (control)", "fp8 dense e4m3 dot", "fp8 dense scaled"} <= set(rec["gemm"])
    assert set(rec["layer"]) >= {"bf16 dense", "fp8 dense", "fp8 dense flax", "bf16 2:4", "fp8 2:4"}
    assert rec["gemm"]["bf16 dense"]["vs_bf16_dense"] == 1.0
    assert all(e["seconds"] > 0 and len(e["samples"]) == 2 for s in ("gemm", "layer") for e in rec[s].values())
    md = (tmp_path / "f.md").read_text()
    assert "| 64, 64, 32 | 1.00x" in md and "fp8 dense flax" in md
    assert bench_fp8_gemm.main(["--shapes", "64,62,32", "--out", str(tmp_path)]) == 2
    assert bench_fp8_gemm.main(["--shapes", "64,x", "--out", str(tmp_path)]) == 2


def test_bench_train_gpt_fp8_labels():
    exp = bench_train_gpt.experiment("tiny", "srste+fp8", 4, 32, 10, [])
    assert exp.cfg.fp8 and exp.cfg.method == "srste" and exp.hp["fp8"]
    exp = bench_train_gpt.experiment("tiny", "dense+fp8/per-call", 4, 32, 10, [])
    assert exp.cfg.fp8 and exp.cfg.method == "dense" and exp.hp["prepare_weights"] == "off"
    assert not bench_train_gpt.experiment("tiny", "srste@dense", 4, 32, 10, []).cfg.fp8


def test_bench_train_gpt_prepared_labels(tmp_path, capsys):
    """RECIPE[@BACKEND][+fp8]/prepared runs the example's --prepare-weights always (weights prepared once
    per step at --grad-accum 1 too); fp8 and dense layers prepare nothing, so there it changes nothing;
    /prepared and /per-call exclude each other."""
    prepares = gpt_experiment.prepares_weights
    exp = bench_train_gpt.experiment("tiny", "srste/prepared", 4, 32, 10, [])
    assert (exp.hp["recipe"], exp.hp["prepare_weights"], exp.hp["grad_accum"]) == ("srste", "always", 1)
    assert prepares(exp) and not prepares(bench_train_gpt.experiment("tiny", "srste", 4, 32, 10, []))
    exp = bench_train_gpt.experiment("tiny", "srste@cutlass/prepared", 4, 32, 10, [])
    assert (exp.hp["sparse_backend"], exp.hp["prepare_weights"], exp.cfg.fp8) == ("cutlass", "always", False)
    exp = bench_train_gpt.experiment("tiny", "srste+fp8/prepared", 4, 32, 10, [])
    assert exp.cfg.fp8 and exp.hp["prepare_weights"] == "always" and not prepares(exp)
    assert not prepares(bench_train_gpt.experiment("tiny", "dense/prepared", 4, 32, 10, []))
    assert bench_train_gpt.split_label("srste@dense+fp8/prepared") == ("srste", "dense", True, "always", "current",
                                                                       "sparse24", "packed")
    assert bench_train_gpt.split_label("srste+fp8-delayed") == ("srste", None, True, None, "delayed", "sparse24",
                                                                 "packed")
    # /dense-gather (last): FSDP weights gathered with their masks by XLA, combinable with the others
    assert bench_train_gpt.split_label("srste+fp8/per-call/dense-gather") == ("srste", None, True, "off", "current",
                                                                               "sparse24", "dense")
    assert bench_train_gpt.split_label("srste/dense-gather").weight_gather == "dense"
    exp = bench_train_gpt.experiment("tiny", "dense+fp8-delayed", 4, 32, 10, [])
    assert exp.cfg.fp8 and exp.cfg.fp8_scaling == "delayed" and exp.hp["fp8_scaling"] == "delayed"
    assert exp.cfg.fp8_dense == "sparse24"
    exp = bench_train_gpt.experiment("tiny", "dense+fp8-flax", 4, 32, 10, [])
    assert (exp.cfg.fp8, exp.cfg.fp8_scaling, exp.cfg.fp8_dense) == (True, "delayed", "flax")
    with pytest.raises(ValueError, match="for the dense recipe only"):
        bench_train_gpt.split_label("srste+fp8-flax")
    for label in ("srste/prepared/per-call", "srste/per-call/prepared"):
        with pytest.raises(ValueError, match="/per-call and /prepared exclude each other"):
            bench_train_gpt.split_label(label)
    assert bench_train_gpt.main(["--size", "tiny", "--recipes", "dense,srste/prepared/per-call",
                                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'srste/prepared/per-call': /per-call and /prepared exclude each other" in err and "'dense'" not in err
    assert bench_train_gpt.main(["--size", "tiny", "--recipes", "srste/prepared+fp8", "--out", str(tmp_path)]) == 2
    assert "unknown recipe 'srste/prepared'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything ran


def test_probe_loop_times_every_loop_style(capsys):
    """scripts/probe_loop.py: one row per recipe, a column pair per loop style, dense's ratios 1;
    a first recipe other than dense is refused (it is the ratios' reference)."""
    import probe_loop

    assert probe_loop.main(["--size", "tiny", "--recipes", "dense,srste", "--n-layer", "1", "--rounds", "1",
                            "--iters", "1", "--warmup", "1"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    assert rows[0].startswith("| recipe |") and all(f"{lp} ms" in rows[0] for lp in probe_loop.LOOPS)
    dense, srste = ([c.strip() for c in r.strip("|").split("|")] for r in rows[1:3])
    assert dense[0] == "dense" and srste[0] == "srste" and len(srste) == 1 + 2 * len(probe_loop.LOOPS)
    assert dense[2::2] == ["1.000x"] * len(probe_loop.LOOPS)
    assert all(float(c) > 0 for c in srste[1::2])  # ms per step of each loop
    with pytest.raises(SystemExit):
        probe_loop.main(["--size", "tiny", "--recipes", "srste,dense"])


def test_probe_fp8_step_shapes_and_shape_flag():
    """scripts/probe_fp8.py --step SIZE: the forward, input-gradient and weight-gradient GEMMs of every
    linear layer (qkv, proj, gated fc, down) in forward form (T, I, O); --shapes parses or refuses."""
    import argparse

    import probe_fp8

    shapes = probe_fp8.step_shapes("llama-7b")
    for i, o in ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096)):
        assert {(16384, i, o), (16384, o, i), (i, 16384, o)} <= set(shapes), (i, o)
    assert len(shapes) == len(set(shapes)) == 11  # (16384, 4096, 4096)'s forward and input gradient coincide
    assert (16384, 768, 3072) in probe_fp8.step_shapes("gpt2")  # ungated FFN: fc is d x 4d
    assert probe_fp8.parse_shapes("1,2,3; 4,5,6") == [(1, 2, 3), (4, 5, 6)]
    for bad in ("1,2", "a,b,c", "", "0,1,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            probe_fp8.parse_shapes(bad)
    with pytest.raises(SystemExit, match="unknown size"):
        probe_fp8.step_shapes("gpt5")


def _scaling_result(path, n, dense, srste):
    rows = [{"variant": v, "tokens_per_s": t, "vs_dense": t / dense, "model_tflops_per_gpu": 400.0}
            for v, t in (("dense", dense), ("srste", srste), ("dense (control)", dense))]
    t = {"size": "llama-1b", "n_layer": 16, "tokens_per_step": 8192 * n, "n_devices": n, "vocab_size": 32000,
         "mesh": None if n == 1 else f"fsdp={n}", "rows": rows}
    path.write_text(json.dumps({"device": "gpu: H", "command": f"bench --batch-size {4 * n} --recipes dense,srste",
                                "throughput": [t]}))
    return path


def test_weak_scaling_table(tmp_path):
    """Efficiency per variant relative to its own one-GPU rate; mismatched or incomplete inputs are refused."""
    import weak_scaling

    files = [_scaling_result(tmp_path / f"r{n}.json", n, d, s)
             for n, d, s in ((1, 100.0, 110.0), (2, 190.0, 200.0), (4, 380.0, 396.0))]
    assert weak_scaling.main([*map(str, files), "--out", str(tmp_path), "--tag", "t"]) == 0
    res = json.loads((tmp_path / "weak_scaling_t.json").read_text())
    four = res["rows"][2]["variants"]
    assert four["dense"]["efficiency"] == pytest.approx(0.95) and four["srste"]["efficiency"] == pytest.approx(0.9)
    assert "dense (control)" not in four and res["rows"][2]["control_vs_dense"] == 1.0
    md = (tmp_path / "weak_scaling_t.md").read_text()
    mfu = 100 * 400.0 / weak_scaling.PEAK_TFLOPS
    assert f"| 4 | fsdp=4 | 32,768 | 380 | 95.0% | 396 | 90.0% | 1.042x | 1.000x | {mfu:.1f}% |" in md
    assert weak_scaling.main([str(files[1]), str(files[2]), "--out", str(tmp_path), "--tag", "u"]) == 2  # no 1 GPU
    other = _scaling_result(tmp_path / "o.json", 2, 1.0, 1.0)
    other.write_text(other.read_text().replace('"n_layer": 16', '"n_layer": 8'))
    assert weak_scaling.main([str(files[0]), str(other), "--out", str(tmp_path), "--tag", "v"]) == 2
    # other flags (here --remat) across the counts: refused; a count whose timing failed: left out
    other = _scaling_result(tmp_path / "o2.json", 2, 1.0, 1.0)
    other.write_text(other.read_text().replace("--recipes", "--remat dots --recipes"))
    assert weak_scaling.main([str(files[0]), str(other), "--out", str(tmp_path), "--tag", "w"]) == 2
    failed = tmp_path / "f.json"
    failed.write_text(json.dumps({"device": "gpu: H", "command": "c", "throughput": [], "failed": [{"error": "OOM"}]}))
    assert weak_scaling.main([str(files[0]), str(failed), str(files[2]), "--out", str(tmp_path), "--tag", "x"]) == 0
    assert [r["n_devices"] for r in json.loads((tmp_path / "weak_scaling_x.json").read_text())["rows"]] == [1, 4]


def test_bench_train_gpt_keeps_the_compile_times_when_the_timing_fails(tmp_path, monkeypatch):
    """An error while timing (out of memory with every state resident) still writes the compile times, exit 1."""
    import bench_train_gpt

    def oom(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 30.72GiB")

    monkeypatch.setattr(bench_train_gpt, "throughput", oom)
    argv = ["--size", "tiny", "--quick", "--recipes", "dense,srste", "--quality-steps", "0", *SHAPE,
            "--out", str(tmp_path), "--tag", "f"]
    assert bench_train_gpt.main(argv) == 1
    res = json.loads((tmp_path / "train_gpt_f.json").read_text())
    (f,) = res["failed"]
    assert f["stage"] == "timing" and f["error"].startswith("RESOURCE_EXHAUSTED") and res["throughput"] == []
    assert set(f["compiled"]) == {"dense", "srste"} and all(c["compile_s"] > 0 for c in f["compiled"].values())
    md = (tmp_path / "train_gpt_f.md").read_text()
    assert "## Not timed: tiny" in md and f"| srste | {f['compiled']['srste']['compile_s']:.1f} |" in md


def test_probe_remat_hlo_flags_a_gemm_computed_twice_under_dots():
    import collections

    import probe_remat_hlo as probe

    none = collections.Counter({"jax_sparse24_cutlass_spmm": 8, "jax_sparse24_cutlass_spmm_kn": 4,
                                "jax_sparse24_masked_compress": 8})
    dots_ok = collections.Counter({**none, "__cudnn$fmhaSoftmax": 1})  # attention recomputed: not a 2:4 GEMM
    dots_bad = collections.Counter({**none, "jax_sparse24_cutlass_spmm": 11})  # 3 forward GEMMs again
    assert probe.gemm_calls(none) == 12
    assert probe.recomputed({("one device", "none"): none, ("one device", "dots"): dots_ok}) == []
    assert probe.recomputed({("fsdp=4", "none"): none, ("fsdp=4", "dots"): dots_bad,
                             ("fsdp=4", "full"): dots_bad}) == [
        "mesh fsdp=4: remat=dots runs 15 2:4 GEMM calls, remat=none 12"]


def test_xla_preset_goes_to_xla_flags_before_jax_starts():
    """--xla-preset appends its flags to XLA_FLAGS in a fresh process; once JAX's backends are up it refuses
    (the flags would be ignored), and an unknown preset names the choices."""
    import subprocess
    code = ("import os, sys; sys.path.insert(0, 'benchmarks'); os.environ['XLA_FLAGS'] = '--xla_dump_to=/tmp/x'; "
            "import bench_train_gpt as b; b.apply_xla_preset('fsdp'); import jax; jax.devices(); "
            "print(os.environ['XLA_FLAGS'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "--xla_dump_to=/tmp/x"
    assert set(bench_train_gpt.XLA_PRESETS["fsdp"]) <= set(out.split())
    jax.devices()  # this process's backends are up
    with pytest.raises(RuntimeError, match="already initialized"):
        bench_train_gpt.apply_xla_preset("fsdp")
    bench_train_gpt.apply_xla_preset("none")  # nothing to add: fine at any time
    with pytest.raises(SystemExit, match="one of"):
        bench_train_gpt.apply_xla_preset("fast")
