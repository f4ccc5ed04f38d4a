"""backend="auto": the table made from benchmark results, and the choices read from it (CPU-only:
the table and the choice logic, with the GPU-side availability checks stubbed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from jax_sparse24._src import autotune, backends, ffi

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path):
    spmm = {"meta": {"device": "test", "date": "now", "configs": ["a", "b"]}, "records": [
        # GEMM 1.25x alone; with the fused compressor 0.1 / (0.08 + 0.01) = 1.11x
        dict(O=3072, T=8192, I=768, dtype="bfloat16", config_ms={"a": 0.09, "b": 0.08}, baseline_ms=0.1,
             fused_compress_ms=0.01, compress_ms=0.05),
        # measured again by the layer run below, whose fused-compressor measurement replaces this one
        dict(O=1024, T=8192, I=4096, dtype="bfloat16", config_ms={"a": 0.08, "b": 0.09}, baseline_ms=0.1,
             fused_compress_ms=0.005),
        # cuSPARSELt timed beside CUTLASS by bench_spmm (no layer run measures this shape)
        dict(O=8192, T=8192, I=8192, dtype="bfloat16", config_ms={"a": 1.2, "b": 1.1}, baseline_ms=1.5,
             fused_compress_ms=0.05, cusparselt_ms=0.9, cusparselt_speedup=1.5 / 0.9,
             cusparselt_speedup_with_compress=1.5 / 0.96),
    ]}
    ms = {"fwd dense x@w": 0.2, "fwd dense x@(w*m)": 0.21, "fwd cutlass + fused compress": 0.25,
          "dx dense g@w.T": 0.2, "dx cutlass + fused compress": 0.1,
          "dw dense x.T@g": 0.2, "dw mvue24 + dense": 0.3, "dw cutlass + fused mvue compress": 0.25,
          "dw cutlass kn gemm": 0.1, "dw cutlass kn gemm [k1]": 0.1,
          "dx cusparselt + fused compress": 0.08, "dx cusparselt gemm": 0.05, "dw cusparselt + fused mvue compress": 0.16}
    layer = {"meta": {"dtype": "bfloat16"}, "records": [
        dict(section="gemm", d=1024, layer="down", I=4096, O=1024, T=8192, ms=ms, kn_best_config="k1"),
        # the up layer's forward (O, T, I) = (4096, 8192, 1024) is the down layer's input-gradient shape
        dict(section="gemm", d=1024, layer="up", I=1024, O=4096, T=8192,
             ms={"fwd dense x@w": 0.2, "fwd cutlass + fused compress": 0.16}, kn_best_config=None)]}
    (tmp_path / "spmm.json").write_text(json.dumps(spmm))
    # two layer runs (e.g. two widths), read as one
    for j, rec in enumerate(layer["records"]):
        (tmp_path / f"layer{j}.json").write_text(json.dumps({"meta": layer["meta"], "records": [rec]}))
    out = tmp_path / "table.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_autotune_table.py"), str(tmp_path / "spmm.json"),
                    "--layer", str(tmp_path / "layer0.json"), str(tmp_path / "layer1.json"), "--out", str(out)],
                   check=True, capture_output=True)
    return json.loads(out.read_text())


def test_table_counts_the_fused_compressor_and_the_exact_weight_grad(tmp_path):
    t = _write(tmp_path)
    e = {(x["m"], x["n"], x["k"]): x for x in t["entries"]}
    assert e[(3072, 8192, 768)]["config"] == "b"
    assert e[(3072, 8192, 768)]["speedup_with_compress"] == pytest.approx(0.1 / 0.09)
    # forward of the layer (O, T, I) = (1024, 8192, 4096): 0.2 / 0.25 replaces spmm.json's 0.1 / 0.085,
    # the spmm.json configuration is kept
    assert e[(1024, 8192, 4096)]["speedup_with_compress"] == pytest.approx(0.8)
    assert e[(1024, 8192, 4096)]["config"] == "a" and e[(1024, 8192, 4096)]["compress_source"].startswith("layer")
    # (4096, 8192, 1024), a shape spmm.json lacks: the down layer's input gradient (0.2 / 0.1) and the
    # up layer's forward (0.2 / 0.16) -> the smaller
    assert e[(4096, 8192, 1024)]["speedup_with_compress"] == pytest.approx(0.2 / 0.16)
    assert e[(4096, 8192, 1024)]["config_id"] == -1
    (kn,) = t["entries_kn"]
    # against the exact dense xᵀ·∇y (0.2 ms), not the MVUE + dense path (0.3 ms)
    assert (kn["m"], kn["n"], kn["k"], kn["config"]) == (1024, 4096, 8192, "k1")
    assert kn["speedup_with_compress"] == pytest.approx(0.2 / 0.25)
    # cuSPARSELt beside CUTLASS where the layer run measured it: the down layer's input gradient
    # (4096, 8192, 1024) and weight gradient; nothing for shapes it did not measure
    assert e[(4096, 8192, 1024)]["cusparselt_speedup_with_compress"] == pytest.approx(0.2 / 0.08)
    assert e[(4096, 8192, 1024)]["cusparselt_gemm_speedup"] == pytest.approx(0.2 / 0.05)  # for prepared weights
    assert "cusparselt_speedup_with_compress" not in e[(3072, 8192, 768)]
    assert kn["cusparselt_speedup_with_compress"] == pytest.approx(0.2 / 0.16)
    # bench_spmm's own cuSPARSELt timings where no layer run measured the shape
    big = e[(8192, 8192, 8192)]
    assert big["cusparselt_gemm_speedup"] == pytest.approx(1.5 / 0.9)
    assert big["cusparselt_speedup_with_compress"] == pytest.approx(1.5 / 0.96)
    assert big["speedup_with_compress"] == pytest.approx(1.5 / 1.15)


def test_table_ignores_the_tile_order_sweep(tmp_path):
    """bench_spmm's tile-order results stay out of the table (no order won consistently across runs)."""
    spmm = {"meta": {"device": "test", "date": "now", "configs": ["a", "b"]}, "records": [
        dict(T=8192, I=768, O=3072, dtype="bfloat16", config_ms={"a": 0.09, "b": 0.08}, baseline_ms=0.1,
             fused_compress_ms=0.01, best_tile_order="n/4", tile_order_gain=1.05,
             tile_order_ms={"heuristic/1": 0.08, "n/4": 0.08 / 1.05})]}
    (tmp_path / "spmm.json").write_text(json.dumps(spmm))
    out = tmp_path / "table.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_autotune_table.py"), str(tmp_path / "spmm.json"),
                    "--out", str(out)], check=True, capture_output=True)
    (e,) = json.loads(out.read_text())["entries"]
    assert e["config"] == "b" and e["gemm_speedup"] == pytest.approx(0.1 / 0.08)
    assert not {"raster", "swizzle"} & set(e)


@pytest.fixture
def gpu_stubs(monkeypatch):
    """Pretend kernels are available; the table comes from each test."""
    from jax_sparse24._src import cuda_spmm_ops

    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    monkeypatch.setattr(ffi, "extension", lambda: object())
    monkeypatch.setattr(backends.CUTLASS, "can_run", lambda *a, **kw: backends.OK)
    monkeypatch.setattr(autotune, "_config_id", lambda name: -1)
    monkeypatch.setattr(cuda_spmm_ops, "cutlass_configs_kn", lambda: ["k1"])
    monkeypatch.setattr(cuda_spmm_ops, "cutlass_supports_kn", lambda *a: True)

    def use(entries, entries_kn=()):
        table = {"entries": list(entries), "entries_kn": list(entries_kn)}
        monkeypatch.setattr(autotune, "_table", lambda: table)

    return use


def _entry(m, n, k, speedup):
    return dict(m=m, n=n, k=k, dtype="bfloat16", config="k1", speedup_with_compress=speedup)


def test_auto_goes_sparse_only_above_the_noise_floor(gpu_stubs):
    gpu_stubs([_entry(4096, 8192, 1024, 1.10), _entry(1024, 8192, 4096, 1.02)])
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "cutlass"
    assert autotune.choose("auto", 4000, 9000, 1000, jnp.bfloat16) == "cutlass"  # nearest measured shape
    assert autotune.choose("auto", 1024, 8192, 4096, jnp.bfloat16) == "dense"  # 1.02 < MIN_GAIN
    assert autotune.MIN_GAIN > 1.0
    assert autotune.choose("cutlass", 1024, 8192, 4096, jnp.bfloat16) == "cutlass"  # forced
    assert autotune.choose("dense", 4096, 8192, 1024, jnp.bfloat16) == "dense"


def test_auto_weight_grad(gpu_stubs):
    gpu_stubs([], [_entry(1024, 4096, 8192, 1.2), _entry(4096, 1024, 8192, 0.8)])
    assert autotune.choose_weight_grad("auto", 1024, 4096, 8192, jnp.bfloat16) == "cutlass"
    assert autotune.choose_weight_grad("auto", 4096, 1024, 8192, jnp.bfloat16) == "dense"
    gpu_stubs([])
    assert autotune.choose_weight_grad("auto", 1024, 4096, 8192, jnp.bfloat16) == "dense"  # nothing measured


def test_auto_picks_cusparselt_where_measured_faster(gpu_stubs, monkeypatch):
    """cuSPARSELt (operand from our fused compressor) where the table measured it faster than CUTLASS
    and the noise floor, bfloat16 only, and only where its layout check passes."""
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    monkeypatch.setattr(lt, "cusparselt_supports", lambda *a: True)
    layout_ok = {"ok": True}
    monkeypatch.setattr(lt, "fused_compress_ok", lambda *a: layout_ok["ok"])
    fast, slow, dense = (dict(_entry(4096, 8192, 1024, 1.10), cusparselt_speedup_with_compress=1.30),
                         dict(_entry(1024, 8192, 4096, 1.10), cusparselt_speedup_with_compress=1.05),
                         dict(_entry(2048, 8192, 512, 0.90), cusparselt_speedup_with_compress=1.02))
    gpu_stubs([fast, slow, dense], [dict(_entry(1024, 4096, 8192, 1.05), cusparselt_speedup_with_compress=1.2),
                                    dict(_entry(4096, 1024, 8192, 1.2), cusparselt_speedup_with_compress=1.1)])
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "cusparselt"
    assert autotune.choose("auto", 1024, 8192, 4096, jnp.bfloat16) == "cutlass"  # CUTLASS measured faster
    assert autotune.choose("auto", 2048, 8192, 512, jnp.bfloat16) == "dense"  # both below the noise floor
    assert autotune.choose_weight_grad("auto", 1024, 4096, 8192, jnp.bfloat16) == "cusparselt"
    assert autotune.choose_weight_grad("auto", 4096, 1024, 8192, jnp.bfloat16) == "cutlass"
    layout_ok["ok"] = False  # e.g. another cuSPARSELt version: CUTLASS, never the library's slow compressor
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "cutlass"
    assert autotune.choose_weight_grad("auto", 1024, 4096, 8192, jnp.bfloat16) == "cutlass"
    layout_ok["ok"] = True
    f16 = [dict(fast, dtype="float16")]
    gpu_stubs(f16)
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.float16) == "cutlass"  # float16: CUTLASS


def test_auto_prepared_weights_weigh_both_backends_amortized(gpu_stubs, monkeypatch):
    """With reuse (a prepared weight), auto compares CUTLASS and cuSPARSELt by their amortized
    speedups (GEMM-only speedup plus the compression over reuse calls), bfloat16 cuSPARSELt only."""
    from jax_sparse24._src import cuda_cusparselt_ops as lt

    monkeypatch.setattr(lt, "cusparselt_supports", lambda *a: True)
    layout_ok = {"ok": True}
    monkeypatch.setattr(lt, "fused_compress_ok", lambda *a: layout_ok["ok"])
    # per call cuSPARSELt loses (0.95 < 1.0), amortized over 8 calls it wins (≈1.35 vs ≈1.12)
    lt_amortized = dict(_entry(4096, 8192, 1024, 1.0), gemm_speedup=1.15, cusparselt_speedup_with_compress=0.95,
                        cusparselt_gemm_speedup=1.45)
    cutlass_gemm = dict(_entry(1024, 8192, 4096, 1.0), gemm_speedup=1.40, cusparselt_speedup_with_compress=1.05,
                        cusparselt_gemm_speedup=1.20)
    no_lt = dict(_entry(2048, 8192, 512, 0.9), gemm_speedup=1.3)
    gpu_stubs([lt_amortized, cutlass_gemm, no_lt])
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "dense"  # per call: both ≤ 1.0
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16, reuse=8) == "cusparselt"
    share = autotune.PREPARE_COST_SHARE["per_layer"]
    assert autotune.amortized_speedup(4096, 8192, 1024, jnp.bfloat16, 8, backend="cusparselt") == pytest.approx(
        1 / (1 / 1.45 + share * (1 / 0.95 - 1 / 1.45) / 8))
    assert autotune.choose("auto", 1024, 8192, 4096, jnp.bfloat16, reuse=8) == "cutlass"  # CUTLASS's GEMM faster
    assert autotune.choose("auto", 1024, 8192, 4096, jnp.bfloat16) == "cusparselt"  # per call cuSPARSELt 1.05
    assert autotune.choose("auto", 2048, 8192, 512, jnp.bfloat16, reuse=8) == "cutlass"  # not measured: CUTLASS
    assert autotune.amortized_speedup(2048, 8192, 512, jnp.bfloat16, 8, backend="cusparselt") is None
    # far from the measured tokens (2048 vs 8192): cuSPARSELt's measurement is not carried over
    assert autotune.choose("auto", 4096, 2048, 1024, jnp.bfloat16, reuse=8) == "cutlass"
    assert autotune.choose("auto", 1024, 2048, 4096, jnp.bfloat16) == "dense"  # CUTLASS per call 1.0
    # within CUSPARSELT_RADIUS (the compression's share scaled to 10240 tokens: cuSPARSELt 1.08, CUTLASS 1.06)
    assert autotune.choose("auto", 1024, 10240, 4096, jnp.bfloat16) == "cusparselt"
    layout_ok["ok"] = False  # no fused path for cuSPARSELt: CUTLASS
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16, reuse=8) == "cutlass"
    layout_ok["ok"] = True
    gpu_stubs([dict(lt_amortized, dtype="float16")])
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.float16, reuse=8) == "cutlass"  # float16: CUTLASS


def test_linear_plan_follows_the_table(gpu_stubs):
    """linear_plan reports the choices sparse24_linear makes (same functions, same table)."""
    import jax_sparse24 as s24

    gpu_stubs([_entry(4096, 8192, 1024, 1.10), _entry(1024, 8192, 4096, 1.02)],
              [_entry(4096, 1024, 8192, 1.2)])
    # up projection 1024 -> 4096 at 8192 tokens: forward (4096, 8192, 1024) sparse, input gradient
    # (1024, 8192, 4096) below the noise floor, weight gradient measured faster with MVUE
    assert s24.linear_plan(8192, 1024, 4096) == {
        "forward": "cutlass", "input_grad": "dense", "weight_grad": "cutlass (MVUE)"}
    assert s24.linear_plan(8192, 1024, 4096, mvue=False)["weight_grad"] == "dense (exact)"
    assert s24.linear_plan(8192, 1024, 4096, transposable=False)["input_grad"] == "dense"
    assert s24.linear_plan(8192, 1024, 4096, backend="cutlass")["input_grad"] == "cutlass"
    gpu_stubs([], [_entry(4096, 1024, 8192, 0.8)])
    assert s24.linear_plan(8192, 1024, 4096)["weight_grad"] == "dense (exact)"  # auto: exact, no MVUE
    assert s24.linear_plan(8192, 1024, 4096, backend="dense")["weight_grad"] == "dense (MVUE)"


def test_linear_plan_on_cpu_and_bad_input():
    import jax_sparse24 as s24

    if not ffi.cuda_kernels_available():
        assert s24.linear_plan(8192, 768, 3072) == {
            "forward": "dense", "input_grad": "dense", "weight_grad": "dense (exact)"}
    assert s24.linear_plan(64, 8, 8, backend="reference") == {
        "forward": "reference", "input_grad": "reference", "weight_grad": "reference (MVUE)"}
    with pytest.raises(ValueError, match="backend must be one of"):
        s24.linear_plan(64, 8, 8, backend="fast")
    with pytest.raises(ValueError, match="multiple of 4"):
        s24.linear_plan(64, 6, 8)
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        s24.linear_plan(0, 8, 8)


def test_tile_order_arguments_are_checked_before_any_kernel():
    """cutlass_spmm's raster/swizzle validation (pure Python, runs without the extension)."""
    from jax_sparse24._src import cuda_spmm_ops as cs

    assert cs._check_tile_order("op", "heuristic", 1) == (0, 1)
    assert cs._check_tile_order("op", "n", 8) == (2, 8)
    with pytest.raises(ValueError, match="raster must be one of"):
        cs._check_tile_order("op", "k", 1)
    for bad in (3, 16, True, 2.0, "2"):
        with pytest.raises(ValueError, match="swizzle must be one of"):
            cs._check_tile_order("op", "m", bad)


def test_prepared_weights_amortize_the_compression(gpu_stubs):
    """A prepared weight pays a share of the per-call compression (PREPARE_COST_SHARE: one pass per
    layer, or batched over all layers) once per `reuse` calls, and that cost does not grow with the
    tokens of the call while the GEMM does: auto weighs it accordingly."""
    import jax_sparse24 as s24

    # GEMM alone 1.25x, 0.85x with the compression on every call (compression = 0.376 of dense)
    e = dict(_entry(4096, 8192, 1024, 0.85), gemm_speedup=1.25)
    gpu_stubs([e, dict(_entry(1024, 8192, 4096, 1.02), gemm_speedup=1.02)])
    c = 1 / 0.85 - 1 / 1.25
    per_layer, batched = autotune.PREPARE_COST_SHARE["per_layer"], autotune.PREPARE_COST_SHARE["batched"]
    assert 0 < batched < per_layer <= 1
    want1 = 1 / (1 / 1.25 + per_layer * c)
    assert autotune.amortized_speedup(4096, 8192, 1024, jnp.bfloat16, 1) == pytest.approx(want1)
    want4 = 1 / (1 / 1.25 + per_layer * c / 4)
    assert autotune.amortized_speedup(4096, 8192, 1024, jnp.bfloat16, 4) == pytest.approx(want4)
    want_b = 1 / (1 / 1.25 + batched * c)
    assert autotune.amortized_speedup(4096, 8192, 1024, jnp.bfloat16, 1, batched=True) == pytest.approx(want_b)
    # twice the tokens of the measured shape: the GEMM doubles, the preparation does not, and the
    # same holds for the compression paid on every call (one cost model): prepared never costs more
    want_t = 1 / (1 / 1.25 + per_layer * c / 2)
    assert autotune.amortized_speedup(4096, 16384, 1024, jnp.bfloat16, 1) == pytest.approx(want_t)
    per_call_t = 1 / (1 / 1.25 + c / 2)  # 1.012 at 16384 tokens (0.85 at the table's 8192): still dense
    assert autotune.choose("auto", 4096, 16384, 1024, jnp.bfloat16) == "dense"
    assert autotune.choose("auto", 4096, 65536, 1024, jnp.bfloat16) == "cutlass"  # 1.18
    assert autotune._entry_amortized(e, 16384, None, "cutlass") == pytest.approx(per_call_t)
    for t in (256, 2048, 8192, 16384, 65536):  # at any token count
        assert autotune.amortized_speedup(4096, t, 1024, jnp.bfloat16, 1) >= autotune._entry_amortized(
            e, t, None, "cutlass") - 1e-12
    assert want1 < 1.03 < want_b  # one pass per layer: dense; batched: sparse
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "dense"
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16, reuse=1) == "dense"
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16, reuse=1, batched=True) == "cutlass"
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16, reuse=4) == "cutlass"
    assert autotune.choose("auto", 1024, 8192, 4096, jnp.bfloat16, reuse=64) == "dense"  # GEMM alone 1.02x
    assert s24.linear_plan(8192, 1024, 4096, reuse=4)["forward"] == "cutlass"
    assert s24.linear_plan(8192, 1024, 4096)["forward"] == "dense"
    assert s24.linear_plan(8192, 1024, 4096, reuse=1)["forward"] == "dense"
    assert s24.linear_plan(8192, 1024, 4096, reuse=1, batched=True)["forward"] == "cutlass"
    assert s24.linear_plan(8192, 1024, 4096, reuse=4, transposable=False)["input_grad"] == "dense"
    with pytest.raises(ValueError, match="batched=True plans a prepared weight"):
        s24.linear_plan(8192, 1024, 4096, batched=True)
    # an older table without the GEMM-only ratio: nothing to amortize
    gpu_stubs([_entry(4096, 8192, 1024, 0.9)])
    assert autotune.amortized_speedup(4096, 8192, 1024, jnp.bfloat16, 8) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="reuse must be a positive integer"):
        s24.linear_plan(8192, 1024, 4096, reuse=0)


def test_table_records_the_gemm_only_speedup_of_layer_shapes(tmp_path):
    """Shapes only the layer run measured get their GEMM-only ratio too (prepared weights need it)."""
    t = _write(tmp_path)
    e = {(x["m"], x["n"], x["k"]): x for x in t["entries"]}
    assert e[(4096, 8192, 1024)]["gemm_speedup"] is None  # the test's layer run has no GEMM-only timing
    ms = {"fwd dense x@w": 0.2, "fwd cutlass + fused compress": 0.25, "fwd cutlass gemm": 0.16,
          "dx dense g@w.T": 0.2, "dx cutlass + fused compress": 0.22, "dx cutlass gemm": 0.1}
    layer = {"meta": {"dtype": "bfloat16"}, "records": [
        dict(section="gemm", d=2048, layer="up", I=2048, O=8192, T=8192, ms=ms, kn_best_config=None)]}
    (tmp_path / "wide.json").write_text(json.dumps(layer))
    out = tmp_path / "t2.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_autotune_table.py"), str(tmp_path / "spmm.json"),
                    "--layer", str(tmp_path / "wide.json"), "--out", str(out)], check=True, capture_output=True)
    e = {(x["m"], x["n"], x["k"]): x for x in json.loads(out.read_text())["entries"]}
    assert e[(8192, 8192, 2048)]["gemm_speedup"] == pytest.approx(0.2 / 0.16)
    assert e[(8192, 8192, 2048)]["speedup_with_compress"] == pytest.approx(0.2 / 0.25)
    assert e[(2048, 8192, 8192)]["gemm_speedup"] == pytest.approx(0.2 / 0.1)


def test_table_keeps_the_default_weight_grad_config_when_it_is_fastest(tmp_path):
    """The "kn" GEMM with the build's heuristic configuration (``dw cutlass kn gemm``) beat every named
    configuration of the sweep: the entry keeps config None (run the heuristic, id -1) and its time."""
    spmm = {"meta": {"device": "test", "date": "now", "configs": ["a"]}, "records": []}
    ms = {"fwd dense x@w": 0.2, "dx dense g@w.T": 0.2, "dw dense x.T@g": 1.281,
          "dw cutlass + fused mvue compress": 1.215, "dw cutlass kn gemm": 0.808,
          "dw cutlass kn gemm [k1]": 0.855, "dw cutlass kn gemm [k2]": 0.949}
    rec = dict(section="gemm", d=2048, layer="up", I=2048, O=11264, T=16384, ms=ms, kn_best_config="k1")
    (tmp_path / "spmm.json").write_text(json.dumps(spmm))
    (tmp_path / "layer.json").write_text(json.dumps({"meta": {"dtype": "bfloat16"}, "records": [rec]}))
    out = tmp_path / "table.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_autotune_table.py"), str(tmp_path / "spmm.json"),
                    "--layer", str(tmp_path / "layer.json"), "--out", str(out)], check=True, capture_output=True)
    (kn,) = json.loads(out.read_text())["entries_kn"]
    assert kn["config"] is None
    assert kn["speedup_with_compress"] == pytest.approx(1.281 / 1.215)  # not 1.281 / (1.215 - 0.808 + 0.855)
