"""A nanoGPT-style decoder in Flax linen with 2:4 sparse linear layers, GPT-2 or LLaMA style.

``arch="gpt"``: pre-LayerNorm blocks, causal multi-head self-attention, learned positional
embeddings, an FFN of GELU (``4·d``) or SwiGLU (gate and up projection fused into one matmul,
hidden ``8d/3`` rounded to 64), and an optionally weight-tied head.
``arch="llama"``: pre-RMSNorm blocks, rotary position embeddings on q and k (no learned
positions), SwiGLU FFN of ``ffn_hidden_size`` (LLaMA-1B: 5632, LLaMA-7B: 11008), no biases, an
untied head — the shapes of the LLaMA family (sizes ``llama-1b`` and ``llama-7b``). The FFN linears — and with
``sparse_attn=True`` the attention projections — are :class:`jax_sparse24.nn.Sparse24Dense`
with ``method`` chosen by the recipe; everything else (embeddings, head, LayerNorms) is dense.

The SwiGLU option is plain ``jnp`` (one fused ``d → 2h`` GEMM, then ``silu(a)·b``): XLA fuses the
gate into memory-bound passes at 0.81-0.84 of copy bandwidth on the H100, so a custom fused kernel
could gain at most ~3% of the FFN (measured by ``benchmarks/bench_gated_ffn.py``) and there is none.

Attention is ``jax.nn.dot_product_attention`` with ``GPTConfig.attention``: ``"cudnn"`` (flash
attention; GPU, bf16/fp16), ``"xla"``, or ``"auto"`` (cuDNN where it applies). On the H100 cuDNN
cuts the GPT-2 step's kernel time from 63 to 26 ms (a profiled train step).

Parameter tree (``layers="scan"``, the default: one stack ``h`` of all blocks)::

    wte/embedding, wpe/embedding, ln_f/{scale,bias}, [lm_head/kernel]
    h/ln_1, h/attn/{qkv,proj}/{kernel,bias}, h/ln_2, h/mlp/{fc,proj}/{kernel,bias}

every leaf under ``h`` with a leading layer axis of ``n_layer`` (``h/mlp/fc/kernel``: ``(n_layer, d,
hidden)``). The blocks run under ``nn.scan``: one block is traced and compiled for all of them (an
unrolled 32-layer srste model compiles every layer's 2:4 ops on their own), and the 2:4 state — masks,
prepared weights, fp8 scaling state — is stacked the same way, with a distinct MVUE key per layer.
``layers="unroll"``: one block ``h_<i>`` per layer (``h_<i>/attn/qkv/kernel`` of shape ``(d, 3d)``), as
before. :func:`convert_layout` converts params, collections, optimizer and train states between the
two. ``remat`` rematerialises each block in the backward pass (``jax.checkpoint``): ``"dots"`` keeps
the GEMM outputs (no batch dimensions; the 2:4 GEMMs' through :func:`jax_sparse24.checkpoint_policy`)
and recomputes the rest, ``"full"`` keeps only the block's
input.

(``arch="llama"``: no ``wpe``, RMSNorm ``{scale}`` only, no ``bias``, ``lm_head`` always.)

The ``"sparsity"`` collection mirrors the sparse layers' paths (masks / β).

With ``linear="lowrank"`` (the ``ast`` recipe of ``train_gpt.py``) the same sparse layers are
:class:`jax_sparse24.distill.Sparse24LowRankDense` instead, under the same names: a 2:4 mask
recomputed from the weight on every call (straight-through) plus AST's SLoRB low-rank term, so
those layers hold ``{kernel, bias, lora_b}`` and there is no ``"sparsity"`` collection. Every
other parameter has the same path and shape as in the dense model, so a dense checkpoint
initialises the student (:func:`jax_sparse24.distill.student_params_from_dense`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from jax_sparse24 import checkpoint_policy
from jax_sparse24.distill import Sparse24LowRankDense
from jax_sparse24.nn import FP8_META, Sparse24Dense
from jax_sparse24.masks import SPARSITY
from jax_sparse24.preparation import PREPARED

__all__ = ["GPTConfig", "GPT", "SIZES", "LAYERS", "REMAT", "attention_implementation", "block_names", "convert_layout",
           "rotary", "sparse_layer_paths", "student_params_from_teacher"]

#: GPTConfig.layers: the blocks as one nn.scan stack ("scan") or one module each ("unroll").
LAYERS = ("scan", "unroll")
#: GPTConfig.remat: rematerialisation of each block in the backward pass (jax.checkpoint policy).
REMAT = ("none", "dots", "full")
#: Name of the scanned stack of blocks in the parameter tree.
STACK = "h"


#: GPTConfig.fp8_dense: whose fp8 dense layer a dense fp8 model uses.
FP8_DENSE_IMPLS = ("sparse24", "flax")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Model hyper-parameters (hashable: usable as a static jit argument)."""

    vocab_size: int = 256
    block_size: int = 128  # max sequence length (learned positions; rotary: the longest sequence)
    arch: str = "gpt"  # "gpt" (LayerNorm, learned positions) | "llama" (RMSNorm, rotary positions)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    ffn: str = "gelu"  # "gelu" | "swiglu"
    ffn_hidden_size: Optional[int] = None  # hidden width of the FFN (None: 4d for gelu, 8d/3 for swiglu)
    rope_theta: float = 10000.0  # base of the rotary frequencies (arch="llama")
    tie_head: bool = True
    use_bias: bool = True
    # Sparsity: method of the sparse layers ("dense" = plain nn.Dense everywhere).
    method: str = "dense"  # "dense" | "srste" | "ste" | "soft"
    mvue: bool = False
    transposable: bool = True
    mask_every: int = 40
    sparse_attn: bool = False
    backend: str = "auto"
    # fp8: the forward and input-gradient GEMMs (and a sparse MVUE weight gradient) of the sparse
    # layers (FFN, and attention projections with sparse_attn) in float8_e4m3fn with current scaling (Sparse24Dense(fp8=True)); with
    # method="dense" the same layers are Sparse24Dense(method="dense", fp8=True): XLA's fp8 dense GEMMs.
    fp8: bool = False
    # fp8 scaling recipe of those layers: "current" or "delayed" (amax histories, Sparse24Dense(fp8_scaling=))
    fp8_scaling: str = "current"
    # Implementation of the fp8 dense layers (method="dense", fp8=True): "sparse24" (Sparse24Dense(
    # method="dense", fp8=True): e4m3 forward and input gradient, 16-bit weight gradient) or "flax"
    # (nn.Dense(dot_general_cls=Fp8DirectDotGeneralOp): Flax's fp8 layer, delayed scaling, all three
    # GEMMs in fp8 with e5m2 gradients; needs fp8_scaling="delayed", the recipe it implements).
    fp8_dense: str = "sparse24"
    # Class of the sparse layers: "sparse24" (Sparse24Dense with `method`) or "lowrank"
    # (AST: Sparse24LowRankDense, adaptive 2:4 mask + SLoRB term of rank in // slorb_group).
    linear: str = "sparse24"
    slorb_group: int = 64
    dtype: Any = jnp.float32  # compute dtype (params are float32)
    # Attention kernel: "xla" (XLA's fused softmax attention), "cudnn" (cuDNN flash attention:
    # GPU, float16/bfloat16 only) or "auto" (cuDNN where it applies, else XLA).
    attention: str = "xla"
    # The blocks: "scan" (one nn.scan stack "h", leaves with a leading layer axis; compiles one block)
    # or "unroll" (modules h_0 ... h_{n-1}). See convert_layout.
    layers: str = "scan"
    # Rematerialisation of each block: "none", "dots" (save the GEMM outputs), "full" (save nothing).
    remat: str = "none"

    def __post_init__(self):
        if self.layers not in LAYERS:
            raise ValueError(f"GPTConfig.layers must be one of {LAYERS}, got {self.layers!r}")
        if self.remat not in REMAT:
            raise ValueError(f"GPTConfig.remat must be one of {REMAT}, got {self.remat!r}")
        if self.fp8_dense not in FP8_DENSE_IMPLS:
            raise ValueError(f"GPTConfig.fp8_dense must be one of {FP8_DENSE_IMPLS}, got {self.fp8_dense!r}")
        if self.fp8_dense == "flax" and not (self.fp8 and self.method == "dense" and self.fp8_scaling == "delayed"):
            raise ValueError("GPTConfig: fp8_dense='flax' (Flax's delayed-scaling fp8 layer) needs method='dense', "
                             f"fp8=True and fp8_scaling='delayed', got method={self.method!r}, fp8={self.fp8}, "
                             f"fp8_scaling={self.fp8_scaling!r}")

    @property
    def ffn_hidden(self) -> int:
        if self.ffn_hidden_size is not None:
            return int(self.ffn_hidden_size)
        if self.ffn == "swiglu":
            return int(64 * math.ceil(8 * self.n_embd / 3 / 64))
        return 4 * self.n_embd


#: Size presets: the transformer body of GPT-2 small / medium (vocabulary is 256 bytes here, so
#: the parameter counts are those of GPT-2 minus most of the 50257-token embedding), and the
#: layer shapes of a 300M LLaMA-style model (d 1024, SwiGLU FFN 2816 = 8/3·d rounded up to 256,
#: 24 layers), LLaMA-1B (TinyLlama's: d 2048, FFN 5632, 16 layers) and LLaMA-7B (d 4096,
#: FFN 11008, 32 heads; 8 of its 32 layers by default so that parameters, AdamW state and the
#: activations of 16384 tokens fit one 80 GB GPU — ``--n-layer`` sets the depth).
_LLAMA = dict(arch="llama", ffn="swiglu", tie_head=False, use_bias=False)
SIZES = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024),
    "llama-tiny": dict(n_layer=2, n_head=4, n_embd=128, block_size=128, ffn_hidden_size=352, **_LLAMA),
    "llama-300m": dict(n_layer=24, n_head=16, n_embd=1024, block_size=2048, ffn_hidden_size=2816, **_LLAMA),
    "llama-1b": dict(n_layer=16, n_head=16, n_embd=2048, block_size=2048, ffn_hidden_size=5632, **_LLAMA),
    "llama-7b": dict(n_layer=8, n_head=32, n_embd=4096, block_size=2048, ffn_hidden_size=11008, **_LLAMA),
}


def block_names(cfg: GPTConfig) -> list[str]:
    """The blocks' module names: ``["h"]`` (one stack) with ``layers="scan"``, else ``h_0 ... h_{n-1}``."""
    return [STACK] if cfg.layers == "scan" else [f"h_{i}" for i in range(cfg.n_layer)]


def sparse_layer_paths(cfg: GPTConfig) -> list[tuple[str, ...]]:
    """Module paths (in ``params``) of the layers that are ``Sparse24Dense`` for this config (with
    ``layers="scan"`` one path per layer of the block, its kernel stacked ``(n_layer, in, out)``)."""
    if cfg.method == "dense":
        return []
    paths = []
    for block in block_names(cfg):
        if cfg.sparse_attn:
            paths += [(block, "attn", "qkv"), (block, "attn", "proj")]
        paths += [(block, "mlp", "fc"), (block, "mlp", "proj")]
    return paths


def convert_layout(tree, n_layer: int, to: str):
    """``tree`` (params, a variables dict, any collection, an optimizer or train state) converted
    between the block layouts of :attr:`GPTConfig.layers`: ``to="scan"`` stacks the blocks ``h_0 ...
    h_{n-1}`` into ``h`` (leading layer axis), ``to="unroll"`` splits ``h`` into them. The math is the
    same, so the converted tree computes the same function in a model of the other layout.

    Raises:
      ValueError: ``to`` unknown, or the tree not in the other layout (e.g. already converted).
    """
    from jax_sparse24.masks import stack_layers, unstack_layers

    names = [f"h_{i}" for i in range(n_layer)]
    if to == "scan":
        return stack_layers(tree, names, STACK)
    if to == "unroll":
        return unstack_layers(tree, STACK, names)
    raise ValueError(f"convert_layout: to must be one of {LAYERS}, got {to!r}")


def slorb_rank(cfg: GPTConfig, features_in: int) -> int:
    """Rank of the SLoRB term of a ``linear="lowrank"`` layer with ``features_in`` inputs.

    ``features_in // slorb_group`` (AST's group size ``k``); when the input size is not a
    multiple of the group size (tiny test models), groups of 4 channels (one 2:4 group).
    """
    k = cfg.slorb_group
    if k >= 1 and features_in % k == 0:
        return features_in // k
    return features_in // 4


def _linear(cfg: GPTConfig, features: int, name: str, sparse_layer: bool, std: float,
            features_in: int):
    init = nn.initializers.normal(std)
    if not sparse_layer or (cfg.method == "dense" and not cfg.fp8):
        return nn.Dense(features, use_bias=cfg.use_bias, dtype=cfg.dtype, kernel_init=init, name=name)
    if cfg.fp8_dense == "flax":  # GPTConfig checked method="dense", fp8=True, fp8_scaling="delayed"
        return nn.Dense(features, use_bias=cfg.use_bias, dtype=cfg.dtype, kernel_init=init, name=name,
                        dot_general_cls=nn.Fp8DirectDotGeneralOp)
    if cfg.linear == "lowrank":
        if cfg.fp8:
            raise ValueError("GPTConfig: fp8=True is not supported with linear='lowrank' (ast)")
        return Sparse24LowRankDense(
            features, rank=slorb_rank(cfg, features_in), use_bias=cfg.use_bias, dtype=cfg.dtype,
            kernel_init=init, name=name,
        )
    if cfg.linear != "sparse24":
        raise ValueError(f"GPTConfig.linear must be 'sparse24' or 'lowrank', got {cfg.linear!r}")
    return Sparse24Dense(
        features, use_bias=cfg.use_bias, dtype=cfg.dtype, kernel_init=init, method=cfg.method,
        mvue=cfg.mvue, transposable=cfg.transposable, mask_every=cfg.mask_every,
        backend=cfg.backend, fp8=cfg.fp8, fp8_scaling=cfg.fp8_scaling, name=name,
    )


def _call(layer, x, sparse):
    if isinstance(layer, Sparse24Dense):
        return layer(x, sparse=sparse)
    return layer(x)


def student_params_from_teacher(cfg: GPTConfig, student_params, teacher_params):
    """:func:`jax_sparse24.distill.student_params_from_dense` (the ``ast`` student initialised from a
    dense teacher of the same layout) for either block layout: the distillation works per ``(in, out)``
    kernel, so a scanned stack is split into its blocks and stacked again."""
    from jax_sparse24.distill import student_params_from_dense

    if cfg.layers != "scan":
        return student_params_from_dense(student_params, teacher_params)
    unroll = lambda t: convert_layout(t, cfg.n_layer, "unroll")  # noqa: E731
    return convert_layout(student_params_from_dense(unroll(student_params), unroll(teacher_params)), cfg.n_layer,
                          "scan")


class CausalSelfAttention(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x, sparse):
        cfg = self.cfg
        b, t, c = x.shape
        hd = c // cfg.n_head
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        qkv = _call(_linear(cfg, 3 * c, "qkv", cfg.sparse_attn, 0.02, c), x, sparse)
        # columns grouped per head (q|k|v of head 0, then of head 1, ...): a column shard of the
        # tensor-parallel qkv kernel holds whole heads, so nothing is resharded inside the layer
        qkv = qkv.reshape(b, t, cfg.n_head, 3, hd)
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        if cfg.arch == "llama":
            q, k = rotary(q, cfg.rope_theta), rotary(k, cfg.rope_theta)
        # the named scope marks attention's kernels in the compiled program (XLA's attention is plain
        # fusions and GEMMs; benchmarks/bench_step_breakdown.py counts them as attention)
        with jax.named_scope("attention"):
            y = jax.nn.dot_product_attention(
                q, k, v, is_causal=True, implementation=attention_implementation(cfg.attention, q.dtype, hd))
        y = y.reshape(b, t, c)
        return _call(_linear(cfg, c, "proj", cfg.sparse_attn, proj_std, c), y, sparse)


def rotary(x, theta: float = 10000.0):
    """Rotary position embedding of ``x (batch, tokens, heads, head_dim)`` (positions 0..tokens-1).

    Pairs feature ``j`` with ``j + head_dim/2`` (the "rotate half" form) and rotates each pair by
    ``position · theta^(-2j/head_dim)``; computed in float32, returned in ``x``'s dtype.

    >>> x = jnp.ones((1, 3, 1, 4))
    >>> bool(jnp.allclose(rotary(x)[:, 0], x[:, 0]))   # position 0 is not rotated
    True
    """
    t, hd = x.shape[1], x.shape[-1]
    if hd % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {hd}")
    freqs = theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    ang = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None]  # (t, hd/2)
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def _cudnn_head_dim_ok(hd: int) -> bool:
    """Head dimensions cuDNN's flash attention accepts: multiples of 8 up to 256."""
    return hd % 8 == 0 and hd <= 256


def attention_implementation(attention: str, dtype, head_dim: int) -> Optional[str]:
    """The ``implementation=`` of ``jax.nn.dot_product_attention`` for ``GPTConfig.attention``.

    ``"auto"`` picks cuDNN on a GPU for float16/bfloat16 and a supported head dimension, XLA
    otherwise; ``"cudnn"`` where cuDNN cannot run raises a ``ValueError`` naming the reason.

    >>> attention_implementation("auto", jnp.float32, 64)
    'xla'
    """
    if attention not in ("xla", "cudnn", "auto"):
        raise ValueError(f"GPTConfig.attention must be 'xla', 'cudnn' or 'auto', got {attention!r}")
    if attention == "xla":
        return "xla"
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
    gpu = jax.default_backend() == "gpu"
    if attention == "auto":
        return "cudnn" if (gpu and half and _cudnn_head_dim_ok(head_dim)) else "xla"
    if not gpu:
        raise ValueError("attention='cudnn' needs a GPU backend (use 'auto' or 'xla' on CPU)")
    if not half:
        raise ValueError(f"attention='cudnn' needs float16/bfloat16 compute, got {jnp.dtype(dtype).name}")
    if not _cudnn_head_dim_ok(head_dim):
        raise ValueError(f"attention='cudnn' needs a head dimension that is a multiple of 8 and <= 256, "
                         f"got {head_dim}")
    return "cudnn"


#: Vocabularies up to this size embed by a one-hot matmul (see :class:`OneHotEmbed`).
ONE_HOT_MAX_VOCAB = 4096


class OneHotEmbed(nn.Embed):
    """``nn.Embed`` (same parameter, same output) whose lookup is ``one_hot(idx) @ table``.

    Its gradient is then a GEMM instead of a scatter-add of every token's gradient into the table:
    with the 256-byte vocabulary, 16k tokens pile onto 256 rows, and on the H100 that scatter took
    14 ms of a 78 ms GPT-2 train step (``input_scatter_fusion`` in its profile). For small vocabularies
    only: the one-hot array is tokens × vocab.
    """

    def __call__(self, inputs):
        if not jnp.issubdtype(jnp.asarray(inputs).dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        table = self.embedding.astype(self.dtype) if self.dtype is not None else self.embedding
        return jax.nn.one_hot(inputs, self.num_embeddings, dtype=table.dtype) @ table


class MLP(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x, sparse):
        cfg = self.cfg
        h = cfg.ffn_hidden
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        if cfg.ffn == "swiglu":
            ab = _call(_linear(cfg, 2 * h, "fc", True, 0.02, cfg.n_embd), x, sparse)
            # gate and up columns interleaved (a0 g0 a1 g1 ...): a column shard holds matching pairs
            ab = ab.reshape(*ab.shape[:-1], h, 2)
            a, g = ab[..., 0], ab[..., 1]
            y = nn.silu(a) * g
        elif cfg.ffn == "gelu":
            y = nn.gelu(_call(_linear(cfg, h, "fc", True, 0.02, cfg.n_embd), x, sparse), approximate=True)
        else:
            raise ValueError(f"GPTConfig.ffn must be 'gelu' or 'swiglu', got {cfg.ffn!r}")
        return _call(_linear(cfg, cfg.n_embd, "proj", True, proj_std, h), y, sparse)


def _norm(cfg: GPTConfig, name: str):
    if cfg.arch == "llama":
        return nn.RMSNorm(epsilon=1e-5, dtype=cfg.dtype, name=name)
    return nn.LayerNorm(epsilon=1e-5, dtype=cfg.dtype, name=name)


class Block(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x, sparse):
        ln = lambda name: _norm(self.cfg, name)  # noqa: E731
        x = x + CausalSelfAttention(self.cfg, name="attn")(ln("ln_1")(x), sparse)
        x = x + MLP(self.cfg, name="mlp")(ln("ln_2")(x), sparse)
        return x


class _ScanBlock(Block):
    """A block as the body of ``nn.scan``: ``(carry, sparse) -> (carry, None)``."""

    def __call__(self, x, sparse):
        return super().__call__(x, sparse), None


#: The collections a scanned stack keeps per layer (stacked along axis 0): params, the 2:4 state,
#: prepared weights, the delayed-scaling fp8 state (both Sparse24Dense's and Flax's fp8 layer's).
_SCANNED_COLLECTIONS = ("params", SPARSITY, PREPARED, FP8_META)


def _remat_policy(remat: str):
    # "dots": every GEMM output kept, the 2:4 layers' too (their GPU GEMMs are custom calls, which JAX's own
    # dots policy would recompute in the backward pass)
    return {"dots": checkpoint_policy("dots"), "full": None}[remat]


def _remat(module, cfg: GPTConfig, sparse, **kw):
    """``module`` rematerialised per ``cfg.remat``. A Python ``sparse`` flag stays static (``static_argnums``):
    ``nn.remat`` traces its arguments, and a traced flag turns every 2:4 layer into a ``lax.cond`` between its
    sparse and dense computations, both traced and compiled into the step (and partially evaluated, with the
    residuals of both branches, under the remat policy)."""
    static = (2,) if sparse is None or isinstance(sparse, bool) else ()  # (self, x, sparse)
    return nn.remat(module, policy=_remat_policy(cfg.remat), static_argnums=static, **kw)


def _blocks(cfg: GPTConfig, x, sparse):
    """All blocks over ``x``: one ``nn.scan`` stack, or one module per layer."""
    if cfg.layers == "scan":
        body = _ScanBlock
        if cfg.remat != "none":
            body = _remat(body, cfg, sparse, prevent_cse=False)
        stack = nn.scan(body, length=cfg.n_layer, in_axes=(nn.broadcast,),
                        variable_axes={c: 0 for c in _SCANNED_COLLECTIONS},
                        split_rngs={"params": True, "mvue": True, "dropout": True})
        return stack(cfg, name=STACK)(x, sparse)[0]
    block = Block
    if cfg.remat != "none":
        block = _remat(Block, cfg, sparse)
    for name in block_names(cfg):
        x = block(cfg, name=name)(x, sparse)
    return x


class GPT(nn.Module):
    """Decoder-only transformer over byte tokens; returns float32 logits ``(B, T, vocab)``.

    ``sparse`` is passed to every ``Sparse24Dense``: ``None`` (sparse unless the method is
    ``"dense"``), a Python bool, or a traced scalar bool (dense fine-tune / STEP phase).

    >>> cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, method="srste")
    >>> v = GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    >>> sorted(v)
    ['params', 'sparsity']
    """

    cfg: GPTConfig

    @nn.compact
    def __call__(self, idx, *, sparse: Optional[Any] = None):
        cfg = self.cfg
        if cfg.arch not in ("gpt", "llama"):
            raise ValueError(f"GPTConfig.arch must be 'gpt' or 'llama', got {cfg.arch!r}")
        b, t = idx.shape
        if t > cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {cfg.block_size}")
        embed = OneHotEmbed if cfg.vocab_size <= ONE_HOT_MAX_VOCAB else nn.Embed
        wte = embed(cfg.vocab_size, cfg.n_embd, embedding_init=nn.initializers.normal(0.02),
                    dtype=cfg.dtype, name="wte")
        x = wte(idx)
        if cfg.arch == "gpt":
            wpe = nn.Embed(cfg.block_size, cfg.n_embd, embedding_init=nn.initializers.normal(0.02),
                           dtype=cfg.dtype, name="wpe")
            # Positions 0..t-1 are a slice of the table (its gradient a pad, not a scatter-add).
            x = x + wpe.embedding[:t].astype(cfg.dtype)[None]
        x = _blocks(cfg, x, sparse)
        x = _norm(cfg, "ln_f")(x)
        if cfg.tie_head:
            logits = wte.attend(x)
        else:
            logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.dtype,
                              kernel_init=nn.initializers.normal(0.02), name="lm_head")(x)
        return logits.astype(jnp.float32)
