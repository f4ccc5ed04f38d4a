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


def _count_dots(jaxpr) -> int:
    n = sum(eqn.primitive.name == "dot_general" for eqn in jaxpr.eqns)
    return n + sum(_count_dots(sub) for sub in jax.extend.core.subjaxprs(jaxpr))


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
