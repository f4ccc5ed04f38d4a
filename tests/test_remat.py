"""checkpoint_policy: a rematerialised sparse24_linear keeps its output like a dense GEMM's."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse24 as s24


def _block(x, w, mask):
    h = s24.sparse24_linear(x, w, mask)
    return jnp.sum(jnp.tanh(h) ** 2)


def _inputs():
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (4, 16, 32), jnp.float32)
    w = jax.random.normal(kw, (32, 48), jnp.float32)
    return x, w, s24.mask24(w, axis=0)


def _count_prims(jaxpr, names) -> dict:
    out = dict.fromkeys(names, 0)

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name in out:
                out[eqn.primitive.name] += 1
        for sub in jax.extend.core.subjaxprs(j):
            walk(sub)

    walk(jaxpr)
    return out


def _count_dots(jaxpr) -> int:
    return _count_prims(jaxpr, ("dot_general",))["dot_general"]


def _grad_jaxpr(policy):
    x, w, mask = _inputs()
    f = jax.checkpoint(_block, policy=policy)
    return jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, w, mask).jaxpr


def test_policy_keeps_the_sparse_output_instead_of_recomputing_the_forward_gemm():
    # forward, input gradient, weight gradient: three GEMMs; a recomputed forward makes four
    recomputed = _count_dots(_grad_jaxpr(jax.checkpoint_policies.nothing_saveable))
    kept = _count_dots(_grad_jaxpr(s24.checkpoint_policy("nothing")))
    assert (recomputed, kept) == (4, 3)


def test_saved_residual_is_the_named_output(capsys):
    x, w, mask = _inputs()
    jax.ad_checkpoint.print_saved_residuals(jax.checkpoint(_block, policy=s24.checkpoint_policy("nothing")), x, w, mask)
    saved = capsys.readouterr().out
    assert f"named '{s24.CHECKPOINT_NAME}'" in saved


@pytest.mark.parametrize("base", ["dots", "dots_with_batch_dims", "nothing", jax.checkpoint_policies.everything_saveable])
def test_gradients_match_without_remat(base):
    x, w, mask = _inputs()
    want = jax.jit(jax.grad(_block, argnums=(0, 1)))(x, w, mask)
    got = jax.jit(jax.grad(jax.checkpoint(_block, policy=s24.checkpoint_policy(base)), argnums=(0, 1)))(x, w, mask)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_unknown_base_is_an_error():
    with pytest.raises(ValueError, match="checkpoint_policy: base must be one of"):
        s24.checkpoint_policy("dot")


def _gpt_model():
    import sys
    from pathlib import Path

    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / p) for p in ("benchmarks/harness", "examples")]
    import gpt_model
    import model

    return gpt_model, model


@pytest.mark.parametrize("layers", ["scan", "unroll"])
def test_example_model_rematerialises_its_2to4_layers_as_the_dense_model(layers):
    """The example's blocks under ``remat``: a Python ``sparse`` flag stays static. Traced (``nn.remat`` traces
    its arguments), every 2:4 layer became a ``lax.cond`` between its sparse and dense computations, both
    compiled into the step. So: no conditional, and each remat mode adds to the 2:4 model's GEMMs exactly what
    it adds to the dense model's. (That the compiled GPU step runs no GEMM twice: scripts/probe_remat_hlo.py.)"""
    import dataclasses

    gm, ex = _gpt_model()
    base = gm.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, sparse_attn=True, layers=layers,
                        arch="llama", ffn="swiglu")
    idx = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)

    def counts(method, remat):
        cfg = dataclasses.replace(base, method=method, mvue=method != "dense", remat=remat)
        model = ex.GPT(cfg)
        v = jax.jit(model.init)(jax.random.key(0), idx)

        def loss(p):
            logits = model.apply({**v, "params": p}, idx[:, :-1], sparse=None if method == "dense" else True,
                                 rngs={"mvue": jax.random.key(2)})
            return logits.mean()

        jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(v["params"]).jaxpr
        return _count_prims(jaxpr, ("dot_general", "cond"))

    for remat in ("dots", "full"):
        sparse, sparse0 = counts("srste", remat), counts("srste", "none")
        dense, dense0 = counts("dense", remat), counts("dense", "none")
        assert sparse["cond"] == 0, remat
        assert sparse["dot_general"] - sparse0["dot_general"] == dense["dot_general"] - dense0["dot_general"], remat


def _branch_prims(jaxpr):
    """{platforms of each branch: primitive names in it} of the ``lax.platform_dependent`` conditionals."""
    out = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond" and "branches_platforms" in eqn.params:
            for plats, br in zip(eqn.params["branches_platforms"], eqn.params["branches"]):
                out[plats] = {e.primitive.name for e in br.jaxpr.eqns}
    return out


def test_layer_gemm_results_pass_an_optimization_barrier(monkeypatch):
    """The CUDA results of the GEMMs a layer returns (forward, input gradient) pass ``lax.optimization_barrier``:
    without it XLA's GPU dynamic-slice fusion cloned a 2:4 GEMM into the dynamic-update-slice that stacks a
    scan's saved residuals, so under a remat policy that keeps the output the kernel ran twice (LLaMA-7B: 15
    sparse GEMMs per layer instead of 12). The reference branch and the calls without ``barrier`` have none (a
    scanned weight gradient keeps its fusion into the stacked buffer). Traced on the CPU with the kernels'
    availability stubbed and a stand-in kernel."""
    from jax_sparse24._src import ffi, gemm

    x2 = jnp.ones((16, 32), jnp.float32)
    w = jnp.ones((32, 8), jnp.float32)
    mask = s24.mask24(w, axis=0)
    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)

    class StandIn:  # a sparse backend whose "kernel" is the dense math
        def weight_gemm(self, **kw):
            return lambda b2, wc, mk: b2 @ (wc * mk)

    jaxpr = jax.make_jaxpr(lambda x2, w, mask: gemm._weight_gemm(
        StandIn(), x2, w, mask, lambda a, b: a @ b, m=8, n=16, k=32, transposed=True, dtype=jnp.float32))(x2, w, mask)
    branches = _branch_prims(jaxpr.jaxpr)
    assert "optimization_barrier" in branches[("cuda",)] and "optimization_barrier" not in branches[None], branches
    plain = jax.make_jaxpr(lambda a: ffi.per_platform(lambda a: a * 2, lambda a: a * 3, a))(x2)
    assert all("optimization_barrier" not in p for p in _branch_prims(plain.jaxpr).values())
