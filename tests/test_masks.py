"""The public API of jax_sparse24.masks and jax_sparse24.preparation, and nn's re-exports of it (CPU, fast)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import jax_sparse24 as s24
from jax_sparse24 import masks, preparation


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = s24.nn.Sparse24Dense(16, name="up")(x)
        x = s24.nn.Sparse24Dense(8, transposable=False, mask_every=3, name="down")(x)
        return nn.Dense(4, name="head")(x)


def _init():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8)), jnp.float32)
    v = _MLP().init(jax.random.key(0), x)
    return v["params"], v["sparsity"], x


def test_nn_exports_only_its_own_names():
    """The functions over the sparsity collection live in masks, the weight preparation in preparation:
    nn holds the layer and re-exports none of them."""
    assert s24.nn.__all__ == ["Sparse24Dense", "FP8_META", "METHODS", "MVUE_RNG"]
    for name in ("refresh_masks", "masks_for_params", "stack_layers", "kernel_flip_rate", "sparse_weights",
                 "SPARSITY", "prepare", "PREPARED"):
        assert not hasattr(s24.nn, name), name
    assert masks.SPARSITY == "sparsity"


def test_srste_layers_and_masks_for_params_by_phase():
    params, sparsity, _ = _init()
    layers = dict(masks.srste_layers(sparsity))
    assert sorted(layers) == [("down",), ("up",)]
    assert masks.TRANSPOSABLE_MASK in layers[("up",)] and masks.MASK in layers[("down",)]
    assert int(layers[("down",)][masks.MASK_EVERY]) == 3
    m = masks.masks_for_params(params, sparsity)
    assert m["head"]["kernel"] is None and m["up"]["bias"] is None
    np.testing.assert_array_equal(m["down"]["kernel"], layers[("down",)][masks.MASK])
    assert not bool(m["up"]["kernel"].all())
    dense = masks.masks_for_params(params, sparsity, sparse=False)
    assert bool(dense["up"]["kernel"].all()) and dense["head"]["kernel"] is None
    traced = jax.jit(lambda f: masks.masks_for_params(params, sparsity, sparse=f))
    np.testing.assert_array_equal(traced(jnp.asarray(True))["up"]["kernel"], m["up"]["kernel"])
    assert bool(traced(jnp.asarray(False))["up"]["kernel"].all())


def test_check_sparsity_names_the_owner_and_layer():
    params, sparsity, _ = _init()
    masks.check_sparsity(params, sparsity)
    with pytest.raises(ValueError, match="mine: .*'down'.*params has no 'down/kernel'"):
        masks.check_sparsity({k: v for k, v in params.items() if k != "down"}, sparsity, "mine")
    bad = jax.tree.map(lambda a: jnp.ones_like(a) if a.dtype == jnp.bool_ else a, sparsity)
    with pytest.raises(s24.MaskCheckError):
        masks.check_sparsity(params, bad)
    zero = {**sparsity, "down": {**sparsity["down"], masks.MASK_EVERY: jnp.asarray(0, jnp.int32)}}
    with pytest.raises(ValueError, match="mask_every=0"):
        masks.check_sparsity(params, zero)


def test_prune_to_masks_and_zero_pruned():
    params, sparsity, _ = _init()
    pruned, sparsity2, m = masks.prune_to_masks(params, sparsity)
    assert sparsity2 is sparsity
    np.testing.assert_array_equal(pruned["up"]["kernel"], jnp.where(m["up"]["kernel"], params["up"]["kernel"], 0.0))
    np.testing.assert_array_equal(pruned["head"]["kernel"], params["head"]["kernel"])
    # every params-shaped subtree of a container (an optimizer state's moments), the rest unchanged
    tree = {"mu": params, "count": jnp.asarray(3), "nu": params}
    out = masks.zero_pruned(tree, m)
    for k in ("mu", "nu"):
        jax.tree.map(np.testing.assert_array_equal, out[k], pruned)
    assert int(out["count"]) == 3
    with pytest.raises(ValueError, match="method and paths together"):
        masks.prune_to_masks(params, sparsity, method="ste")


def test_prepare_apply_equals_prepare_and_checks_its_arguments():
    params, sparsity, x = _init()
    variables = {"params": params, "sparsity": sparsity}
    a = preparation.prepare(_MLP(), variables, x)
    b = preparation.prepare_apply(_MLP().apply, variables, x)
    assert sorted(a) == ["down", "up"]
    jax.tree.map(np.testing.assert_array_equal, a, b)
    with pytest.raises(ValueError, match="mine: batch must be"):
        preparation.prepare_apply(_MLP().apply, variables, x, batch="yes", op="mine")
    with pytest.raises(ValueError, match="reuse"):
        preparation.prepare_apply(_MLP().apply, variables, x, reuse=0)
