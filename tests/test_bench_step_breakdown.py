"""benchmarks/bench_step_breakdown.py on the CPU: kernel classification, HLO op_name parsing, the
trace reader, the FLOP / ceiling / gap arithmetic, the report, and a smoke run of main()."""

from __future__ import annotations

import doctest
import gzip
import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_step_breakdown as sb  # noqa: E402
import bench_train_gpt as btg  # noqa: E402
from gpt_experiment import init_state  # noqa: E402

# Kernel names as the profiler reports them: demangled where it can (our kernels), mangled where it
# cannot (CUTLASS's); the strings are those of the built extension (c++filt of its symbols).
_NS = "jax_sparse24::compress::(anonymous namespace)::"
_TILE = "void " + _NS + "CompressTileKernel<__nv_bfloat16, (" + _NS + "Op){op}, false, true>(" + _NS + "TileParams)"
_TILE_MANGLED = ("_ZN12jax_sparse248compress52_GLOBAL__N__10a37c97_19_compress_kernels_cu_0a72779318CompressTileKernelI"
                 "13__nv_bfloat16LNS1_2OpE{op}ELb0ELb1EEEvNS1_10TileParamsE")
_GROUP = ("void jax_sparse24::mask_kernels::{kind}GroupKernel<__nv_bfloat16, (jax_sparse24::mask_kernels::GroupOp){op}, 4>"
          "(__nv_bfloat16 const*, __nv_bfloat16*, unsigned char*, long, long, jax_sparse24::mask_kernels::RngArgs)")
_GROUP_MANGLED = ("_ZN12jax_sparse2412mask_kernels18StridedGroupKernelI13__nv_bfloat16LNS0_7GroupOpE{op}ELi1EEEvPKT_PS4_"
                  "PhlllNS0_7RngArgsE")
_CUTLASS_SPARSE = ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10collective13Collective"
                   "MmaINS1_40MainloopSm90TmaGmmaWarpSpecializedSparseILi2ENS5_IJNS4_1CILi1EEENSA_ILi2EEESB_EEENS1_35KernelTma")
_CUTLASS_COMPRESSOR = ("_ZN7cutlass13device_kernelINS_9transform6kernel30SM90StructuredSparseCompressorIN4cute5tupleIJiiiiEEENS_10"
                       "bfloat16_tENS_6layout8RowMajorENS_20Sm90GemmSparseConfigINS4_11sparse_elemILi2ES7_EELNS4_4SM904GMMA5")

KERNELS = [
    (_TILE.format(op=2), "", sb.MVUE),
    (_TILE_MANGLED.format(op=2), "", sb.MVUE),
    (_TILE.format(op=1), "", sb.COMPRESS),  # mask + compress of a weight
    (_TILE_MANGLED.format(op=1), "", sb.COMPRESS),
    (_TILE.format(op=0), "", sb.COMPRESS),  # prune
    (_TILE.format(op=3), "", sb.COMPRESS),  # soft threshold
    ("void " + _NS + "CompressManyKernel<__nv_bfloat16, true, true>(" + _NS + "ManyParams)", "", sb.COMPRESS),
    ("void jax_sparse24::fp8::(anonymous namespace)::Fp8MaskCompressKernel<__nv_bfloat16, true>(__nv_bfloat16 const*, "
     "bool const*, float const*, long, long, unsigned char*, unsigned char*, long, long, long)", "", sb.COMPRESS),
    ("jax_sparse24::(anonymous namespace)::FixMetadataKernel(uint4*, unsigned long)", "", sb.COMPRESS),
    (_CUTLASS_COMPRESSOR, "", sb.COMPRESS),
    (_GROUP.format(kind="Contiguous", op=2), "", sb.MVUE),
    (_GROUP_MANGLED.format(op=2), "", sb.MVUE),
    (_GROUP.format(kind="Strided", op=0), "", sb.MASKS),
    (_GROUP_MANGLED.format(op=1), "", sb.MASKS),
    ("void jax_sparse24::mask_kernels::TransposableMaskKernel<__nv_bfloat16, 2, true>(__nv_bfloat16 const*, "
     "unsigned char*, long, long, long)", "", sb.MASKS),
    (_CUTLASS_SPARSE, "", sb.GEMM_SPARSE),
    ("sm90_xmma_sparse_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize2x1x1_warpgroups", "", sb.GEMM_SPARSE),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "", sb.GEMM_DENSE),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "", sb.GEMM_DENSE),
    ("gemm_fusion_dot_68", "jit(train_step)/transpose(jvp(GPT))/lm_head/dot_general", sb.GEMM_DENSE),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x", "", sb.ATTENTION),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*", "", sb.ATTENTION),
    # XLA's kernels: by the op_name of their HLO instruction
    ("gemm_fusion_dot_12", "jit(train_step)/jvp(GPT)/h_0/attn/attention/vmap(BTNH,BSNH->BNTS)/dot_general", sb.ATTENTION),
    ("input_reduce_fusion_3", "jit(train_step)/transpose(jvp(attention))/vmap()/reduce_sum", sb.ATTENTION),
    ("loop_multiply_fusion_3", "jit(train_step)/optimizer/mul", sb.OPTIMIZER),
    ("loop_add_fusion_4", "jit(train_step)/optimizer/cond/branch_1_fun/add", sb.OPTIMIZER),
    ("loop_add_fusion_5", "jit(train_step)/jvp(GPT)/ln_f/add", sb.OTHER),
    ("loop_add_fusion_6", "jit(train_step)/optimizer_state/add", sb.OTHER),  # not the scope
    ("loop_add_fusion_7", "", sb.OTHER),
    ("Memset 3", "", sb.OTHER),
]


@pytest.mark.parametrize("name,op_name,expected", KERNELS)
def test_category(name, op_name, expected):
    assert sb.category(name, op_name) == expected


def test_every_kernel_of_the_extension_is_ours():
    """Each ``__global__`` kernel in xla_ffi/ falls into one of our categories (a new kernel with a
    name the rules miss would be counted as another kind of work)."""
    names = set()
    for f in (ROOT / "xla_ffi").glob("*.cu*"):
        names |= set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\)?\s*)?(\w+)", f.read_text()))
    assert {"CompressTileKernel", "CompressManyKernel", "Fp8MaskCompressKernel", "Fp8Mvue24CompressKernel",
            "TransposableMaskKernel", "ContiguousGroupKernel", "StridedGroupKernel", "FixMetadataKernel"} <= names
    expected = {"CompressTileKernel": sb.COMPRESS, "CompressManyKernel": sb.COMPRESS,
                "Fp8MaskCompressKernel": sb.COMPRESS, "Fp8Mvue24CompressKernel": sb.MVUE,
                "Fp8QuantizeTransposeKernel": sb.MVUE,
                "FixMetadataKernel": sb.COMPRESS,
                "TransposableMaskKernel": sb.MASKS, "ContiguousGroupKernel": sb.MASKS, "StridedGroupKernel": sb.MASKS}
    for n in names:  # by the kernel's own name, without the namespace (which alone would match)
        assert sb.category(f"void {n}<float>(float const*)") == expected.get(n, sb.COMPRESS), n


def test_runtime_memsets_are_other_and_only_sparse_cutlass_kernels_are_sparse_gemms():
    assert sb.category("Memset 3", "jit(train_step)/attention/dot_product_attention") == sb.OTHER
    assert sb.category("memcpy32_post") == sb.OTHER
    assert sb.category("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10"
                       "collective13CollectiveMmaINS1_38MainloopSm90TmaGmmaWarpSpecializedSparse") == sb.GEMM_SPARSE
    assert sb.category("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x128x64_1x1x1") == sb.GEMM_DENSE


def test_module_doctests():
    assert doctest.testmod(sb, raise_on_error=False).failed == 0


_HLO = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation.3 (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  %exp.1 = f32[8]{0} exponential(%param_0), metadata={op_name="jit(step)/jvp(GPT)/exp"}
  ROOT %mul.1 = f32[8]{0} multiply(%exp.1, %param_0), metadata={op_name="jit(step)/optimizer/mul" stack_frame_id=3}
}

ENTRY %main.4 (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0), metadata={op_name="p"}
  %loop_exp_fusion = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_computation.3
  ROOT %cublas-gemm.2 = f32[8]{0} custom-call(%loop_exp_fusion), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(GPT)/lm_head/dot_general"}
}
"""


def test_hlo_op_names_synthetic():
    ops = sb.hlo_op_names(_HLO)
    assert ops["loop_exp_fusion"] == "jit(step)/optimizer/mul"  # no op_name: its computation's root's
    assert ops["cublas-gemm.2"] == ops["cublas_gemm_2"] == "jit(step)/jvp(GPT)/lm_head/dot_general"
    assert ops["exp.1"] == "jit(step)/jvp(GPT)/exp" and ops["exp_1"] == ops["exp.1"]
    assert ops["p"] == "p" and "HloModule" not in ops


def test_hlo_op_names_of_a_compiled_function():
    """The named scope reaches the metadata of the compiled program's fusions (CPU compiler)."""

    def step(w, x):
        loss = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
        g = jax.grad(loss)(w)
        with jax.named_scope("optimizer"):
            return w - 0.1 * jnp.sign(g) * jnp.sqrt(jnp.abs(w))

    exe = jax.jit(step).lower(jnp.ones((16, 16)), jnp.ones((8, 16))).compile()
    text, how = sb.compiled_text(exe)
    assert how == "compiled.as_text()"
    ops = sb.hlo_op_names(text)
    entry = text[text.index("ENTRY"):]
    fusions = re.findall(r"%([\w.\-]+) = \S+ fusion\(", entry)
    assert fusions
    cats = {f: sb.category(sb.kernel_key(f), ops[sb.kernel_key(f)]) for f in fusions}
    assert sb.OPTIMIZER in cats.values(), (cats, {f: ops[f] for f in fusions})
    assert any("/optimizer/" in v for v in ops.values())


def test_compiled_text_without_as_text():
    class NoText:
        def as_text(self):
            raise NotImplementedError("not here")

    text, how = sb.compiled_text(NoText())
    assert text is None and "NotImplementedError" in how


def _write_trace(path: Path, events):
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
            {"ph": "M", "pid": 1, "tid": 10, "name": "thread_name", "args": {"name": "Stream #13(Compute)"}},
            {"ph": "M", "pid": 1, "tid": 20, "name": "thread_name", "args": {"name": "XLA Ops"}}]
    path.mkdir(parents=True)
    with gzip.open(path / "vm.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": meta + events}, f)


def test_kernel_times_of_a_trace(tmp_path):
    ops = sb.hlo_op_names(_HLO)
    ev = lambda name, ts, dur, tid=10, pid=1, **args: {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,  # noqa: E731
                                                        "name": name, "args": args}
    _write_trace(tmp_path / "plugins" / "profile" / "1", [
        ev("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT", 100.0, 40.0, hlo_op="cublas-gemm.2"),
        ev("loop_exp_fusion", 150.0, 10.0),  # by kernel name
        ev("loop_exp_fusion", 170.0, 10.0),
        ev("fusion_77", 190.0, 5.0, hlo_op="loop_exp_fusion"),  # by the trace's hlo_op (a reused kernel)
        ev("input_reduce_fusion.2", 200.0, 6.0, tf_op="jit(step)/optimizer/reduce_sum"),  # the trace's annotation
        ev("loop_convert_fusion", 210.0, 4.0),  # unknown
        ev(_TILE.format(op=2), 220.0, 30.0),
        ev("loop_exp_fusion", 100.0, 1000.0, tid=20),  # a derived line: not a stream
        ev("PjitFunction(step)", 0.0, 5000.0, pid=2),  # host
    ])
    kt = sb.kernel_times(str(tmp_path), ops)
    assert kt.categories == {sb.GEMM_DENSE: 40.0, sb.OPTIMIZER: 31.0, sb.OTHER: 4.0, sb.MVUE: 30.0}
    assert kt.total_us == 105.0 and kt.span_us == 150.0
    # where the op_name of the kernels only it classifies came from (not the GEMM's or ours)
    assert kt.attribution == {"HLO instruction by the trace's hlo_op": 5.0, "HLO instruction by kernel name": 20.0,
                              "the trace's op annotation": 6.0, "none": 4.0}
    top = kt.kernels[0]
    assert (top["name"], top["category"], top["us"], top["launches"]) == (
        "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_TNT", sb.GEMM_DENSE, 40.0, 1)
    assert {k["name"] for k in kt.kernels} >= {"loop_exp_fusion", "input_reduce_fusion"}  # ".2" dropped
    assert sb.kernel_times(str(tmp_path / "none")).total_us == 0.0  # no trace


def experiment(size, label, extra=()):
    return btg.experiment(size, label, 4, 32, 10, ["--n-embd", "32", "--n-layer", "2", "--n-head", "2", *extra])


def test_gemm_flops():
    exp = experiment("llama-tiny", "srste")
    params = jax.eval_shape(lambda: init_state(exp, 0))["params"]
    t, d, h, v = 4 * 32, 32, exp.cfg.ffn_hidden, exp.cfg.vocab_size
    fl = sb.gemm_flops(params, exp.sparse_paths, t, exp.cfg.tie_head)
    per_block = d * 3 * d + d * d + d * 2 * h + h * d  # qkv, proj, fc (gate + up), mlp proj: all 2:4
    assert fl["sparse"] == 2 * 3 * 2 * t * per_block
    assert fl["dense"] == 3 * 2 * t * d * v + 2 * 2 * t * v * d  # untied LM head; one-hot embedding: fwd + dW
    assert fl["fraction_sparse"] == pytest.approx(fl["sparse"] / (fl["sparse"] + fl["dense"]))
    assert sum(r["flops"] for r in fl["layers"]) == fl["total"]
    dense = experiment("llama-tiny", "dense")
    assert sb.gemm_flops(params, dense.sparse_paths, t, False)["fraction_sparse"] == 0.0
    gpt = experiment("tiny", "srste")  # GPT-2 style: FFN only 2:4, head tied to the embedding
    gparams = jax.eval_shape(lambda: init_state(gpt, 0))["params"]
    fl = sb.gemm_flops(gparams, gpt.sparse_paths, t, gpt.cfg.tie_head)
    assert fl["sparse"] == 2 * 3 * 2 * t * (2 * d * 4 * d)
    assert fl["dense"] == 2 * 3 * 2 * t * (4 * d * d) + 3 * 2 * t * d * v + 2 * 2 * t * v * d


DENSE = {sb.GEMM_DENSE: 30.0, sb.ATTENTION: 5.0, sb.OPTIMIZER: 3.0, sb.OTHER: 12.0}
SPARSE = {sb.GEMM_SPARSE: 14.0, sb.GEMM_DENSE: 6.0, sb.COMPRESS: 1.0, sb.MVUE: 2.0, sb.MASKS: 0.5,
          sb.ATTENTION: 5.0, sb.OPTIMIZER: 3.5, sb.OTHER: 12.5}


def test_ceiling_and_gap():
    cmp = sb.compare({"categories_ms": DENSE, "span_ms": 52.0, "wall_ms": 55.0},
                     {"categories_ms": SPARSE, "span_ms": 46.0, "wall_ms": 50.0}, fraction=0.8)
    assert cmp["dense_gemm_ms_of_sparse_layers"] == pytest.approx(24.0)
    assert cmp["ceiling_ms"] == pytest.approx(50.0 - 24.0 * (1 - 1 / 1.6))  # 41
    assert cmp["ideal_ms"][sb.GEMM_SPARSE] == pytest.approx(15.0) and cmp["ideal_ms"][sb.GEMM_DENSE] == pytest.approx(6.0)
    assert cmp["ideal_ms"][sb.MVUE] == cmp["ideal_ms"][sb.COMPRESS] == cmp["ideal_ms"][sb.MASKS] == 0.0
    assert cmp["recipe_ms"] == pytest.approx(44.5) and cmp["gap_total_ms"] == pytest.approx(3.5)
    # the identity the report states: the categories sum to the gap
    assert sum(cmp["gap_ms"].values()) == pytest.approx(cmp["gap_total_ms"])
    assert sum(cmp["gap_share"].values()) == pytest.approx(1.0)
    assert cmp["gap_ms"][sb.GEMM_SPARSE] == pytest.approx(-1.0) and cmp["gap_ms"][sb.MVUE] == pytest.approx(2.0)
    assert cmp["speedup"]["ceiling"] == pytest.approx(50.0 / 41.0)
    assert cmp["speedup"]["kernel_time"] == pytest.approx(50.0 / 44.5)
    assert cmp["speedup"]["device_span"] == pytest.approx(52.0 / 46.0) and cmp["speedup"]["wall"] == pytest.approx(1.1)
    # every GEMM in the 2:4 layers: the ceiling's GEMM time is the dense GEMM time / 1.6
    ideal = sb.ideal_categories(DENSE, 1.0)
    assert ideal[sb.GEMM_DENSE] + ideal[sb.GEMM_SPARSE] == pytest.approx(30.0 / sb.SPARSE_GEMM_CEILING)
    assert sum(ideal.values()) == pytest.approx(50.0 - 30.0 * (1 - 1 / 1.6))
    assert sb.SPARSE_GEMM_CEILING == 1.6


def _record(categories, kernels, wall):
    total = sum(categories.values())
    return {"recipe": "x", "method": "srste", "fp8": False, "backend": "auto", "attention": "cudnn",
            "sparse_layers": 8, "kernel_plan": {}, "flops": {"sparse": 8e12, "dense": 2e12, "total": 1e13,
                                                             "fraction_sparse": 0.8, "layers": []},
            "hlo": "compiled.as_text()", "wall_ms": wall, "wall_rounds_ms": [wall], "kernel_ms": total,
            "span_ms": total + 1.0, "categories_ms": {c: categories.get(c, 0.0) for c in sb.CATEGORIES},
            "attribution_ms": {"HLO instruction by kernel name": total}, "kernels": kernels}


def test_report_files(tmp_path):
    res = {"device": "gpu: NVIDIA H100 80GB HBM3", "jax": "0.10.2", "cuda_kernels": True, "date": "2026-11-25",
           "command": "python benchmarks/bench_step_breakdown.py --size llama-300m", "baseline": "dense",
           "ceiling": sb.SPARSE_GEMM_CEILING, "categories": sb.CATEGORIES,
           "timing": {"warmup": 3, "rounds": 5, "iters": 4, "traced_steps": 5, "top": 20},
           "config": {"size": "llama-300m", "n_layer": 24, "n_head": 16, "n_embd": 1024, "ffn": "swiglu",
                      "ffn_hidden": 2816, "sparse_attn": True, "batch_size": 8, "seq_len": 2048, "tokens": 16384,
                      "attention": "cudnn"},
           "recipes": {
               "dense": dict(_record(DENSE, [{"name": "nvjet_a", "category": sb.GEMM_DENSE, "us": 30000.0,
                                              "launches": 96.0}], 55.0), method="dense", sparse_layers=0),
               "srste": _record(SPARSE, [{"name": _CUTLASS_SPARSE, "category": sb.GEMM_SPARSE, "us": 14000.0,
                                          "launches": 288.0}], 50.0),
               "srste+fp8": {"error": "Traceback ...\nRuntimeError: out of memory"},
           }}
    sb.write(res, tmp_path, "t")
    data = json.loads((tmp_path / "step_breakdown_t.json").read_text())
    cmp = data["comparisons"]["srste"]
    assert set(data["comparisons"]) == {"srste"} and cmp["gap_total_ms"] == pytest.approx(3.5)
    md = (tmp_path / "step_breakdown_t.md").read_text()
    assert md.startswith("# Train-step time breakdown: llama-300m (d=1024, 24 layers, cudnn attention), "
                         "8 x 2048 = 16,384 tokens, gpu: NVIDIA H100 80GB HBM3")
    assert "## srste vs dense: the 1.6x GEMM ceiling and where the gap goes" in md
    assert "| MVUE of ∇y + compress | 2.00 | 0.00 | +2.00 | 57% |" in md
    assert "| **total** | **44.50** | **41.00** | **+3.50** (the gap) | 100% |" in md
    assert "| ceiling (kernel time) | 41.00 | 1.220x |" in md and "| srste (wall) | 50.00 | 1.100x |" in md
    assert "f = 0.800" in md and "estimate" in md
    assert "| srste+fp8 | failed: RuntimeError: out of memory |" in md
    assert "## srste: largest kernels" in md and "## srste vs dense: largest differences" in md
    assert "| `nvjet_a` | GEMM, dense | 30000.0 | 96 | 100.0% |" in md
    sb.write(res, tmp_path, "t")  # a re-run replaces the files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_breakdown_t.json", "step_breakdown_t.md"]


def test_split_attention():
    assert sb.split_attention("dense@xla") == ("dense", "xla")
    assert sb.split_attention("srste@cudnn+fp8/per-call") == ("srste+fp8/per-call", "cudnn")
    assert sb.split_attention("srste@xla/prepared") == ("srste/prepared", "xla")
    assert sb.split_attention("srste@cutlass+fp8") == ("srste@cutlass+fp8", None)


def test_main_on_the_cpu(tmp_path, monkeypatch):
    """A CPU run has no device kernels: the report says so, with the wall-clock times; the compiled
    train step carries the optimizer and attention scopes. A recipe whose trace fails keeps its
    wall-clock time and the next recipe still runs."""
    kernel_times, calls = sb.kernel_times, []

    def first_fails(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("trace unreadable")
        return kernel_times(*args, **kw)

    monkeypatch.setattr(sb, "kernel_times", first_fails)
    argv = ["--size", "llama-tiny", "--n-embd", "32", "--n-layer", "1", "--n-head", "2", "--batch-size", "4",
            "--seq-len", "32", "--recipes", "dense,srste@xla", "--rounds", "2", "--iters", "1", "--steps", "2",
            "--warmup", "1", "--compile-workers", "2", "--out", str(tmp_path), "--tag", "cpu",
            "--trace-dir", str(tmp_path / "traces")]
    assert sb.main(argv) == 1  # a recipe failed
    res = json.loads((tmp_path / "step_breakdown_cpu.json").read_text())
    assert list(res["recipes"]) == ["dense", "srste@xla"] and res["baseline"] == "dense"
    dense, srste = res["recipes"]["dense"], res["recipes"]["srste@xla"]
    assert dense["wall_ms"] > 0 and "RuntimeError: trace unreadable" in dense["error"] and "kernel_ms" not in dense
    assert srste["wall_ms"] > 0 and srste["kernel_ms"] == 0.0 and "error" not in srste
    assert all(r["hlo"] == "compiled.as_text()" for r in res["recipes"].values())
    assert srste["sparse_layers"] == 4 and res["comparisons"] == {}
    md = (tmp_path / "step_breakdown_cpu.md").read_text()
    assert "**No device kernels in the traces**" in md and "| srste@xla |" in md
    assert f"| dense | {dense['wall_ms']:.2f} | - | - |" in md
    assert "dense failed after its wall-clock time: RuntimeError: trace unreadable" in md
    hlo = (tmp_path / "traces" / "srste_xla" / "train_step.hlo.txt").read_text()
    assert "/optimizer/" in hlo and "/attention/" in hlo
    assert sb.main(["--size", "huge", "--out", str(tmp_path)]) == 2
    assert sb.main(["--size", "tiny", "--recipes", "srste@fast", "--out", str(tmp_path)]) == 2
    assert sb.main(["--size", "tiny", "--recipes", "srste@xla/prepared/per-call", "--out", str(tmp_path)]) == 2
