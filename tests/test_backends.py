"""The GEMM backends (``jax_sparse24._src.backends``) and the planner's ``resolve``.

``test_decisions_are_frozen`` pins which backend every GEMM of a layer resolves to — per call, for a
prepared weight, the MVUE weight gradient and fp8 — over a grid of shapes, dtypes, requested backends
and machines (the extension, a GPU, cuSPARSELt and its version, a minimal build: faked at the level of
the extension's interface and the library loader), including the exact error messages. The table
(``EXPECTED``, ``ERRORS``) is literal: a change to a decision or a message fails here. The other tests
check that ``resolve`` returns the registered objects, the registry itself, that a new backend is one
registered class, and each backend's ``can_run`` with its reasons.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import pytest

from jax_sparse24._src import autotune, backends, ffi, fp8_gemm, partitioning, sparse_array
from jax_sparse24._src.backends import CUSPARSELT, CUTLASS, CUTLASS_FP8, DENSE, REFERENCE
from jax_sparse24._src.backends import base as backends_base
from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import cuda_fp8_ops as cf
from jax_sparse24._src import cuda_spmm_ops as cs


class _Ext:
    """The extension's Python interface (configurations, alignment, compressed shapes)."""

    def __init__(self, *, minimal: bool = False):
        self.minimal = minimal
        if not minimal:  # a minimal build has no fp8 kernels
            self.cutlass_configs_fp8 = lambda: ["fp8_a", "fp8_b"]
            self.cutlass_alignment_fp8 = lambda: (8, 16, 32)

    def cutlass_configs(self):
        return ["k1", "k2"]

    def cutlass_configs_kn(self):
        return [] if self.minimal else ["kn1", "kn2"]

    def cutlass_alignment(self):
        return (8, 16, 16)

    def cutlass_default_config_kn(self, m, n, k):
        return -1

    def cutlass_compressed_shapes(self, m, k, code):
        if self.minimal and code == 1:
            raise ValueError("float16 is not compiled in this build")
        r = lambda a, b: -(-a // b) * b  # noqa: E731
        return (m, k // 2), (r(m, 64), r(k, 128) // (8 if code == 2 else 16))


def _lt_loaded(version):
    return lt._Loaded(True, "/x/libcusparseLt.so.0", lt.parse_version(version), "test")


_NO_EXT = "the CUDA extension jax_sparse24._sparse24_ffi is not available (test: not built)"
_NO_LT = lt._Loaded(False, "the cuSPARSELt library (libcusparseLt.so.0) could not be loaded (test)")

#: machine -> (extension, GPU visible, cuSPARSELt loader state)
SCENARIOS = {
    "cpu": (None, False, lt._Loaded(False, _NO_EXT)),
    "ext_no_gpu": (_Ext(), False, _lt_loaded("0.8.1")),
    "gpu": (_Ext(), True, _lt_loaded("0.8.1")),
    "gpu_no_lt": (_Ext(), True, _NO_LT),
    "gpu_lt_0.10": (_Ext(), True, _lt_loaded("0.10.0")),
    "gpu_minimal": (_Ext(minimal=True), True,
                    lt._Loaded(False, "this build of the extension has no cuSPARSELt backend")),
}


def _e(m, n, k, s, s_lt=None, g=None, g_lt=None):
    e = dict(m=m, n=n, k=k, dtype="bfloat16", config="k2", speedup_with_compress=s)
    if s_lt is not None:
        e["cusparselt_speedup_with_compress"] = s_lt
    if g is not None:
        e["gemm_speedup"] = g
    if g_lt is not None:
        e["cusparselt_gemm_speedup"] = g_lt
    return e


TABLE = {
    "cusparselt_version": "0.8.1",
    "entries": [_e(4096, 8192, 1024, 1.10, 1.30, 1.3, 1.6), _e(1024, 8192, 4096, 1.10, 1.05, 1.4, 1.2),
                _e(2048, 8192, 512, 0.90, 1.02, 1.05, 1.3), dict(_e(4096, 8192, 1024, 1.2, 1.4), dtype="float16"),
                _e(64, 48, 64, 0.95, None, 1.2)],
    "entries_kn": [_e(1024, 4096, 8192, 1.05, 1.2), _e(4096, 1024, 8192, 1.2, 1.1), _e(768, 3072, 2048, 0.8),
                   _e(64, 48, 64, 1.1, 1.3)],
}

SHAPES = [(4096, 8192, 1024), (1024, 8192, 4096), (2048, 8192, 512), (768, 3072, 2048), (1024, 2048, 4096),
          (64, 48, 64), (96, 64, 40), (100, 64, 64)]
DTYPES = ("bfloat16", "float16", "float32")
REQUESTS = ("auto", "cutlass", "cusparselt", "dense", "reference")


@pytest.fixture
def machine(monkeypatch):
    """``use(name)`` fakes the machine ``SCENARIOS[name]`` (and the measured table ``TABLE``)."""

    cached = (cs.cutlass_configs, cs.cutlass_configs_kn, cs.cutlass_default_config_kn, cs.cutlass_alignment,
              cs.cutlass_default_config, cs._compressed_shapes, cf.cutlass_configs_fp8, cf.cutlass_alignment_fp8,
              lt._compressed_size)

    def clear():
        for fn in cached:
            fn.cache_clear()

    def use(name):
        ext, gpu, lt_state = SCENARIOS[name]
        clear()
        monkeypatch.setattr(ffi, "_load", lambda: (ext, None if ext is not None else _NO_EXT))
        monkeypatch.setattr(ffi, "_gpu_present", lambda: gpu)
        monkeypatch.setattr(lt, "_load", lambda: lt_state)
        monkeypatch.setattr(lt, "_warned", set())
        monkeypatch.setattr(lt, "_fused_compress_check", lambda m, n, k, d, b, v: m % 64 == 0 and k % 32 == 0)
        monkeypatch.setattr(autotune, "_table", lambda: TABLE)

    yield use
    clear()


def _call(errors: list, fn, *args, **kwargs) -> str:
    """``fn``'s result, or ``E<i>``: ``errors[i]`` is its exception (type and message)."""
    try:
        return str(fn(*args, **kwargs))
    except (RuntimeError, ValueError) as e:
        msg = f"{type(e).__name__}: {e}"
        if msg not in errors:
            errors.append(msg)
        return f"E{errors.index(msg)}"


def _path_name(path) -> str:
    """A weight-gradient path as the freeze wrote it: ``"exact"`` or the backend's name."""
    return path.backend.name if path.mvue else "exact"


def _fp8_wgrad_name(chosen) -> str:
    """An fp8 weight-gradient plan as the freeze wrote it: ``"16-bit"`` (None), ``"mvue"`` (XLA's fp8 dot of the
    sample: a backend without kernels) or the sparse fp8 backend's label."""
    return "16-bit" if chosen is None else chosen.fp8_label if chosen.sparse else "mvue"


def _observe(errors: list, backend: str, m: int, n: int, k: int, dtype) -> str:
    """Every decision for D(m×n) = A(m×k, 2:4)·B(k×n) (as a layer: o = m, tokens = n, i = k), one string."""
    c = lambda fn, *a, **kw: _call(errors, fn, *a, **kw)  # noqa: E731
    out = [
        c(autotune.choose, backend, m, n, k, dtype),
        c(autotune.choose, backend, m, n, k, dtype, reuse=4),
        c(autotune.choose, backend, m, n, k, dtype, reuse=1, batched=True),
        c(autotune.choose_weight_grad, backend, m, n, k, dtype),
        c(lambda *a: _path_name(autotune.weight_grad_path(*a)), backend, m, n, k, dtype),
        c(autotune.weight_gemms_plan, backend, n, k, m, dtype, transposable=True),
        c(autotune.weight_gemms_plan, backend, n, k, m, dtype, transposable=False, reuse=2),
        c(fp8_gemm.choose, backend, m, n, k),
        c(fp8_gemm.plan, backend, n, k, m, transposable=True),
        c(fp8_gemm.plan, backend, n, k, m, transposable=False),
        c(lambda *a, **kw: _fp8_wgrad_name(autotune.fp8_weight_grad_backend(*a, **kw)), backend, n, k, m, dtype, mvue=True),
        c(lambda *a, **kw: _fp8_wgrad_name(autotune.fp8_weight_grad_backend(*a, **kw)), backend, n, k, m, dtype, mvue=False),
    ]
    return " ".join(o.replace("'", "").replace(" ", "") for o in out)


def _observe_machine(errors: list) -> str:
    """Decisions that depend on the machine and shape only: CUTLASS configurations, Sparse24Array's layout."""
    c = lambda fn, *a, **kw: _call(errors, fn, *a, **kw)  # noqa: E731
    out = []
    for m, n, k in SHAPES:
        out += [c(autotune.cutlass_config, m, n, k, jnp.bfloat16),
                c(autotune.lookup_weight_grad, m, n, k, jnp.bfloat16),
                c(sparse_array._cutlass_layout_ok, (m, k), jnp.bfloat16),
                c(sparse_array._cutlass_layout_ok, (m, k), jnp.float32)]
    return " ".join(o.replace(" ", "") for o in out)


def _table(use) -> tuple[dict, list]:
    errors, table = [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in SCENARIOS:
            use(name)
            table[name] = _observe_machine(errors)
            for m, n, k in SHAPES:
                for dtype in DTYPES:
                    for backend in REQUESTS:
                        table[f"{name} {m},{n},{k} {dtype} {backend}"] = _observe(errors, backend, m, n, k,
                                                                                   jnp.dtype(dtype))
    return table, errors


def _renumbered(row: str, errors: list) -> str:
    return " ".join(f"E{ERRORS.index(errors[int(w[1:])])}" if w[:1] == "E" and w[1:].isdigit() else w
                    for w in row.split(" "))


def test_decisions_are_frozen(machine):
    table, errors = _table(machine)
    assert not [e for e in errors if e not in ERRORS]
    got = {key: _renumbered(row, errors) for key, row in table.items()}
    assert got.keys() == EXPECTED.keys()
    bad = {key: (got[key], EXPECTED[key]) for key in EXPECTED if got[key] != EXPECTED[key]}
    assert not bad, f"{len(bad)} decisions changed, e.g. {list(bad.items())[:5]}"



def test_resolve_returns_the_registered_backend_objects(machine):
    """``resolve`` gives the object whose name the planner's functions report, for every GEMM."""
    for name in ("cpu", "gpu", "gpu_minimal"):
        machine(name)
        for m, n, k in SHAPES[:3] + SHAPES[-2:]:
            for backend in ("auto", "dense", "reference"):
                fwd = autotune.resolve(backend, "forward", m, n, k, jnp.bfloat16, reuse=4)
                assert fwd is backends.get(autotune.choose(backend, m, n, k, jnp.bfloat16, reuse=4))
                wg = autotune.resolve(backend, "weight_grad", m, n, k, jnp.bfloat16)
                assert wg is backends.get(autotune.choose_weight_grad(backend, m, n, k, jnp.bfloat16))
                f8 = autotune.resolve(backend, "forward", m, n, k, fp8=True)
                assert f8 in (CUTLASS_FP8, DENSE, REFERENCE) and f8.fp8_label == fp8_gemm.choose(backend, m, n, k)
    machine("gpu")
    assert autotune.resolve("auto", "forward", 4096, 8192, 1024, jnp.bfloat16) is CUSPARSELT
    assert autotune.resolve("auto", "input_grad", 1024, 8192, 4096, jnp.bfloat16) is CUTLASS
    assert autotune.resolve("auto", "forward", 2048, 8192, 512, jnp.bfloat16) is DENSE
    assert autotune.resolve("cutlass", "forward", 64, 48, 64, jnp.bfloat16, fp8=True) is CUTLASS_FP8
    with pytest.raises(ValueError, match="gemm must be one of"):
        autotune.resolve("auto", "backward", 64, 48, 64, jnp.bfloat16)


def test_registry():
    assert backends.names() == autotune.BACKENDS[1:] == ("cutlass", "cusparselt", "dense", "reference")
    assert [backends.get(n) for n in backends.names()] == [CUTLASS, CUSPARSELT, DENSE, REFERENCE]
    assert backends.get("cutlass", fp8=True) is CUTLASS_FP8
    with pytest.raises(KeyError):
        backends.get("cusparselt", fp8=True)
    assert [b.sparse for b in (CUTLASS, CUSPARSELT, DENSE, REFERENCE, CUTLASS_FP8)] == [True, True, False, False, True]
    assert CUTLASS.operand_keys == ("values", "meta") and CUSPARSELT.operand_keys == ("cusparselt",)
    assert DENSE.operand_keys == REFERENCE.operand_keys == ()
    with pytest.raises(ValueError, match="already registered"):
        backends.register(type(CUTLASS)())
    # the sharding rules are partitioning.py's: the GEMM rule, and for fp8 the same with the scales appended
    assert CUTLASS.sharding_rule("forward") == partitioning.gemm_rule("forward")
    fp8_rule = CUTLASS_FP8.sharding_rule("input_grad")
    assert fp8_rule.operands == partitioning.gemm_rule("input_grad", transposable=True).operands + ((), ())
    assert fp8_rule.name.startswith("sparse24 fp8")


def test_a_new_backend_is_one_class_and_its_registration(monkeypatch):
    """What a new backend needs: a Backend subclass registered under its name; the planner resolves it."""
    monkeypatch.setattr(backends_base, "_REGISTRY", dict(backends_base._REGISTRY))

    class Mine(backends.Backend):
        name = "mine"

        def can_run(self, m, n, k, dtype=None, *, gemm="forward"):
            return backends.Verdict(None if m % 128 == 0 else "m must be a multiple of 128")

    mine = backends.register(Mine())
    assert backends.names()[-1] == "mine" and repr(mine) == "<GEMM backend 'mine'>"
    assert autotune.resolve("mine", "forward", 100, 64, 64, jnp.bfloat16) is mine  # not sparse: runs everywhere
    Mine.sparse = True
    with pytest.raises(RuntimeError, match=r"backend='mine': m must be a multiple of 128"):
        autotune.resolve("mine", "forward", 100, 64, 64, jnp.bfloat16)
    assert autotune.resolve("mine", "forward", 128, 64, 64, jnp.bfloat16) is mine
    with pytest.raises(ValueError, match=r"backend='mine' has no fp8 path in this version; use 'auto', 'cutlass', "
                                         r"'dense' or 'reference'"):
        autotune.resolve("mine", "forward", 128, 64, 64, fp8=True)


def test_verdict():
    assert backends.OK and backends.OK.reason is None
    no = backends.Verdict("because")
    assert not no and no.reason == "because"


def test_can_run_reasons(machine):
    bf16, f16, f32 = jnp.bfloat16, jnp.float16, jnp.float32
    machine("cpu")
    for b in (CUTLASS, CUSPARSELT, CUTLASS_FP8):
        v = b.can_run(64, 64, 64, bf16)
        assert not v and v.reason == _NO_EXT, b
    assert not CUTLASS.can_run(64, 64, 64, bf16, gemm="weight_grad")
    assert DENSE.can_run(100, 3, 5, f32) and REFERENCE.can_run(100, 3, 5, f32, gemm="weight_grad")

    machine("gpu")
    assert CUTLASS.can_run(64, 48, 64, bf16) and CUTLASS.can_run(64, 48, 64, f16)
    assert CUTLASS.can_run(64, 48, 64, bf16, gemm="weight_grad")
    assert CUTLASS.can_run(96, 64, 40, f32).reason == (
        "the CUTLASS sparse GEMM does not support m=96, n=64, k=40, dtype=float32 (bfloat16/float16 only; "
        "alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())")
    assert CUTLASS.can_run(96, 64, 40, bf16, gemm="weight_grad").reason.startswith(
        "the sparse weight-gradient GEMM does not support m=O=96, n=I=64, k=T=40, dtype=bfloat16")
    assert CUSPARSELT.can_run(64, 48, 64, bf16)
    assert "cuSPARSELt float16 GEMMs are disabled" in CUSPARSELT.can_run(64, 48, 64, f16).reason
    assert CUSPARSELT.can_run(96, 64, 40, bf16).reason == (
        "cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=96, n=64, k=40, dtype=bfloat16")
    assert CUTLASS_FP8.can_run(64, 48, 64)
    assert CUTLASS_FP8.can_run(96, 64, 40).reason == (
        "the fp8 sparse GEMM needs m % 8, n % 16, k % 32 == 0, got m=96, n=64, k=40")
    too_many = 65535 * 64 + 32
    assert CUTLASS_FP8.can_run(64, 48, too_many, gemm="weight_grad").reason == (
        f"the fp8 weight-gradient kernels take at most {65535 * 64} (padded) tokens per call, got {too_many}")

    machine("gpu_no_lt")
    assert CUSPARSELT.can_run(64, 48, 64, bf16).reason == _NO_LT.message

    machine("gpu_minimal")
    assert CUTLASS_FP8.can_run(64, 48, 64).reason == "the loaded extension was built without the fp8 kernels"
    assert not CUTLASS.weight_grad_kernels_built()
    assert not CUTLASS.can_run(64, 48, 64, f16)  # float16 not compiled
    assert CUTLASS.can_run(64, 48, 64, bf16)


# --- The decisions as of the freeze (generated from _table; one row per machine / case) -----------------------
ERRORS = [
    "RuntimeError: jax_sparse24: the CUDA extension jax_sparse24._sparse24_ffi is not available (test: not built). Reinstall on a machine with nvcc 13 and a CUDA-enabled jaxlib: JAX_SPARSE24_CUDA=ON pip install -e '.[gpu]' (see docs/gpu.md).",
    "RuntimeError: backend='cutlass': the CUDA extension jax_sparse24._sparse24_ffi is not available (test: not built)",
    "RuntimeError: backend='cutlass' with fp8=True: the CUDA extension jax_sparse24._sparse24_ffi is not available (test: not built)",
    "RuntimeError: backend='cusparselt': the CUDA extension jax_sparse24._sparse24_ffi is not available (test: not built)",
    "ValueError: fp8=True: backend='cusparselt' has no fp8 path in this version; use 'auto', 'cutlass', 'dense' or 'reference'",
    "RuntimeError: backend='cusparselt': cuSPARSELt float16 GEMMs are disabled: cuSPARSELt 0.8.1 returned wrong values for float16 on some shapes on the H100 (bfloat16 is right); use bfloat16, or backend='cutlass' for float16 (set JAX_SPARSE24_CUSPARSELT_FLOAT16=1 to try another cuSPARSELt version)",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=4096, n=8192, k=1024, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=4096, n=I=8192, k=T=1024, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=4096, n=8192, k=1024, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=4096, n=1024, k=8192, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=1024, n=8192, k=4096, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=1024, n=I=8192, k=T=4096, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=1024, n=8192, k=4096, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=1024, n=4096, k=8192, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=2048, n=8192, k=512, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=2048, n=I=8192, k=T=512, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=2048, n=8192, k=512, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=2048, n=512, k=8192, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=768, n=3072, k=2048, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=768, n=I=3072, k=T=2048, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=768, n=3072, k=2048, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=768, n=2048, k=3072, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=1024, n=2048, k=4096, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=1024, n=I=2048, k=T=4096, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=1024, n=2048, k=4096, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=1024, n=4096, k=2048, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=64, n=48, k=64, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=64, n=I=48, k=T=64, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=64, n=48, k=64, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=64, n=64, k=48, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=96, n=64, k=40, dtype=bfloat16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=96, n=I=64, k=T=40, dtype=bfloat16 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cutlass' with fp8=True: the fp8 sparse GEMM needs m % 8, n % 16, k % 32 == 0, got m=96, n=64, k=40",
    "RuntimeError: backend='cutlass' with fp8=True: the fp8 sparse GEMM needs m % 8, n % 16, k % 32 == 0, got m=96, n=40, k=64",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=96, n=64, k=40, dtype=bfloat16",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=96, n=40, k=64, dtype=bfloat16",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=96, n=64, k=40, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=96, n=I=64, k=T=40, dtype=float16 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=96, n=64, k=40, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=96, n=I=64, k=T=40, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=96, n=I=64, k=T=48, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=96, n=64, k=40, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=96, n=64, k=48, dtype=float32",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=96, n=40, k=64, dtype=float32",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=100, n=64, k=64, dtype=bfloat16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=100, n=I=64, k=T=64, dtype=bfloat16 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cutlass' with fp8=True: the fp8 sparse GEMM needs m % 8, n % 16, k % 32 == 0, got m=100, n=64, k=64",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=100, n=64, k=64, dtype=bfloat16",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=100, n=64, k=64, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=100, n=I=64, k=T=64, dtype=float16 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=100, n=64, k=64, dtype=float32 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the sparse weight-gradient GEMM does not support m=O=100, n=I=64, k=T=64, dtype=float32 (bfloat16/float16; O % 8, I % 8; a compiled 'kn' configuration: jax_sparse24._src.cuda_spmm_ops.cutlass_configs_kn())",
    "RuntimeError: backend='cusparselt': cuSPARSELt needs bfloat16 and m, n, k multiples of 16, got m=100, n=64, k=64, dtype=float32",
    "RuntimeError: backend='cusparselt': the cuSPARSELt library (libcusparseLt.so.0) could not be loaded (test)",
    "RuntimeError: backend='cutlass' with fp8=True: the loaded extension was built without the fp8 kernels",
    "RuntimeError: backend='cusparselt': this build of the extension has no cuSPARSELt backend",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=4096, n=8192, k=1024, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=1024, n=8192, k=4096, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=2048, n=8192, k=512, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=768, n=3072, k=2048, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=1024, n=2048, k=4096, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
    "RuntimeError: backend='cutlass': the CUTLASS sparse GEMM does not support m=64, n=48, k=64, dtype=float16 (bfloat16/float16 only; alignment in jax_sparse24._src.cuda_spmm_ops.cutlass_alignment())",
]

EXPECTED = {
    'cpu': 'E0 E0 False False E0 E0 False False E0 E0 False False E0 E0 False False E0 E0 False False E0 E0 False False E0 E0 False False E0 E0 False False',
    'cpu 4096,8192,1024 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 4096,8192,1024 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 4096,8192,1024 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 4096,8192,1024 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 4096,8192,1024 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 4096,8192,1024 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 4096,8192,1024 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 4096,8192,1024 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 4096,8192,1024 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 4096,8192,1024 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 4096,8192,1024 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 4096,8192,1024 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 4096,8192,1024 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 4096,8192,1024 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 4096,8192,1024 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,8192,4096 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 1024,8192,4096 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 1024,8192,4096 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 1024,8192,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,8192,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,8192,4096 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 1024,8192,4096 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 1024,8192,4096 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 1024,8192,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,8192,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,8192,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 1024,8192,4096 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 1024,8192,4096 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 1024,8192,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,8192,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 2048,8192,512 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 2048,8192,512 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 2048,8192,512 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 2048,8192,512 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 2048,8192,512 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 2048,8192,512 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 2048,8192,512 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 2048,8192,512 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 2048,8192,512 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 2048,8192,512 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 2048,8192,512 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 2048,8192,512 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 2048,8192,512 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 2048,8192,512 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 2048,8192,512 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 768,3072,2048 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 768,3072,2048 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 768,3072,2048 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 768,3072,2048 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 768,3072,2048 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 768,3072,2048 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 768,3072,2048 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 768,3072,2048 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 768,3072,2048 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 768,3072,2048 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 768,3072,2048 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 768,3072,2048 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 768,3072,2048 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 768,3072,2048 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 768,3072,2048 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,2048,4096 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 1024,2048,4096 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 1024,2048,4096 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 1024,2048,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,2048,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,2048,4096 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 1024,2048,4096 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 1024,2048,4096 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 1024,2048,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,2048,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,2048,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 1024,2048,4096 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 1024,2048,4096 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 1024,2048,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 1024,2048,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 64,48,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 64,48,64 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 64,48,64 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 64,48,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 64,48,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 64,48,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 64,48,64 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 64,48,64 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 64,48,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 64,48,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 64,48,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 64,48,64 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 64,48,64 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 64,48,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 64,48,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 96,64,40 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 96,64,40 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 96,64,40 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 96,64,40 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 96,64,40 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 96,64,40 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 96,64,40 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 96,64,40 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 96,64,40 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 96,64,40 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 96,64,40 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 96,64,40 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 96,64,40 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 96,64,40 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 96,64,40 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 100,64,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 100,64,64 bfloat16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 100,64,64 bfloat16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 100,64,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 100,64,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 100,64,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 100,64,64 float16 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 100,64,64 float16 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 100,64,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 100,64,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 100,64,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'cpu 100,64,64 float32 cutlass': 'E1 E1 E1 E1 E1 E1 E1 E2 E2 E2 E2 16-bit',
    'cpu 100,64,64 float32 cusparselt': 'E3 E3 E3 E3 E3 E3 E3 E4 E4 E4 E3 16-bit',
    'cpu 100,64,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'cpu 100,64,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu': '1 (0.8,-1) False False 1 (1.05,-1) False False 1 (0.8,-1) False False 1 (0.8,-1) False False 1 (1.05,-1) False False 1 (1.1,-1) False False 1 (1.1,-1) False False 1 (1.1,-1) False False',
    'ext_no_gpu 4096,8192,1024 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 4096,8192,1024 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 4096,8192,1024 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 16-bit 16-bit',
    'ext_no_gpu 4096,8192,1024 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 4096,8192,1024 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 4096,8192,1024 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 4096,8192,1024 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 4096,8192,1024 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 4096,8192,1024 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 4096,8192,1024 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 4096,8192,1024 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 4096,8192,1024 float32 cutlass': 'E6 E6 E6 E7 E7 E6 E6 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 4096,8192,1024 float32 cusparselt': 'E8 E8 E8 E8 E8 E8 E8 E4 E4 E4 E9 16-bit',
    'ext_no_gpu 4096,8192,1024 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 4096,8192,1024 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,8192,4096 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 1024,8192,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 1024,8192,4096 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 16-bit 16-bit',
    'ext_no_gpu 1024,8192,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,8192,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,8192,4096 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 1024,8192,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 1024,8192,4096 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 1024,8192,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,8192,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,8192,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 1024,8192,4096 float32 cutlass': 'E10 E10 E10 E11 E11 E10 E10 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 1024,8192,4096 float32 cusparselt': 'E12 E12 E12 E12 E12 E12 E12 E4 E4 E4 E13 16-bit',
    'ext_no_gpu 1024,8192,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,8192,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 2048,8192,512 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 2048,8192,512 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 2048,8192,512 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 16-bit 16-bit',
    'ext_no_gpu 2048,8192,512 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 2048,8192,512 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 2048,8192,512 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 2048,8192,512 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 2048,8192,512 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 2048,8192,512 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 2048,8192,512 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 2048,8192,512 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 2048,8192,512 float32 cutlass': 'E14 E14 E14 E15 E15 E14 E14 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 2048,8192,512 float32 cusparselt': 'E16 E16 E16 E16 E16 E16 E16 E4 E4 E4 E17 16-bit',
    'ext_no_gpu 2048,8192,512 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 2048,8192,512 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 768,3072,2048 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 768,3072,2048 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 768,3072,2048 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 16-bit 16-bit',
    'ext_no_gpu 768,3072,2048 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 768,3072,2048 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 768,3072,2048 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 768,3072,2048 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 768,3072,2048 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 768,3072,2048 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 768,3072,2048 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 768,3072,2048 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 768,3072,2048 float32 cutlass': 'E18 E18 E18 E19 E19 E18 E18 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 768,3072,2048 float32 cusparselt': 'E20 E20 E20 E20 E20 E20 E20 E4 E4 E4 E21 16-bit',
    'ext_no_gpu 768,3072,2048 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 768,3072,2048 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,2048,4096 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 1024,2048,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 1024,2048,4096 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 16-bit 16-bit',
    'ext_no_gpu 1024,2048,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,2048,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,2048,4096 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 1024,2048,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 1024,2048,4096 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 1024,2048,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,2048,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,2048,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 1024,2048,4096 float32 cutlass': 'E22 E22 E22 E23 E23 E22 E22 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 1024,2048,4096 float32 cusparselt': 'E24 E24 E24 E24 E24 E24 E24 E4 E4 E4 E25 16-bit',
    'ext_no_gpu 1024,2048,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 1024,2048,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 64,48,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 64,48,64 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 64,48,64 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 16-bit 16-bit',
    'ext_no_gpu 64,48,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 64,48,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 64,48,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 64,48,64 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 64,48,64 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 64,48,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 64,48,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 64,48,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 64,48,64 float32 cutlass': 'E26 E26 E26 E27 E27 E26 E26 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'ext_no_gpu 64,48,64 float32 cusparselt': 'E28 E28 E28 E28 E28 E28 E28 E4 E4 E4 E29 16-bit',
    'ext_no_gpu 64,48,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 64,48,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 96,64,40 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 96,64,40 bfloat16 cutlass': 'E30 E30 E30 E31 cutlass E30 E30 E32 E32 E32 E33 16-bit',
    'ext_no_gpu 96,64,40 bfloat16 cusparselt': 'E34 E34 E34 E34 cusparselt E34 E34 E4 E4 E4 E35 16-bit',
    'ext_no_gpu 96,64,40 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 96,64,40 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 96,64,40 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 96,64,40 float16 cutlass': 'E36 E36 E36 E37 cutlass E36 E36 E32 E32 E32 E33 16-bit',
    'ext_no_gpu 96,64,40 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 96,64,40 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 96,64,40 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 96,64,40 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 96,64,40 float32 cutlass': 'E38 E38 E38 E39 E40 E38 E38 E32 E32 E32 E33 16-bit',
    'ext_no_gpu 96,64,40 float32 cusparselt': 'E41 E41 E41 E41 E42 E41 E41 E4 E4 E4 E43 16-bit',
    'ext_no_gpu 96,64,40 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 96,64,40 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 100,64,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 100,64,64 bfloat16 cutlass': 'E44 E44 E44 E45 E45 E44 E44 E46 E46 E46 E46 16-bit',
    'ext_no_gpu 100,64,64 bfloat16 cusparselt': 'E47 E47 E47 E47 E47 E47 E47 E4 E4 E4 E47 16-bit',
    'ext_no_gpu 100,64,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 100,64,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 100,64,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 100,64,64 float16 cutlass': 'E48 E48 E48 E49 E49 E48 E48 E46 E46 E46 E46 16-bit',
    'ext_no_gpu 100,64,64 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'ext_no_gpu 100,64,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 100,64,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 100,64,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'ext_no_gpu 100,64,64 float32 cutlass': 'E50 E50 E50 E51 E51 E50 E50 E46 E46 E46 E46 16-bit',
    'ext_no_gpu 100,64,64 float32 cusparselt': 'E52 E52 E52 E52 E52 E52 E52 E4 E4 E4 E52 16-bit',
    'ext_no_gpu 100,64,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'ext_no_gpu 100,64,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu': '1 (0.8,-1) True False 1 (1.05,-1) True False 1 (0.8,-1) True False 1 (0.8,-1) True False 1 (1.05,-1) True False 1 (1.1,-1) True False 1 (1.1,-1) False False 1 (1.1,-1) False False',
    'gpu 4096,8192,1024 bfloat16 auto': 'cusparselt cusparselt cusparselt dense exact (cusparselt,cutlass) (cusparselt,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 4096,8192,1024 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 4096,8192,1024 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu 4096,8192,1024 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 4096,8192,1024 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 4096,8192,1024 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 4096,8192,1024 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 4096,8192,1024 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 4096,8192,1024 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 4096,8192,1024 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 4096,8192,1024 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 4096,8192,1024 float32 cutlass': 'E6 E6 E6 E7 E7 E6 E6 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 4096,8192,1024 float32 cusparselt': 'E8 E8 E8 E8 E8 E8 E8 E4 E4 E4 E9 16-bit',
    'gpu 4096,8192,1024 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 4096,8192,1024 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,8192,4096 bfloat16 auto': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cusparselt) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,8192,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,8192,4096 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu 1024,8192,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,8192,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,8192,4096 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 1024,8192,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,8192,4096 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 1024,8192,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,8192,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,8192,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 1024,8192,4096 float32 cutlass': 'E10 E10 E10 E11 E11 E10 E10 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,8192,4096 float32 cusparselt': 'E12 E12 E12 E12 E12 E12 E12 E4 E4 E4 E13 16-bit',
    'gpu 1024,8192,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,8192,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 2048,8192,512 bfloat16 auto': 'dense cusparselt cusparselt dense exact (dense,cutlass) (cusparselt,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 2048,8192,512 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 2048,8192,512 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu 2048,8192,512 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 2048,8192,512 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 2048,8192,512 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 2048,8192,512 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 2048,8192,512 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 2048,8192,512 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 2048,8192,512 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 2048,8192,512 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 2048,8192,512 float32 cutlass': 'E14 E14 E14 E15 E15 E14 E14 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 2048,8192,512 float32 cusparselt': 'E16 E16 E16 E16 E16 E16 E16 E4 E4 E4 E17 16-bit',
    'gpu 2048,8192,512 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 2048,8192,512 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 768,3072,2048 bfloat16 auto': 'dense cutlass cutlass dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 768,3072,2048 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 768,3072,2048 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu 768,3072,2048 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 768,3072,2048 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 768,3072,2048 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 768,3072,2048 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 768,3072,2048 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 768,3072,2048 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 768,3072,2048 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 768,3072,2048 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 768,3072,2048 float32 cutlass': 'E18 E18 E18 E19 E19 E18 E18 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 768,3072,2048 float32 cusparselt': 'E20 E20 E20 E20 E20 E20 E20 E4 E4 E4 E21 16-bit',
    'gpu 768,3072,2048 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 768,3072,2048 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,2048,4096 bfloat16 auto': 'dense cutlass dense cutlass cutlass (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 1024,2048,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,2048,4096 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu 1024,2048,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,2048,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,2048,4096 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 1024,2048,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,2048,4096 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 1024,2048,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,2048,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,2048,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 1024,2048,4096 float32 cutlass': 'E22 E22 E22 E23 E23 E22 E22 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 1024,2048,4096 float32 cusparselt': 'E24 E24 E24 E24 E24 E24 E24 E4 E4 E4 E25 16-bit',
    'gpu 1024,2048,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 1024,2048,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 64,48,64 bfloat16 auto': 'dense cutlass cutlass cusparselt cusparselt (dense,dense) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 64,48,64 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 64,48,64 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu 64,48,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 64,48,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 64,48,64 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 64,48,64 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 64,48,64 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 64,48,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 64,48,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 64,48,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu 64,48,64 float32 cutlass': 'E26 E26 E26 E27 E27 E26 E26 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu 64,48,64 float32 cusparselt': 'E28 E28 E28 E28 E28 E28 E28 E4 E4 E4 E29 16-bit',
    'gpu 64,48,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 64,48,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 96,64,40 bfloat16 auto': 'dense dense dense dense cutlass (dense,dense) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu 96,64,40 bfloat16 cutlass': 'E30 E30 E30 E31 cutlass E30 E30 E32 E32 E32 E33 16-bit',
    'gpu 96,64,40 bfloat16 cusparselt': 'E34 E34 E34 E34 cusparselt E34 E34 E4 E4 E4 E35 16-bit',
    'gpu 96,64,40 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 96,64,40 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 96,64,40 float16 auto': 'dense dense dense dense exact (dense,cutlass) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu 96,64,40 float16 cutlass': 'E36 E36 E36 E37 cutlass E36 E36 E32 E32 E32 E33 16-bit',
    'gpu 96,64,40 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 96,64,40 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 96,64,40 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 96,64,40 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu 96,64,40 float32 cutlass': 'E38 E38 E38 E39 E40 E38 E38 E32 E32 E32 E33 16-bit',
    'gpu 96,64,40 float32 cusparselt': 'E41 E41 E41 E41 E42 E41 E41 E4 E4 E4 E43 16-bit',
    'gpu 96,64,40 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 96,64,40 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 100,64,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu 100,64,64 bfloat16 cutlass': 'E44 E44 E44 E45 E45 E44 E44 E46 E46 E46 E46 16-bit',
    'gpu 100,64,64 bfloat16 cusparselt': 'E47 E47 E47 E47 E47 E47 E47 E4 E4 E4 E47 16-bit',
    'gpu 100,64,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 100,64,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 100,64,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu 100,64,64 float16 cutlass': 'E48 E48 E48 E49 E49 E48 E48 E46 E46 E46 E46 16-bit',
    'gpu 100,64,64 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu 100,64,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 100,64,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 100,64,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu 100,64,64 float32 cutlass': 'E50 E50 E50 E51 E51 E50 E50 E46 E46 E46 E46 16-bit',
    'gpu 100,64,64 float32 cusparselt': 'E52 E52 E52 E52 E52 E52 E52 E4 E4 E4 E52 16-bit',
    'gpu 100,64,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu 100,64,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt': '1 (0.8,-1) True False 1 (1.05,-1) True False 1 (0.8,-1) True False 1 (0.8,-1) True False 1 (1.05,-1) True False 1 (1.1,-1) True False 1 (1.1,-1) False False 1 (1.1,-1) False False',
    'gpu_no_lt 4096,8192,1024 bfloat16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 4096,8192,1024 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 4096,8192,1024 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 4096,8192,1024 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 4096,8192,1024 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 4096,8192,1024 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 4096,8192,1024 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 4096,8192,1024 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 4096,8192,1024 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 4096,8192,1024 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 4096,8192,1024 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 4096,8192,1024 float32 cutlass': 'E6 E6 E6 E7 E7 E6 E6 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 4096,8192,1024 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 4096,8192,1024 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 4096,8192,1024 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,8192,4096 bfloat16 auto': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,8192,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,8192,4096 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 1024,8192,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,8192,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,8192,4096 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 1024,8192,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,8192,4096 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 1024,8192,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,8192,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,8192,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 1024,8192,4096 float32 cutlass': 'E10 E10 E10 E11 E11 E10 E10 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,8192,4096 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 1024,8192,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,8192,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 2048,8192,512 bfloat16 auto': 'dense dense dense dense exact (dense,cutlass) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 2048,8192,512 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 2048,8192,512 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 2048,8192,512 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 2048,8192,512 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 2048,8192,512 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 2048,8192,512 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 2048,8192,512 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 2048,8192,512 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 2048,8192,512 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 2048,8192,512 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 2048,8192,512 float32 cutlass': 'E14 E14 E14 E15 E15 E14 E14 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 2048,8192,512 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 2048,8192,512 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 2048,8192,512 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 768,3072,2048 bfloat16 auto': 'dense cutlass cutlass dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 768,3072,2048 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 768,3072,2048 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 768,3072,2048 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 768,3072,2048 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 768,3072,2048 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 768,3072,2048 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 768,3072,2048 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 768,3072,2048 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 768,3072,2048 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 768,3072,2048 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 768,3072,2048 float32 cutlass': 'E18 E18 E18 E19 E19 E18 E18 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 768,3072,2048 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 768,3072,2048 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 768,3072,2048 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,2048,4096 bfloat16 auto': 'dense cutlass dense cutlass cutlass (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 1024,2048,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,2048,4096 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 1024,2048,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,2048,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,2048,4096 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 1024,2048,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,2048,4096 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 1024,2048,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,2048,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,2048,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 1024,2048,4096 float32 cutlass': 'E22 E22 E22 E23 E23 E22 E22 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 1024,2048,4096 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 1024,2048,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 1024,2048,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 64,48,64 bfloat16 auto': 'dense cutlass cutlass cutlass cutlass (dense,dense) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 64,48,64 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 64,48,64 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 64,48,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 64,48,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 64,48,64 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 64,48,64 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 64,48,64 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 64,48,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 64,48,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 64,48,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_no_lt 64,48,64 float32 cutlass': 'E26 E26 E26 E27 E27 E26 E26 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_no_lt 64,48,64 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 64,48,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 64,48,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 96,64,40 bfloat16 auto': 'dense dense dense dense cutlass (dense,dense) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu_no_lt 96,64,40 bfloat16 cutlass': 'E30 E30 E30 E31 cutlass E30 E30 E32 E32 E32 E33 16-bit',
    'gpu_no_lt 96,64,40 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 96,64,40 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 96,64,40 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 96,64,40 float16 auto': 'dense dense dense dense exact (dense,cutlass) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu_no_lt 96,64,40 float16 cutlass': 'E36 E36 E36 E37 cutlass E36 E36 E32 E32 E32 E33 16-bit',
    'gpu_no_lt 96,64,40 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 96,64,40 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 96,64,40 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 96,64,40 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu_no_lt 96,64,40 float32 cutlass': 'E38 E38 E38 E39 E40 E38 E38 E32 E32 E32 E33 16-bit',
    'gpu_no_lt 96,64,40 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 96,64,40 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 96,64,40 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 100,64,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_no_lt 100,64,64 bfloat16 cutlass': 'E44 E44 E44 E45 E45 E44 E44 E46 E46 E46 E46 16-bit',
    'gpu_no_lt 100,64,64 bfloat16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 100,64,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 100,64,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 100,64,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_no_lt 100,64,64 float16 cutlass': 'E48 E48 E48 E49 E49 E48 E48 E46 E46 E46 E46 16-bit',
    'gpu_no_lt 100,64,64 float16 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 100,64,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 100,64,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 100,64,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_no_lt 100,64,64 float32 cutlass': 'E50 E50 E50 E51 E51 E50 E50 E46 E46 E46 E46 16-bit',
    'gpu_no_lt 100,64,64 float32 cusparselt': 'E53 E53 E53 E53 E53 E53 E53 E4 E4 E4 E53 16-bit',
    'gpu_no_lt 100,64,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_no_lt 100,64,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10': '1 (0.8,-1) True False 1 (1.05,-1) True False 1 (0.8,-1) True False 1 (0.8,-1) True False 1 (1.05,-1) True False 1 (1.1,-1) True False 1 (1.1,-1) False False 1 (1.1,-1) False False',
    'gpu_lt_0.10 4096,8192,1024 bfloat16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 4096,8192,1024 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 4096,8192,1024 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu_lt_0.10 4096,8192,1024 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 4096,8192,1024 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float32 cutlass': 'E6 E6 E6 E7 E7 E6 E6 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float32 cusparselt': 'E8 E8 E8 E8 E8 E8 E8 E4 E4 E4 E9 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 4096,8192,1024 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,8192,4096 bfloat16 auto': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,8192,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,8192,4096 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu_lt_0.10 1024,8192,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,8192,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float32 cutlass': 'E10 E10 E10 E11 E11 E10 E10 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float32 cusparselt': 'E12 E12 E12 E12 E12 E12 E12 E4 E4 E4 E13 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,8192,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 2048,8192,512 bfloat16 auto': 'dense dense dense dense exact (dense,cutlass) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 2048,8192,512 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 2048,8192,512 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu_lt_0.10 2048,8192,512 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 2048,8192,512 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 2048,8192,512 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 2048,8192,512 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 2048,8192,512 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 2048,8192,512 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 2048,8192,512 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 2048,8192,512 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 2048,8192,512 float32 cutlass': 'E14 E14 E14 E15 E15 E14 E14 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 2048,8192,512 float32 cusparselt': 'E16 E16 E16 E16 E16 E16 E16 E4 E4 E4 E17 16-bit',
    'gpu_lt_0.10 2048,8192,512 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 2048,8192,512 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 768,3072,2048 bfloat16 auto': 'dense cutlass cutlass dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 768,3072,2048 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 768,3072,2048 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu_lt_0.10 768,3072,2048 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 768,3072,2048 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 768,3072,2048 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 768,3072,2048 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 768,3072,2048 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 768,3072,2048 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 768,3072,2048 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 768,3072,2048 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 768,3072,2048 float32 cutlass': 'E18 E18 E18 E19 E19 E18 E18 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 768,3072,2048 float32 cusparselt': 'E20 E20 E20 E20 E20 E20 E20 E4 E4 E4 E21 16-bit',
    'gpu_lt_0.10 768,3072,2048 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 768,3072,2048 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,2048,4096 bfloat16 auto': 'dense cutlass dense cutlass cutlass (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 1024,2048,4096 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,2048,4096 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu_lt_0.10 1024,2048,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,2048,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float32 cutlass': 'E22 E22 E22 E23 E23 E22 E22 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float32 cusparselt': 'E24 E24 E24 E24 E24 E24 E24 E4 E4 E4 E25 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 1024,2048,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 64,48,64 bfloat16 auto': 'dense cutlass cutlass cutlass cutlass (dense,dense) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 64,48,64 bfloat16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 64,48,64 bfloat16 cusparselt': 'cusparselt cusparselt cusparselt cusparselt cusparselt (cusparselt,cusparselt) (cusparselt,dense) E4 E4 E4 cutlass 16-bit',
    'gpu_lt_0.10 64,48,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 64,48,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 64,48,64 float16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 64,48,64 float16 cutlass': 'cutlass cutlass cutlass cutlass cutlass (cutlass,cutlass) (cutlass,dense) cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 64,48,64 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 64,48,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 64,48,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 64,48,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) cutlass (cutlass,cutlass) (cutlass,xla) 16-bit 16-bit',
    'gpu_lt_0.10 64,48,64 float32 cutlass': 'E26 E26 E26 E27 E27 E26 E26 cutlass (cutlass,cutlass) (cutlass,xla) cutlass 16-bit',
    'gpu_lt_0.10 64,48,64 float32 cusparselt': 'E28 E28 E28 E28 E28 E28 E28 E4 E4 E4 E29 16-bit',
    'gpu_lt_0.10 64,48,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 64,48,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 96,64,40 bfloat16 auto': 'dense dense dense dense cutlass (dense,dense) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu_lt_0.10 96,64,40 bfloat16 cutlass': 'E30 E30 E30 E31 cutlass E30 E30 E32 E32 E32 E33 16-bit',
    'gpu_lt_0.10 96,64,40 bfloat16 cusparselt': 'E34 E34 E34 E34 cusparselt E34 E34 E4 E4 E4 E35 16-bit',
    'gpu_lt_0.10 96,64,40 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 96,64,40 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 96,64,40 float16 auto': 'dense dense dense dense exact (dense,cutlass) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu_lt_0.10 96,64,40 float16 cutlass': 'E36 E36 E36 E37 cutlass E36 E36 E32 E32 E32 E33 16-bit',
    'gpu_lt_0.10 96,64,40 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 96,64,40 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 96,64,40 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 96,64,40 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,cutlass) (xla,xla) 16-bit 16-bit',
    'gpu_lt_0.10 96,64,40 float32 cutlass': 'E38 E38 E38 E39 E40 E38 E38 E32 E32 E32 E33 16-bit',
    'gpu_lt_0.10 96,64,40 float32 cusparselt': 'E41 E41 E41 E41 E42 E41 E41 E4 E4 E4 E43 16-bit',
    'gpu_lt_0.10 96,64,40 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 96,64,40 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 100,64,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_lt_0.10 100,64,64 bfloat16 cutlass': 'E44 E44 E44 E45 E45 E44 E44 E46 E46 E46 E46 16-bit',
    'gpu_lt_0.10 100,64,64 bfloat16 cusparselt': 'E47 E47 E47 E47 E47 E47 E47 E4 E4 E4 E47 16-bit',
    'gpu_lt_0.10 100,64,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 100,64,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 100,64,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_lt_0.10 100,64,64 float16 cutlass': 'E48 E48 E48 E49 E49 E48 E48 E46 E46 E46 E46 16-bit',
    'gpu_lt_0.10 100,64,64 float16 cusparselt': 'E5 E5 E5 E5 E5 E5 E5 E4 E4 E4 E5 16-bit',
    'gpu_lt_0.10 100,64,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 100,64,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 100,64,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_lt_0.10 100,64,64 float32 cutlass': 'E50 E50 E50 E51 E51 E50 E50 E46 E46 E46 E46 16-bit',
    'gpu_lt_0.10 100,64,64 float32 cusparselt': 'E52 E52 E52 E52 E52 E52 E52 E4 E4 E4 E52 16-bit',
    'gpu_lt_0.10 100,64,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_lt_0.10 100,64,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal': '1 (0.8,-1) True False 1 (1.05,-1) True False 1 (0.8,-1) True False 1 (0.8,-1) True False 1 (1.05,-1) True False 1 (1.1,-1) True False 1 (1.1,-1) False False 1 (1.1,-1) False False',
    'gpu_minimal 4096,8192,1024 bfloat16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 4096,8192,1024 bfloat16 cutlass': 'cutlass cutlass cutlass dense dense (cutlass,cutlass) (cutlass,dense) E54 E54 E54 E54 16-bit',
    'gpu_minimal 4096,8192,1024 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 4096,8192,1024 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 4096,8192,1024 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 4096,8192,1024 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 4096,8192,1024 float16 cutlass': 'E56 E56 E56 dense dense E56 E56 E54 E54 E54 E54 16-bit',
    'gpu_minimal 4096,8192,1024 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 4096,8192,1024 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 4096,8192,1024 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 4096,8192,1024 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 4096,8192,1024 float32 cutlass': 'E6 E6 E6 dense dense E6 E6 E54 E54 E54 E54 16-bit',
    'gpu_minimal 4096,8192,1024 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 4096,8192,1024 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 4096,8192,1024 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,8192,4096 bfloat16 auto': 'cutlass cutlass cutlass dense exact (cutlass,cutlass) (cutlass,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 1024,8192,4096 bfloat16 cutlass': 'cutlass cutlass cutlass dense dense (cutlass,cutlass) (cutlass,dense) E54 E54 E54 E54 16-bit',
    'gpu_minimal 1024,8192,4096 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 1024,8192,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,8192,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,8192,4096 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 1024,8192,4096 float16 cutlass': 'E57 E57 E57 dense dense E57 E57 E54 E54 E54 E54 16-bit',
    'gpu_minimal 1024,8192,4096 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 1024,8192,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,8192,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,8192,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 1024,8192,4096 float32 cutlass': 'E10 E10 E10 dense dense E10 E10 E54 E54 E54 E54 16-bit',
    'gpu_minimal 1024,8192,4096 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 1024,8192,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,8192,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 2048,8192,512 bfloat16 auto': 'dense dense dense dense exact (dense,cutlass) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 2048,8192,512 bfloat16 cutlass': 'cutlass cutlass cutlass dense dense (cutlass,cutlass) (cutlass,dense) E54 E54 E54 E54 16-bit',
    'gpu_minimal 2048,8192,512 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 2048,8192,512 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 2048,8192,512 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 2048,8192,512 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 2048,8192,512 float16 cutlass': 'E58 E58 E58 dense dense E58 E58 E54 E54 E54 E54 16-bit',
    'gpu_minimal 2048,8192,512 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 2048,8192,512 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 2048,8192,512 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 2048,8192,512 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 2048,8192,512 float32 cutlass': 'E14 E14 E14 dense dense E14 E14 E54 E54 E54 E54 16-bit',
    'gpu_minimal 2048,8192,512 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 2048,8192,512 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 2048,8192,512 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 768,3072,2048 bfloat16 auto': 'dense cutlass cutlass dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 768,3072,2048 bfloat16 cutlass': 'cutlass cutlass cutlass dense dense (cutlass,cutlass) (cutlass,dense) E54 E54 E54 E54 16-bit',
    'gpu_minimal 768,3072,2048 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 768,3072,2048 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 768,3072,2048 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 768,3072,2048 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 768,3072,2048 float16 cutlass': 'E59 E59 E59 dense dense E59 E59 E54 E54 E54 E54 16-bit',
    'gpu_minimal 768,3072,2048 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 768,3072,2048 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 768,3072,2048 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 768,3072,2048 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 768,3072,2048 float32 cutlass': 'E18 E18 E18 dense dense E18 E18 E54 E54 E54 E54 16-bit',
    'gpu_minimal 768,3072,2048 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 768,3072,2048 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 768,3072,2048 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,2048,4096 bfloat16 auto': 'dense cutlass dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 1024,2048,4096 bfloat16 cutlass': 'cutlass cutlass cutlass dense dense (cutlass,cutlass) (cutlass,dense) E54 E54 E54 E54 16-bit',
    'gpu_minimal 1024,2048,4096 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 1024,2048,4096 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,2048,4096 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,2048,4096 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 1024,2048,4096 float16 cutlass': 'E60 E60 E60 dense dense E60 E60 E54 E54 E54 E54 16-bit',
    'gpu_minimal 1024,2048,4096 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 1024,2048,4096 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,2048,4096 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,2048,4096 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 1024,2048,4096 float32 cutlass': 'E22 E22 E22 dense dense E22 E22 E54 E54 E54 E54 16-bit',
    'gpu_minimal 1024,2048,4096 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 1024,2048,4096 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 1024,2048,4096 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 64,48,64 bfloat16 auto': 'dense cutlass cutlass dense exact (dense,dense) (cutlass,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 64,48,64 bfloat16 cutlass': 'cutlass cutlass cutlass dense dense (cutlass,cutlass) (cutlass,dense) E54 E54 E54 E54 16-bit',
    'gpu_minimal 64,48,64 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 64,48,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 64,48,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 64,48,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 64,48,64 float16 cutlass': 'E61 E61 E61 dense dense E61 E61 E54 E54 E54 E54 16-bit',
    'gpu_minimal 64,48,64 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 64,48,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 64,48,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 64,48,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 64,48,64 float32 cutlass': 'E26 E26 E26 dense dense E26 E26 E54 E54 E54 E54 16-bit',
    'gpu_minimal 64,48,64 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 64,48,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 64,48,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 96,64,40 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 96,64,40 bfloat16 cutlass': 'E30 E30 E30 dense dense E30 E30 E54 E54 E54 E54 16-bit',
    'gpu_minimal 96,64,40 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 96,64,40 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 96,64,40 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 96,64,40 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 96,64,40 float16 cutlass': 'E36 E36 E36 dense dense E36 E36 E54 E54 E54 E54 16-bit',
    'gpu_minimal 96,64,40 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 96,64,40 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 96,64,40 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 96,64,40 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 96,64,40 float32 cutlass': 'E38 E38 E38 dense dense E38 E38 E54 E54 E54 E54 16-bit',
    'gpu_minimal 96,64,40 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 96,64,40 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 96,64,40 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 100,64,64 bfloat16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 100,64,64 bfloat16 cutlass': 'E44 E44 E44 dense dense E44 E44 E54 E54 E54 E54 16-bit',
    'gpu_minimal 100,64,64 bfloat16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 100,64,64 bfloat16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 100,64,64 bfloat16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 100,64,64 float16 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 100,64,64 float16 cutlass': 'E48 E48 E48 dense dense E48 E48 E54 E54 E54 E54 16-bit',
    'gpu_minimal 100,64,64 float16 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 100,64,64 float16 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 100,64,64 float16 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 100,64,64 float32 auto': 'dense dense dense dense exact (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) 16-bit 16-bit',
    'gpu_minimal 100,64,64 float32 cutlass': 'E50 E50 E50 dense dense E50 E50 E54 E54 E54 E54 16-bit',
    'gpu_minimal 100,64,64 float32 cusparselt': 'E55 E55 E55 E55 E55 E55 E55 E4 E4 E4 E55 16-bit',
    'gpu_minimal 100,64,64 float32 dense': 'dense dense dense dense dense (dense,dense) (dense,dense) xla (xla,xla) (xla,xla) mvue 16-bit',
    'gpu_minimal 100,64,64 float32 reference': 'reference reference reference reference reference (reference,reference) (reference,reference) xla (xla,xla) (xla,xla) mvue 16-bit',
}
