"""AST — Adaptive Sparse Trainer (Huang et al., "Pruning Large Language Models with
Semi-Structural Adaptive Sparse Training", AAAI 2025, arXiv:2407.20584): the pieces for
retraining a pruned model.

* :func:`distillation_loss` — KL(teacher ‖ student) on softened logits, the dense model as
  teacher; :func:`hidden_state_loss` — optional per-layer MSE on hidden states;
  :func:`ast_loss` — task + α·KD + β·hidden.
* :class:`Sparse24LowRankDense` — a drop-in for ``flax.linen.Dense`` whose 2:4 mask is
  recomputed from the dense weight on every call (masks keep adapting, gradients pass straight
  through to the dense weight), plus AST's optional extra low-rank parameters ("SLoRB",
  ``y = x·(W⊙M) + x·A·B + b``).
* :func:`slorb_init`, :func:`student_params_from_dense` — initialising the low-rank parameters
  and building a student parameter tree from a trained dense one.

AST's other ingredient, the annealed SR-STE decay ``g ← g + λ_t·(1 − M)⊙W`` on the masked
weights, is an optimizer transformation (``jax_sparse24.optim.masked_decay``), not part of the
loss.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype
from jax import lax

from jax_sparse24._src import ops
from jax_sparse24._src import prune_impl as _impl
from jax_sparse24._src import validation as v
from jax_sparse24._src.linear import sparse24_linear

__all__ = [
    "distillation_loss",
    "hidden_state_loss",
    "ast_loss",
    "group_projection",
    "slorb_init",
    "Sparse24LowRankDense",
    "student_params_from_dense",
    "LOW_RANK_INITS",
]

#: Initialisations of :class:`Sparse24LowRankDense`'s low-rank term.
LOW_RANK_INITS = ("slorb_mean", "slorb_sum", "lora")

_EPS_HIDDEN = float(jnp.finfo(jnp.float32).eps)


# ---------------------------------------------------------------------------------------------
# losses


def _token_mean(per_token, mask, op: str):
    if mask is None:
        return jnp.mean(per_token)
    mask = jnp.asarray(mask)
    if mask.shape != per_token.shape:
        raise ValueError(f"{op}: mask must have the token shape {per_token.shape}, got {mask.shape}")
    w = mask.astype(jnp.float32)
    return jnp.sum(per_token * w) / jnp.maximum(jnp.sum(w), 1.0)


def distillation_loss(student_logits, teacher_logits, *, temperature: float = 1.0, mask=None):
    """Knowledge-distillation loss ``T²·KL(softmax(t/T) ‖ softmax(s/T))``, mean over tokens.

    The KL divergence of the student's softened distribution from the teacher's, summed over the
    vocabulary and averaged over every leading (token) position; scaled by ``T²`` so gradient
    magnitudes do not depend on the temperature (Hinton et al. 2015; AST uses the same form). No
    gradient flows into the teacher. Computed in float32.

    Args:
      student_logits: ``(..., vocab)``.
      teacher_logits: ``(..., vocab)``, same shape.
      temperature: ``T > 0``.
      mask: optional ``(...)`` weights (e.g. 0 at padding); the mean is taken over them.

    Returns:
      float32 scalar, ``>= 0``; 0 when the logits are equal.

    Raises:
      ValueError: mismatched vocabularies (the message names both sizes), mismatched token
        shapes or ``T <= 0``.

    >>> import jax.numpy as jnp
    >>> t = jnp.array([[2.0, 0.0, -1.0]])
    >>> float(distillation_loss(t, t))
    0.0
    >>> round(float(distillation_loss(jnp.zeros((1, 3)), t)), 4)
    0.5743
    """
    op = "distillation_loss"
    s_shape, t_shape = np.shape(student_logits), np.shape(teacher_logits)
    if len(s_shape) < 1 or len(t_shape) < 1:
        raise ValueError(f"{op}: logits need a vocabulary axis, got shapes {s_shape} and {t_shape}")
    if s_shape[-1] != t_shape[-1]:
        raise ValueError(
            f"{op}: the student's vocabulary size {s_shape[-1]} differs from the teacher's "
            f"{t_shape[-1]} (student_logits {s_shape}, teacher_logits {t_shape}); the teacher must "
            "share the student's tokenizer")
    if s_shape != t_shape:
        raise ValueError(f"{op}: student_logits {s_shape} and teacher_logits {t_shape} must have "
                         "the same token shape")
    if not float(temperature) > 0:
        raise ValueError(f"{op}: temperature must be > 0, got {temperature}")
    t = float(temperature)
    log_q = jax.nn.log_softmax(jnp.asarray(student_logits, jnp.float32) / t, axis=-1)
    log_p = jax.nn.log_softmax(lax.stop_gradient(jnp.asarray(teacher_logits, jnp.float32)) / t, axis=-1)
    p = jnp.exp(log_p)
    kl = jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1)
    return _token_mean(kl, mask, op) * (t * t)


def hidden_state_loss(student_hidden, teacher_hidden, *, normalize: bool = False):
    """Mean squared error between student and teacher hidden states, summed over layers.

    Accepts one array or a sequence of arrays (one per layer). With ``normalize=True`` each
    layer's MSE is divided by the teacher's mean square (``+ eps``) — the "squarehead" layer-wise
    loss of AST's reference code — which makes layers of different scale comparable. No
    gradient flows into the teacher.

    Args:
      student_hidden: array or sequence of arrays.
      teacher_hidden: the same structure and shapes.
      normalize: divide each layer's MSE by ``mean(teacher²) + eps``.

    Returns:
      float32 scalar.

    Raises:
      ValueError: different numbers of layers or shapes.

    >>> import jax.numpy as jnp
    >>> float(hidden_state_loss(jnp.ones((2, 4)), jnp.zeros((2, 4))))
    1.0
    """
    op = "hidden_state_loss"
    seq = isinstance(student_hidden, (list, tuple))
    if seq != isinstance(teacher_hidden, (list, tuple)):
        raise ValueError(f"{op}: pass two arrays or two sequences of arrays")
    s_list = list(student_hidden) if seq else [student_hidden]
    t_list = list(teacher_hidden) if seq else [teacher_hidden]
    if len(s_list) != len(t_list):
        raise ValueError(f"{op}: {len(s_list)} student layers but {len(t_list)} teacher layers")
    total = jnp.float32(0.0)
    for i, (s, t) in enumerate(zip(s_list, t_list)):
        if np.shape(s) != np.shape(t):
            raise ValueError(f"{op}: layer {i}: student shape {np.shape(s)} != teacher shape {np.shape(t)}")
        s = jnp.asarray(s, jnp.float32)
        t = lax.stop_gradient(jnp.asarray(t, jnp.float32))
        mse = jnp.mean(jnp.square(s - t))
        if normalize:
            mse = mse / (jnp.mean(jnp.square(t)) + _EPS_HIDDEN)
        total = total + mse
    return total


def ast_loss(task_loss, student_logits, teacher_logits, *, alpha: float = 1.0, beta: float = 0.0,
             temperature: float = 1.0, student_hidden=None, teacher_hidden=None,
             normalize_hidden: bool = True, mask=None):
    """AST's training objective: ``task + α·KD + β·hidden``.

    AST trains the sparse student on the task loss plus the KL distillation loss from the dense
    teacher (both weighted 1 in the reference code), optionally plus a layer-wise hidden-state
    loss. Designed to be returned from a loss function used with
    ``jax.value_and_grad(..., has_aux=True)``.

    Args:
      task_loss: scalar task loss (e.g. next-token cross-entropy) of the student.
      student_logits, teacher_logits: ``(..., vocab)``.
      alpha: weight of :func:`distillation_loss`.
      beta: weight of :func:`hidden_state_loss` (needs both hidden arguments when non-zero).
      temperature: KD temperature.
      student_hidden, teacher_hidden: array or sequence of per-layer arrays.
      normalize_hidden: passed to :func:`hidden_state_loss` as ``normalize``.
      mask: optional token weights for the KD term.

    Returns:
      ``(total, aux)`` with ``aux = {"task", "kd", "hidden"}`` (float32 scalars).

    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((2, 5))
    >>> total, aux = ast_loss(jnp.float32(1.5), logits, logits, alpha=0.5)
    >>> float(total), float(aux["kd"])
    (1.5, 0.0)
    """
    kd = distillation_loss(student_logits, teacher_logits, temperature=temperature, mask=mask)
    if student_hidden is not None or teacher_hidden is not None:
        if student_hidden is None or teacher_hidden is None:
            raise ValueError("ast_loss: pass both student_hidden and teacher_hidden, or neither")
        hid = hidden_state_loss(student_hidden, teacher_hidden, normalize=normalize_hidden)
    elif beta:
        raise ValueError("ast_loss: beta != 0 needs student_hidden and teacher_hidden")
    else:
        hid = jnp.float32(0.0)
    task = jnp.asarray(task_loss, jnp.float32)
    total = task + alpha * kd + beta * hid
    return total, {"task": task, "kd": kd, "hidden": hid}


# ---------------------------------------------------------------------------------------------
# the sparse layer with AST's low-rank term


def group_projection(features_in: int, rank: int, dtype=jnp.float32):
    """SLoRB's projection ``A (in, rank)``: ``A[i, g] = 1`` iff input channel ``i`` is in group
    ``g`` of ``k = in // rank`` consecutive channels, so ``x·A`` sums each group.

    >>> group_projection(4, 2).astype(int)
    Array([[1, 0],
           [1, 0],
           [0, 1],
           [0, 1]], dtype=int32)
    """
    if rank < 1 or features_in % rank:
        raise ValueError(f"group_projection: in={features_in} must be divisible by rank={rank} >= 1")
    k = features_in // rank
    return (jnp.arange(features_in)[:, None] // k == jnp.arange(rank)[None, :]).astype(dtype)


def slorb_init(kernel, rank: int, *, n: int = 2, m: int = 4, reduce: str = "mean"):
    """AST's SLoRB initialisation of ``B (rank, out)`` from a dense kernel ``(in, out)``.

    With ``k = in // rank``, ``B[g, o]`` is the mean (or sum) over the ``k`` input channels of
    group ``g`` of the weights the N:M mask prunes, ``W⊙(1−M)``. Together with the fixed group
    projection ``A`` (:func:`group_projection`) the extra term ``x·A·B`` starts as a coarse
    approximation of what pruning removed; with ``rank == in`` and ``reduce="mean"`` it is exactly
    ``x·(W⊙(1−M))``. This follows the reference implementation's default
    (``SLoRB_init_type="mean"``, group size ``SLoRB_k = 64``).

    Args:
      kernel: ``(in, out)``.
      rank: number of groups, ``in % rank == 0``.
      n, m: the N:M mask along ``in``.
      reduce: ``"mean"`` or ``"sum"``.

    Returns:
      ``(rank, out)`` array in the kernel's dtype.

    >>> import jax.numpy as jnp
    >>> slorb_init(jnp.array([[4.0], [-3.0], [1.0], [0.5]]), 2)
    Array([[0.  ],
           [0.75]], dtype=float32)
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"slorb_init: reduce must be 'mean' or 'sum', got {reduce!r}")
    shape = np.shape(kernel)
    if len(shape) != 2 or rank < 1 or shape[0] % rank:
        raise ValueError(f"slorb_init: kernel (in, out) with in divisible by rank={rank} required, "
                         f"got shape {shape}")
    kernel = jnp.asarray(kernel)
    mask = ops.nm_mask(kernel, n, m, axis=0)
    pruned = jnp.where(mask, jnp.zeros((), kernel.dtype), kernel)
    grouped = pruned.reshape(rank, shape[0] // rank, shape[1])
    return (grouped.mean(axis=1) if reduce == "mean" else grouped.sum(axis=1)).astype(kernel.dtype)


def _ste_masked(w, mask):
    """``w⊙mask`` forward, identity gradient to ``w`` (straight-through)."""
    return w + lax.stop_gradient(jnp.where(mask, w, jnp.zeros((), w.dtype)) - w)


class Sparse24LowRankDense(nn.Module):
    """``nn.Dense`` with an adaptive N:M (default 2:4) weight and AST's low-rank term.

    ``y = x·(W⊙M) + x·A·B + b`` where ``W (in, features)`` is the dense master weight, ``M`` the
    N:M magnitude mask of ``W`` along ``in`` **recomputed on every call** (so masks keep adapting
    as ``W`` trains, AST's adaptive lottery tickets), with the gradient passed straight through
    to all of ``W``; ``A (in, rank)``, ``B (rank, features)`` is the extra low-rank term
    (``rank=0``: none). The 2:4 case runs through ``sparse24_linear`` (the library's sparse
    kernels on a GPU); other N:M run a dense matmul on the masked weight.

    Low-rank initialisations (``low_rank_init``):

    * ``"slorb_mean"`` (default) / ``"slorb_sum"`` — AST's Sparse Low-Rank Boosting as in the
      paper's reference code: ``A`` is the fixed 0/1 group projection (:func:`group_projection`,
      groups of ``k = in // rank`` consecutive input channels; a parameter only when
      ``trainable_projection``) and ``B`` starts as the per-group mean (sum) of the pruned
      weights ``W⊙(1−M)`` (:func:`slorb_init`). The term therefore does **not** start at zero: it
      starts as a coarse stand-in for the pruned weights.
    * ``"lora"`` — ``A`` from ``lora_a_init`` (random), ``B`` zeros: the layer starts exactly as
      the masked dense layer ``x·(W⊙M) + b``.

    After loading a dense checkpoint into ``kernel``, re-initialise ``B`` from it with
    :func:`student_params_from_dense`.

    Attributes:
      features: output size.
      rank: size of the low-rank term (0: none). For SLoRB, ``in % rank == 0``.
      use_bias: add a bias.
      dtype: computation dtype (``None``: inferred from inputs and params).
      param_dtype: parameter dtype.
      precision: ``lax.Precision`` of the matmuls.
      kernel_init, bias_init: as in ``nn.Dense``.
      lora_a_init: initialiser of ``A`` for ``low_rank_init="lora"``.
      low_rank_init: one of :data:`LOW_RANK_INITS`.
      trainable_projection: SLoRB: make ``A`` a trainable parameter (initialised to the group
        projection).
      n, m: the N:M pattern along ``in`` (``m <= 32``).

    >>> import jax, jax.numpy as jnp
    >>> layer = Sparse24LowRankDense(features=8, rank=4)
    >>> params = layer.init(jax.random.key(0), jnp.ones((2, 16)))
    >>> jax.tree.map(jnp.shape, params["params"])
    {'bias': (8,), 'kernel': (16, 8), 'lora_b': (4, 8)}
    """

    features: int
    rank: int = 0
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros_init()
    lora_a_init: Callable = nn.initializers.lecun_normal()
    low_rank_init: str = "slorb_mean"
    trainable_projection: bool = False
    n: int = 2
    m: int = 4

    @nn.compact
    def __call__(self, inputs):
        """Applies the layer to ``inputs (..., in)``; returns ``(..., features)``."""
        op = "Sparse24LowRankDense"
        v.check_nm(self.n, self.m, op)
        if self.low_rank_init not in LOW_RANK_INITS:
            raise ValueError(f"{op}: low_rank_init must be one of {LOW_RANK_INITS}, got {self.low_rank_init!r}")
        features_in = jnp.shape(inputs)[-1]
        if features_in % self.m:
            raise ValueError(f"{op}: the input size {features_in} must be divisible by m={self.m} "
                             f"(N:M groups along the kernel's input axis)")
        kernel = self.param("kernel", self.kernel_init, (features_in, self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        a = b = None
        slorb = self.low_rank_init.startswith("slorb")
        if self.rank:
            if self.rank < 0:
                raise ValueError(f"{op}: rank must be >= 0, got {self.rank}")
            if slorb:
                if features_in % self.rank:
                    raise ValueError(f"{op}: SLoRB needs the input size {features_in} divisible by "
                                     f"rank={self.rank}")
                reduce = self.low_rank_init.split("_", 1)[1]
                b = self.param("lora_b", lambda _: slorb_init(kernel, self.rank, n=self.n, m=self.m,
                                                              reduce=reduce).astype(self.param_dtype))
                if self.trainable_projection:
                    a = self.param("lora_a", lambda _: group_projection(features_in, self.rank,
                                                                         self.param_dtype))
            else:
                a = self.param("lora_a", self.lora_a_init, (features_in, self.rank), self.param_dtype)
                b = self.param("lora_b", nn.initializers.zeros_init(), (self.rank, self.features),
                               self.param_dtype)
        mask = lax.stop_gradient(ops.nm_mask(kernel, self.n, self.m, axis=0))
        inputs, kernel, bias, a, b = promote_dtype(inputs, kernel, bias, a, b, dtype=self.dtype)
        if (self.n, self.m) == (2, 4):
            y = sparse24_linear(inputs, kernel, mask, bias, precision=self.precision, check_mask=False)
        else:
            y = jnp.dot(inputs, _ste_masked(kernel, mask), precision=self.precision)
            if bias is not None:
                y = y + bias
        if b is not None:
            if a is None:  # fixed SLoRB projection: sum each group of k input channels
                xa = inputs.reshape(*inputs.shape[:-1], self.rank, features_in // self.rank).sum(-1)
            else:
                xa = jnp.dot(inputs, a, precision=self.precision)
            y = y + jnp.dot(xa, b, precision=self.precision)
        return y


def student_params_from_dense(student_params, dense_params, *, low_rank_init: str = "slorb_mean",
                              n: int = 2, m: int = 4):
    """Builds AST student parameters from a trained dense model's parameters.

    Every leaf of ``student_params`` whose path also exists in ``dense_params`` is copied from
    it (kernels, biases, embeddings, norms); the student's extra leaves keep their values, except
    the low-rank parameters of each :class:`Sparse24LowRankDense` (a layer holding ``kernel`` and
    ``lora_b``), which are re-initialised from the copied kernel: ``"slorb_*"`` sets ``lora_b``
    with :func:`slorb_init` (and a trainable ``lora_a`` to the group projection); ``"lora"`` sets
    ``lora_b`` to zeros (the layer then starts as the masked dense layer). The student model is
    the dense model with ``nn.Dense`` replaced by :class:`Sparse24LowRankDense` under the same
    names.

    Args:
      student_params: the initialised student tree.
      dense_params: the trained dense (teacher) tree.
      low_rank_init: one of :data:`LOW_RANK_INITS` (match the layers' setting).
      n, m: the layers' N:M pattern.

    Returns:
      The student tree (same structure as ``student_params``).

    Raises:
      ValueError: a shared path with different shapes (names the path and both shapes).

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> dense = nn.Dense(4).init(jax.random.key(0), jnp.ones((1, 8)))
    >>> student = Sparse24LowRankDense(4, rank=2).init(jax.random.key(1), jnp.ones((1, 8)))
    >>> s = student_params_from_dense(student, dense)
    >>> bool(jnp.array_equal(s["params"]["kernel"], dense["params"]["kernel"]))
    True
    """
    op = "student_params_from_dense"
    if low_rank_init not in LOW_RANK_INITS:
        raise ValueError(f"{op}: low_rank_init must be one of {LOW_RANK_INITS}, got {low_rank_init!r}")
    dense_flat = dict(_impl.flatten(dense_params)[0])
    flat, treedef = _impl.flatten(student_params)
    out = dict(flat)
    missing = []
    for path, leaf in flat:
        if path in dense_flat:
            src = dense_flat[path]
            if np.shape(src) != np.shape(leaf):
                raise ValueError(f"{op}: {path!r} has shape {np.shape(src)} in the dense tree but "
                                 f"{np.shape(leaf)} in the student")
            out[path] = jnp.asarray(src, jnp.result_type(leaf))
        elif path.rsplit("/", 1)[-1] not in ("lora_a", "lora_b"):
            missing.append(path)
    if missing:
        warnings.warn(f"{op}: student parameters not in the dense tree kept their initial values: "
                      f"{missing}", stacklevel=2)
    for path, leaf in flat:
        layer, name = path.rsplit("/", 1) if "/" in path else ("", path)
        if name != "lora_b":
            continue
        kpath = f"{layer}/kernel" if layer else "kernel"
        if kpath not in out:
            continue
        rank = np.shape(leaf)[0]
        if low_rank_init == "lora":
            out[path] = jnp.zeros_like(leaf)
        else:
            out[path] = slorb_init(out[kpath], rank, n=n, m=m,
                                   reduce=low_rank_init.split("_", 1)[1]).astype(jnp.result_type(leaf))
            apath = f"{layer}/lora_a" if layer else "lora_a"
            if apath in out:
                out[apath] = group_projection(np.shape(out[kpath])[0], rank, jnp.result_type(out[apath]))
    return treedef.unflatten([out[p] for p, _ in flat])

