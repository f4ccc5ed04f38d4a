"""The CUDA lowerings the GEMMs of a 2:4 layer trace on a GPU, on the CPU with the extension faked.

On a GPU every GEMM is ``lax.platform_dependent`` between the reference and the CUDA lowering the
chosen backend object gives (``jax_sparse24/_src/backends``). Here the extension's Python interface,
a visible GPU and cuSPARSELt's plan sizes are faked, so tracing a GEMM traces its CUDA branch too:
the custom calls it makes — their targets and their static attributes (the compressor's direction
and layout, the GEMM's sizes, CUTLASS configuration and cuSPARSELt layouts) — are read from the jaxpr
and compared with a literal table, per backend and GEMM (16-bit per call, on a prepared weight, the
MVUE weight gradient; fp8). The table pins what each backend runs, so a refactor of the dispatch that
changed a kernel or an argument fails here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_sparse24._src import autotune, ffi, fp8_gemm, gemm, prepared_weight
from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import cuda_fp8_ops as cf
from jax_sparse24._src import cuda_spmm_ops as cs


class _Ext:
    """The extension's Python interface: configurations, alignments, compressed shapes."""

    def cutlass_configs(self):
        return ["k1", "k2"]

    def cutlass_configs_kn(self):
        return ["kn1", "kn2"]

    def cutlass_alignment(self):
        return (8, 16, 16)

    def cutlass_default_config_kn(self, m, n, k):
        return -1

    def cutlass_configs_fp8(self):
        return ["fp8_a"]

    def cutlass_alignment_fp8(self):
        return (8, 16, 32)

    def cutlass_compressed_shapes(self, m, k, code):
        r = lambda a, b: -(-a // b) * b  # noqa: E731
        return (m, k // 2), (r(m, 64), r(k, 128) // (8 if code == 2 else 16))


_CACHED = (cs.cutlass_configs, cs.cutlass_configs_kn, cs.cutlass_default_config_kn, cs.cutlass_alignment,
           cs.cutlass_default_config, cs._compressed_shapes, cf.cutlass_configs_fp8, cf.cutlass_alignment_fp8)


def fake_gpu(monkeypatch):
    """A GPU with the extension and cuSPARSELt (bfloat16; our fused layout where m % 64 and k % 32)."""
    for fn in _CACHED:
        fn.cache_clear()
    monkeypatch.setattr(ffi, "_load", lambda: (_Ext(), None))
    monkeypatch.setattr(ffi, "_gpu_present", lambda: True)
    monkeypatch.setattr(lt, "cusparselt_supports", lambda m, n, k, dtype: jnp.dtype(dtype) == jnp.bfloat16)
    monkeypatch.setattr(lt, "cusparselt_compressed_size", lambda m, n, k, dtype, a, b: m * k * 9 // 8)
    monkeypatch.setattr(lt, "fused_compress_ok", lambda m, n, k, dtype, b=lt.B_NK: m % 64 == 0 and k % 32 == 0)
    # the measured table names configuration "k2" for the forward GEMM's shape, "kn2" for the weight gradient's
    table = {"entries": [dict(m=256, n=64, k=128, dtype="bfloat16", config="k2", speedup_with_compress=0.9)],
             "entries_kn": [dict(m=256, n=128, k=64, dtype="bfloat16", config="kn2", speedup_with_compress=0.9)]}
    monkeypatch.setattr(autotune, "_table", lambda: table)


@pytest.fixture
def gpu(monkeypatch):
    fake_gpu(monkeypatch)
    yield
    for fn in _CACHED:
        fn.cache_clear()


def _calls(fn, *args) -> list[str]:
    """The custom calls in the jaxpr of ``fn(*args)`` (every branch), as ``target(attr=value, ...)``."""
    out = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "ffi_call":
                attrs = {k: v for k, v in eqn.params.items()
                         if k not in ("target_name", "result_avals", "vmap_method", "input_layouts",
                                      "output_layouts", "input_output_aliases", "custom_call_api_version",
                                      "legacy_backend_config", "has_side_effect", "ordered")}
                attr = dict(attrs.get("attributes", ()) or ()) if "attributes" in attrs else attrs
                text = ", ".join(f"{k}={int(v) if np.ndim(v) == 0 else v}" for k, v in sorted(attr.items()))
                out.append(f"{eqn.params['target_name'].removeprefix('jax_sparse24_')}({text})")
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return out


T, I, O = 64, 128, 256  # tokens, in, out: every backend's alignment


def _layer(dtype=jnp.bfloat16):
    x = jnp.ones((T, I), dtype)
    w = jax.random.normal(jax.random.key(0), (I, O), jnp.float32).astype(dtype)
    m = jnp.asarray(np.tile(np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]], bool), (I // 4, O // 4)))
    g = jnp.ones((T, O), dtype)
    return x, w, m, g


# backend -> the GEMMs' custom calls: forward, input gradient (transposable mask), MVUE weight gradient,
# the preparation of a weight for both GEMMs, and the two GEMMs on it (dense: the MVUE op's kernel only)
EXPECTED = {
    "cutlass": {
        "forward": ["masked_compress(transposed=1)",
                    "cutlass_spmm(config=1, k=128, m=256, n=64, raster=0, swizzle=1)"],
        "input_grad": ["masked_compress(transposed=0)",
                       "cutlass_spmm(config=1, k=256, m=128, n=64, raster=0, swizzle=1)"],
        "weight_grad_mvue": ["mvue24_compress(transposed=1)",
                             "cutlass_spmm_kn(config=1, k=64, m=256, n=128, raster=0, swizzle=1)"],
        "prepare": ["masked_compress_both()"],
        "forward_prepared": ["cutlass_spmm(config=1, k=128, m=256, n=64, raster=0, swizzle=1)"],
        "input_grad_prepared": ["cutlass_spmm(config=1, k=256, m=128, n=64, raster=0, swizzle=1)"],
    },
    "cusparselt": {
        "forward": ["masked_compress_lt(transposed=1)",
                    "cusparselt_spmm(a_layout=0, b_layout=0, k=128, m=256, n=64)"],
        "input_grad": ["masked_compress_lt(transposed=0)",
                       "cusparselt_spmm(a_layout=0, b_layout=0, k=256, m=128, n=64)"],
        "weight_grad_mvue": ["mvue24_compress_lt(transposed=1)",
                             "cusparselt_spmm(a_layout=0, b_layout=1, k=64, m=256, n=128)"],
        "prepare": ["masked_compress_both_lt()"],
        "forward_prepared": ["cusparselt_spmm(a_layout=0, b_layout=0, k=128, m=256, n=64)"],
        "input_grad_prepared": ["cusparselt_spmm(a_layout=0, b_layout=0, k=256, m=128, n=64)"],
    },
    "dense": {
        "forward": [],
        "input_grad": [],
        "weight_grad_mvue": ["mvue24()"],
        "prepare": [],
        "forward_prepared": [],
        "input_grad_prepared": [],
    },
}


@pytest.mark.parametrize("backend", list(EXPECTED))
def test_gemm_kernels_per_backend(gpu, backend):
    x, w, m, g = _layer()
    key = jax.random.key(1)
    got = {
        "forward": _calls(functools.partial(gemm.forward, backend=backend), x, w, m),
        "input_grad": _calls(functools.partial(gemm.input_grad, transposable=True, backend=backend), g, w, m),
        "weight_grad_mvue": _calls(functools.partial(gemm.weight_grad_mvue, backend=backend), key, x, g),
    }
    plan = prepared_weight.plan(w, m, tokens=T, dtype=jnp.bfloat16, backend=backend, transposable=True, reuse=4)
    got["prepare"] = _calls(lambda w, m: prepared_weight.prepare_many([plan._replace(wc=w, mk=m)]), w, m)
    prepared = prepared_weight.prepare_many([plan])[0]
    if "forward" in prepared:
        got["forward_prepared"] = _calls(prepared_weight.forward_prepared, x, w, m, prepared["forward"])
        got["input_grad_prepared"] = _calls(prepared_weight.input_grad_prepared, g, w, m, prepared["input_grad"])
    else:  # dense: W̃ kept, the GEMMs are XLA's
        assert set(prepared) == {"masked"}
        got["forward_prepared"] = got["input_grad_prepared"] = []
    assert got == EXPECTED[backend]


def test_cusparselt_falls_back_to_the_library_compressor(gpu):
    """Where our fused compressor's layout does not hold (m % 64), cuSPARSELt's own compressor writes the
    operand: per call and in a preparation (one library compression per GEMM)."""
    x, w, m, g = _layer()
    x, w, m = x[:, :96], w[:96, :96], m[:96, :96]  # forward: m = O = 96
    assert _calls(functools.partial(gemm.forward, backend="cusparselt"), x, w, m) == [
        "cusparselt_compress(a_layout=1, b_layout=0, k=96, m=96, n=64)",
        "cusparselt_spmm(a_layout=1, b_layout=0, k=96, m=96, n=64)"]
    plan = prepared_weight.plan(w, m, tokens=T, dtype=jnp.bfloat16, backend="cusparselt", transposable=True, reuse=4)
    assert _calls(lambda w, m: prepared_weight.prepare_many([plan._replace(wc=w, mk=m)]), w, m) == [
        "cusparselt_compress(a_layout=0, b_layout=0, k=96, m=96, n=64)",
        "cusparselt_compress(a_layout=0, b_layout=0, k=96, m=96, n=64)"]


def test_fp8_gemm_kernels(gpu):
    """fp8 on CUTLASS: the fused quantize + mask + compress and the sparse fp8 GEMM for the forward and
    the input gradient, the fused MVUE + quantize + compress, the quantize-transpose and the fp8 GEMM
    for the weight gradient; dense and reference: XLA's fp8 dots (and the MVUE op's kernel)."""
    x, w, m, g = _layer()
    key = jax.random.key(1)
    s = jnp.float32(1.0)

    def calls(backend):
        return (_calls(lambda x, w, m: fp8_gemm.forward(x, w, m, backend=backend)[0], x, w, m),
                _calls(functools.partial(fp8_gemm.input_grad, transposable=True, backend=backend), g, w, m, s),
                _calls(functools.partial(fp8_gemm.weight_grad_mvue, backend=backend), key, x, g, s))

    assert calls("cutlass") == (
        ["fp8_masked_compress(transposed=1)", "cutlass_spmm_fp8(config=-1, k=128, m=256, n=64)"],
        ["fp8_masked_compress(transposed=0)", "cutlass_spmm_fp8(config=-1, k=256, m=128, n=64)"],
        ["fp8_mvue24_compress()", "fp8_quantize_transpose()", "cutlass_spmm_fp8(config=-1, k=64, m=256, n=128)"])
    assert calls("dense") == calls("reference") == ([], [], ["mvue24()"])  # the MVUE op's kernel, XLA's fp8 dots
