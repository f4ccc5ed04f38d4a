"""The harness's model: the example's (``examples/model.py``) with two more kinds of linear layer, and layout
conversions.

:class:`GPTConfig` adds to :class:`model.GPTConfig`:

* ``fp8_dense="flax"``: the fp8 dense baseline as Flax writes it (``nn.Dense(dot_general_cls=
  Fp8DirectDotGeneralOp)``: all three GEMMs in fp8, e5m2 gradients, delayed scaling) in place of the 2:4
  layers, with ``method="dense"``, ``fp8=True``, ``fp8_scaling="delayed"``;
* ``linear="lowrank"`` (the ``ast`` recipe of ``train_gpt.py``): the same layers are
  :class:`jax_sparse24.distill.Sparse24LowRankDense` under the same names (a 2:4 mask recomputed from the
  weight on every call plus AST's SLoRB low-rank term: ``{kernel, bias, lora_b}``, no ``"sparsity"``
  collection), so a dense checkpoint initialises the student (:func:`student_params_from_teacher`).

Every other parameter has the example's path and shape. :func:`convert_layout` converts params,
collections, optimizer and train states between the block layouts of ``GPTConfig.layers``.
"""

from __future__ import annotations

import dataclasses

from flax import linen as nn

import model
from jax_sparse24.distill import Sparse24LowRankDense, student_params_from_dense
from jax_sparse24.masks import stack_layers, unstack_layers

#: GPTConfig.fp8_dense: whose fp8 dense layer a dense fp8 model uses
FP8_DENSE_IMPLS = ("sparse24", "flax")
#: GPTConfig.linear: the class of the 2:4 layers
LINEARS = ("sparse24", "lowrank")


@dataclasses.dataclass(frozen=True)
class GPTConfig(model.GPTConfig):
    """:class:`model.GPTConfig` plus the harness's layers (see the module docstring)."""

    fp8_dense: str = "sparse24"
    linear: str = "sparse24"
    slorb_group: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.fp8_dense not in FP8_DENSE_IMPLS:
            raise ValueError(f"GPTConfig.fp8_dense must be one of {FP8_DENSE_IMPLS}, got {self.fp8_dense!r}")
        if self.fp8_dense == "flax" and not (self.fp8 and self.method == "dense" and self.fp8_scaling == "delayed"):
            raise ValueError("GPTConfig: fp8_dense='flax' (Flax's delayed-scaling fp8 layer) needs method='dense', "
                             f"fp8=True and fp8_scaling='delayed', got method={self.method!r}, fp8={self.fp8}, "
                             f"fp8_scaling={self.fp8_scaling!r}")
        if self.linear not in LINEARS:
            raise ValueError(f"GPTConfig.linear must be one of {LINEARS}, got {self.linear!r}")
        if self.linear == "lowrank" and self.fp8:
            raise ValueError("GPTConfig: fp8=True is not supported with linear='lowrank' (ast)")

    def make_linear(self, features: int, name: str, sparse_layer: bool, std: float, features_in: int) -> nn.Module:
        if sparse_layer and self.fp8_dense == "flax":
            return nn.Dense(features, use_bias=self.use_bias, dtype=self.dtype, name=name,
                            kernel_init=nn.initializers.normal(std), dot_general_cls=nn.Fp8DirectDotGeneralOp)
        if sparse_layer and self.linear == "lowrank" and self.method != "dense":
            return Sparse24LowRankDense(features, rank=slorb_rank(self, features_in), use_bias=self.use_bias,
                                        dtype=self.dtype, kernel_init=nn.initializers.normal(std), name=name)
        return super().make_linear(features, name, sparse_layer, std, features_in)


def slorb_rank(cfg: GPTConfig, features_in: int) -> int:
    """Rank of the SLoRB term of a ``linear="lowrank"`` layer with ``features_in`` inputs: ``features_in //
    slorb_group`` (AST's group size); when the input size is not a multiple of it (tiny test models), groups
    of 4 channels (one 2:4 group)."""
    k = cfg.slorb_group
    return features_in // k if k >= 1 and features_in % k == 0 else features_in // 4


def convert_layout(tree, n_layer: int, to: str):
    """``tree`` (params, a variables dict, any collection, an optimizer or train state) converted between the
    block layouts: ``to="scan"`` stacks the blocks ``h_0 ... h_{n-1}`` into ``h`` (leading layer axis),
    ``to="unroll"`` splits ``h`` into them. The converted tree computes the same function in a model of the
    other layout. ``ValueError``: ``to`` unknown, or the tree not in the other layout."""
    names = [f"h_{i}" for i in range(n_layer)]
    if to == "scan":
        return stack_layers(tree, names, model.STACK)
    if to == "unroll":
        return unstack_layers(tree, model.STACK, names)
    raise ValueError(f"convert_layout: to must be one of {model.LAYERS}, got {to!r}")


def student_params_from_teacher(cfg: GPTConfig, student_params, teacher_params):
    """:func:`jax_sparse24.distill.student_params_from_dense` (the ``ast`` student initialised from a dense
    teacher of the same layout) for either block layout: it works per ``(in, out)`` kernel, so a scanned
    stack is split into its blocks and stacked again."""
    if cfg.layers != "scan":
        return student_params_from_dense(student_params, teacher_params)
    unroll = lambda t: convert_layout(t, cfg.n_layer, "unroll")  # noqa: E731
    return convert_layout(student_params_from_dense(unroll(student_params), unroll(teacher_params)), cfg.n_layer,
                          "scan")
