"""A GPT-2 or LLaMA-style decoder in Flax Linen whose linear layers are 2:4 sparse (``Sparse24Dense``).

``arch="gpt"``: pre-LayerNorm blocks, learned positions, a GELU or SwiGLU FFN, a tied head. ``arch="llama"``:
pre-RMSNorm blocks, rotary positions, a SwiGLU FFN, no biases, an untied head. The FFN linears (with
``sparse_attn=True`` the attention projections too) are :class:`jax_sparse24.nn.Sparse24Dense`; embeddings, head
and norms stay dense. The blocks are one ``nn.scan`` stack ``h`` (``layers="scan"``: a leading layer axis on its
leaves) or ``h_0 ... h_{n-1}``; the ``"sparsity"`` collection (the 2:4 masks) mirrors the sparse layers' paths.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from jax_sparse24 import checkpoint_policy
from jax_sparse24.masks import SPARSITY
from jax_sparse24.nn import FP8_META, Sparse24Dense
from jax_sparse24.preparation import PREPARED

#: GPTConfig.layers / .remat / .attention: the accepted values
LAYERS, REMAT, ATTENTION = ("scan", "unroll"), ("none", "dots", "full"), ("xla", "cudnn", "auto")
#: the name of the scanned stack of blocks in the parameter tree
STACK = "h"
#: vocabularies up to this size embed by a one-hot matmul (:class:`OneHotEmbed`)
ONE_HOT_MAX_VOCAB = 4096


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Model hyper-parameters (frozen, hashable)."""

    vocab_size: int = 256
    block_size: int = 128  # the longest sequence
    arch: str = "gpt"  # "gpt" | "llama"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    ffn: str = "gelu"  # "gelu" | "swiglu"
    ffn_hidden_size: Optional[int] = None  # None: 4d (gelu), 8d/3 rounded up to 64 (swiglu)
    rope_theta: float = 10000.0
    tie_head: bool = True
    use_bias: bool = True
    method: str = "dense"  # of the 2:4 layers: "dense" | "srste" | "soft" | "ste"
    mvue: bool = False  # the MVUE weight gradient (a "mvue" RNG stream)
    transposable: bool = True  # srste: transposable masks (the input gradient runs 2:4 too)
    mask_every: int = 40  # srste: steps between mask refreshes
    sparse_attn: bool = False  # the attention projections 2:4 too
    backend: str = "auto"  # the GEMM kernels of the 2:4 layers (jax_sparse24.BACKENDS)
    fp8: bool = False  # the 2:4 layers' forward and input-gradient GEMMs in float8_e4m3fn
    fp8_scaling: str = "current"  # "current" | "delayed" (amax histories in the "fp8_meta" collection)
    dtype: Any = jnp.float32  # compute dtype (params are float32)
    attention: str = "xla"  # "xla" | "cudnn" (flash attention: GPU, 16-bit) | "auto" (cuDNN where it applies)
    layers: str = "scan"
    remat: str = "none"

    def __post_init__(self):
        for field, allowed in (("arch", ("gpt", "llama")), ("ffn", ("gelu", "swiglu")), ("layers", LAYERS),
                               ("remat", REMAT), ("attention", ATTENTION)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"GPTConfig.{field} must be one of {allowed}, got {getattr(self, field)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")

    @property
    def ffn_hidden(self) -> int:
        if self.ffn_hidden_size is not None:
            return int(self.ffn_hidden_size)
        return 64 * math.ceil(8 * self.n_embd / 3 / 64) if self.ffn == "swiglu" else 4 * self.n_embd

    def make_linear(self, features: int, name: str, sparse_layer: bool, std: float, features_in: int) -> nn.Module:
        """``Sparse24Dense`` where ``sparse_layer`` and the method is not dense (or fp8), else ``nn.Dense``."""
        init = nn.initializers.normal(std)
        if not sparse_layer or (self.method == "dense" and not self.fp8):
            return nn.Dense(features, use_bias=self.use_bias, dtype=self.dtype, kernel_init=init, name=name)
        return Sparse24Dense(features, use_bias=self.use_bias, dtype=self.dtype, kernel_init=init, name=name,
                             method=self.method, mvue=self.mvue, transposable=self.transposable, backend=self.backend,
                             mask_every=self.mask_every, fp8=self.fp8, fp8_scaling=self.fp8_scaling)


#: size presets (vocabulary: 256 bytes, or the tokenizer's). llama-7b: 8 of its 32 layers by default, so
#: that parameters, AdamW state and 16,384 tokens of activations fit one 80 GB GPU (--n-layer sets the depth)
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
    """Module paths (in ``params``) of the 2:4 layers (a scanned stack: one path, kernel ``(L, in, out)``)."""
    if cfg.method == "dense":
        return []
    names = (("attn", "qkv"), ("attn", "proj")) if cfg.sparse_attn else ()
    return [(b, *n) for b in block_names(cfg) for n in (*names, ("mlp", "fc"), ("mlp", "proj"))]


def attention_implementation(attention: str, dtype, head_dim: int) -> str:
    """``implementation=`` of ``jax.nn.dot_product_attention``: ``"auto"`` is cuDNN where it runs, else XLA;
    ``"cudnn"`` where cuDNN cannot run raises ``ValueError`` naming why."""
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    why = [why for bad, why in (
        (jax.default_backend() != "gpu", "a GPU backend (use 'auto' or 'xla' on CPU)"),
        (jnp.dtype(dtype) not in (jnp.float16, jnp.bfloat16), f"float16/bfloat16 compute, got {jnp.dtype(dtype)}"),
        (head_dim % 8 or head_dim > 256, f"a head dimension that is a multiple of 8 and <= 256, got {head_dim}"),
    ) if bad]
    if attention == "xla" or (attention == "auto" and why):
        return "xla"
    if why:
        raise ValueError(f"attention='cudnn' needs {why[0]}")
    return "cudnn"


def rotary(x, theta: float = 10000.0):
    """Rotary embedding of ``x (batch, tokens, heads, head_dim)``: features ``j`` and ``j + head_dim/2`` rotated
    by ``position * theta^(-2j/head_dim)`` (in float32)."""
    t, hd = x.shape[1], x.shape[-1]
    if hd % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {hd}")
    freqs = theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    ang = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None]
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def _call(layer, x, sparse):
    """``layer(x)``, passing ``sparse`` (a dense phase of a 2:4 recipe) to the 2:4 layers."""
    return layer(x, sparse=sparse) if isinstance(layer, Sparse24Dense) else layer(x)


class OneHotEmbed(nn.Embed):
    """``nn.Embed`` looked up as ``one_hot(idx) @ table``: its gradient is a GEMM, not a slow scatter-add of every
    token into a few rows. For small vocabularies only: the one-hot array is tokens x vocabulary."""

    def __call__(self, inputs):
        if not jnp.issubdtype(jnp.asarray(inputs).dtype, jnp.integer):
            raise ValueError(f"OneHotEmbed: the tokens must be integers, got {jnp.asarray(inputs).dtype}")
        table = self.embedding.astype(self.dtype) if self.dtype is not None else self.embedding
        return jax.nn.one_hot(inputs, self.num_embeddings, dtype=table.dtype) @ table


class CausalSelfAttention(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x, sparse):
        cfg = self.cfg
        b, t, c = x.shape
        hd = c // cfg.n_head
        qkv = _call(cfg.make_linear(3 * c, "qkv", cfg.sparse_attn, 0.02, c), x, sparse)
        qkv = qkv.reshape(b, t, cfg.n_head, 3, hd)  # q|k|v of head 0, then of head 1, ...
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        if cfg.arch == "llama":
            q, k = rotary(q, cfg.rope_theta), rotary(k, cfg.rope_theta)
        with jax.named_scope("attention"):  # marks attention's kernels in the compiled program
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                             implementation=attention_implementation(cfg.attention, q.dtype, hd))
        proj = cfg.make_linear(c, "proj", cfg.sparse_attn, 0.02 / math.sqrt(2 * cfg.n_layer), c)
        return _call(proj, y.reshape(b, t, c), sparse)


class MLP(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x, sparse):
        cfg, h = self.cfg, self.cfg.ffn_hidden
        if cfg.ffn == "swiglu":  # one fused d -> 2h GEMM, gate and up columns interleaved (a0 g0 a1 g1 ...)
            ab = _call(cfg.make_linear(2 * h, "fc", True, 0.02, cfg.n_embd), x, sparse)
            ab = ab.reshape(*ab.shape[:-1], h, 2)
            y = nn.silu(ab[..., 0]) * ab[..., 1]
        else:
            y = nn.gelu(_call(cfg.make_linear(h, "fc", True, 0.02, cfg.n_embd), x, sparse), approximate=True)
        return _call(cfg.make_linear(cfg.n_embd, "proj", True, 0.02 / math.sqrt(2 * cfg.n_layer), h), y, sparse)


def _norm(cfg: GPTConfig, name: str) -> nn.Module:
    norm = nn.RMSNorm if cfg.arch == "llama" else nn.LayerNorm
    return norm(epsilon=1e-5, dtype=cfg.dtype, name=name)


class Block(nn.Module):
    """A transformer block: ``(x, sparse) -> (x, None)``, the signature of an ``nn.scan`` body."""

    cfg: GPTConfig

    @nn.compact
    def __call__(self, x, sparse):
        x = x + CausalSelfAttention(self.cfg, name="attn")(_norm(self.cfg, "ln_1")(x), sparse)
        return x + MLP(self.cfg, name="mlp")(_norm(self.cfg, "ln_2")(x), sparse), None


class GPT(nn.Module):
    """Decoder-only transformer: ``(batch, tokens)`` int32 -> float32 logits ``(batch, tokens, vocab)``. ``sparse``
    goes to every 2:4 layer: ``None`` (sparse unless the method is dense) or a bool (e.g. srste's dense fine-tune)."""

    cfg: GPTConfig

    @nn.compact
    def __call__(self, idx, *, sparse: Optional[Any] = None):
        cfg = self.cfg
        t = idx.shape[1]
        if t > cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {cfg.block_size}")
        init = nn.initializers.normal(0.02)
        embed = OneHotEmbed if cfg.vocab_size <= ONE_HOT_MAX_VOCAB else nn.Embed
        wte = embed(cfg.vocab_size, cfg.n_embd, embedding_init=init, dtype=cfg.dtype, name="wte")
        x = wte(idx)
        if cfg.arch == "gpt":  # learned positions 0..t-1: a slice of the table (its gradient a pad)
            wpe = nn.Embed(cfg.block_size, cfg.n_embd, embedding_init=init, dtype=cfg.dtype, name="wpe")
            x = x + wpe.embedding[:t].astype(cfg.dtype)[None]
        block = Block
        if cfg.remat != "none":  # "dots" keeps the GEMM outputs (the 2:4 GEMMs' too), "full" only the block's input
            static = (2,) if sparse is None or isinstance(sparse, bool) else ()  # (self, x, sparse): a Python flag
            policy = checkpoint_policy("dots") if cfg.remat == "dots" else None
            block = nn.remat(Block, policy=policy, static_argnums=static, prevent_cse=cfg.layers != "scan")
        if cfg.layers == "scan":  # one block traced and compiled for all; its 2:4 state stacked per layer
            stack = nn.scan(block, length=cfg.n_layer, in_axes=(nn.broadcast,),
                            variable_axes={c: 0 for c in ("params", SPARSITY, PREPARED, FP8_META)},
                            split_rngs={"params": True, "mvue": True, "dropout": True})
            x = stack(cfg, name=STACK)(x, sparse)[0]
        else:
            for name in block_names(cfg):
                x = block(cfg, name=name)(x, sparse)[0]
        x = _norm(cfg, "ln_f")(x)
        if cfg.tie_head:
            logits = wte.attend(x)
        else:
            logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.dtype, kernel_init=init, name="lm_head")(x)
        return logits.astype(jnp.float32)
