"""The interface every GEMM backend implements, and the registry the planner resolves names in.

A backend is one object (:class:`Backend`) that answers, for the GEMMs of a 2:4 linear layer
(D(m×n) = A(m×k, 2:4)·B(k×n), see :mod:`jax_sparse24._src.gemm`), every question a caller asks —
callers call these methods and never compare backend names:

* **can it run here** (:meth:`Backend.can_run`, with the reason the errors of ``backend="<name>"``
  show) and does the build take the shape (:meth:`Backend.supports`, no device check);
* **its GEMMs**: the XLA GEMMs on the masked weight (:meth:`Backend.forward`, :meth:`Backend.input_grad`,
  :meth:`Backend.weight_grad`: every backend's lowering off CUDA, and all the dense backends run), and
  the CUDA lowerings of the forward / input-gradient GEMM from ``W ⊙ M`` (:meth:`Backend.weight_gemm`),
  of the same GEMMs on a prepared operand (:meth:`Backend.prepared_gemm`) and of the MVUE weight
  gradient (:meth:`Backend.mvue_weight_grad`) — ``None`` for a backend without kernels;
* **its operand layout and prepared operand**: the keys of a prepared operand
  (:attr:`Backend.operand_keys`), their shapes, the compressions that write them
  (:meth:`Backend.compressions`), the trace-time check of one (:meth:`Backend.check_operand`);
* **its fp8 variant** (:meth:`Backend.fp8_variant`: the backend of its fp8 GEMMs, or None);
* **its sharding rule** (:meth:`Backend.sharding_rule`: the rule of :mod:`jax_sparse24._src.partitioning`).

Which backend a GEMM runs is decided by the planner, :func:`jax_sparse24._src.autotune.resolve`,
which returns one of the registered objects. A new backend is one module in this package that builds
its object and calls :func:`register`, plus its import in ``backends/__init__.py``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from jax_sparse24._src import fp8_math
from jax_sparse24._src import partitioning

__all__ = ["Verdict", "OK", "Backend", "Compression", "register", "get", "names", "registered", "masked_weight", "bool_mask",
           "operand_mk", "pad_rows"]


def masked_weight(w, mask):
    """W̃ = W ⊙ M: ``w`` where ``mask``, else zero (in ``w``'s dtype)."""
    return jnp.where(mask, w, jnp.zeros((), w.dtype))


def bool_mask(mask):
    """``mask`` as a bool array (nonzero: kept)."""
    mask = jnp.asarray(mask)
    return mask if mask.dtype == jnp.bool_ else mask != 0


def operand_mk(name: str, i: int, o: int) -> tuple[int, int]:
    """(M, K) of the 2:4 operand of a weight ``(i, o)``'s GEMM ``name``: the forward's A = W̃ᵀ (O, I),
    the input gradient's A = W̃ (I, O)."""
    return (o, i) if name == "forward" else (i, o)


def pad_rows(a, multiple: int):
    """``a`` with zero rows appended up to a multiple of ``multiple`` rows."""
    pad = (-a.shape[0]) % multiple
    if pad:
        a = jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)], axis=0)
    return a


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a backend can run a GEMM: true when it can, else false with the ``reason``."""

    reason: str | None = None

    def __bool__(self) -> bool:
        return self.reason is None


OK = Verdict()

#: The GEMMs of a layer a backend is asked about.
GEMMS = ("forward", "input_grad", "weight_grad")


class Compression(NamedTuple):
    """One compression writing prepared operands (:meth:`Backend.compressions`).

    ``layout``: the output layout of the fused compressors
    (:data:`~jax_sparse24._src.cuda_compress_ops.LAYOUTS`; one pass over W writes the operands of
    ``names``, groupable with other layers'), or None: the backend's :meth:`Backend.library_compress`
    of one GEMM's operand. ``names``: the GEMMs (``"forward"``, ``"input_grad"``) whose operands it
    writes, in order; ``shapes``: its flat outputs (per name, the arrays of :attr:`Backend.operand_keys`).
    """

    layout: str | None
    names: tuple
    shapes: tuple


class Backend:
    """One GEMM backend: the whole interface, with the answers of a backend without kernels (XLA's
    GEMMs on the masked weight). Subclasses set the class attributes and override what they implement.

    Attributes:
      name: the value of ``backend=`` that requests it, and what the planner reports.
      sparse: True when its GEMMs run a 2:4 sparse kernel on a CUDA device (False: XLA's dense GEMM
        on the masked weight, on every platform).
      fp8: True for a backend of the fp8 GEMMs (``sparse24_linear(..., fp8=True)``).
      fp8_label: how the fp8 planner names this backend's fp8 GEMM (``"cutlass"`` / ``"xla"``).
      operand_keys: keys of one prepared operand (``prepare_weight(...)["forward"]``); empty for a
        backend without prepared operands.
      operand_dims: the sharding rule's dimension labels of each array of a prepared operand (in
        :attr:`operand_keys` order).
      compress_layout: the fused compressors' output layout of its operand
        (:data:`~jax_sparse24._src.cuda_compress_ops.LAYOUTS`), None without one.
    """

    name: str = ""
    sparse: bool = False
    fp8: bool = False
    fp8_label: str = "xla"
    operand_keys: tuple = ()
    operand_dims: tuple = ()
    compress_layout: str | None = None

    # --- can it run here ----------------------------------------------------------------------------
    def can_run(self, m: int, n: int, k: int, dtype=None, *, gemm: str = "forward") -> Verdict:
        """Whether this backend runs ``gemm`` (``"forward"``, ``"input_grad"``: D(m×n) = A(m×k)·B(k×n);
        ``"weight_grad"``: the MVUE weight gradient with m = O, n = I, k = padded tokens) here, and if
        not why."""
        return OK

    def supports(self, m: int, n: int, k: int, dtype, *, gemm: str = "forward") -> bool:
        """Whether the loaded build takes ``gemm`` of this shape and dtype (no device check: under
        sharding, the question a shard asks inside the CUDA lowering)."""
        return True

    # --- fp8 variant --------------------------------------------------------------------------------
    def fp8_variant(self) -> "Backend | None":
        """The backend of this backend's fp8 GEMMs (``fp8=True``): a backend without kernels is its own
        (XLA's fp8 dot), a sparse one its registered fp8 backend; None where there is none."""
        if not self.sparse or self.fp8:
            return self
        return _REGISTRY.get((self.name, True))

    # --- GEMMs: XLA's, on the masked weight (every backend's lowering off CUDA) ----------------------
    def forward(self, x2, wm, precision=None):
        """y (T, O) = x (T, I) · W̃ (I, O)."""
        return jnp.dot(x2, wm, precision=precision)

    def input_grad(self, g2, wm, precision=None):
        """∇x (T, I) = ∇y (T, O) · W̃ᵀ."""
        return jnp.dot(g2, wm.T, precision=precision)

    def weight_grad(self, x2, g2, precision=None):
        """∇W (I, O) = xᵀ · G (G = ∇y, or its MVUE sample)."""
        return jnp.dot(x2.T, g2, precision=precision)

    def fp8_weight_gemm_xla(self, *, transposed: bool):
        """``fn(b2, wc, mk, s_b, s_w)``: the fp8 GEMM of the forward (``transposed``: b2 · q(W̃)) or the
        input gradient (b2 · q(W̃)ᵀ) as XLA's fp8 dot, ``(s_b·s_w)`` applied to the accumulator."""

        def xla(b2, wc, mk, s_b, s_w):
            qw = fp8_math.quantize(masked_weight(wc, mk), s_w)  # (I, O)
            return fp8_math.scaled_matmul(fp8_math.quantize(b2, s_b), qw, s_b * s_w, transpose_b=not transposed)

        return xla

    def fp8_weight_grad_xla(self, xp, gs, s_x, s_m):
        """``q(x)ᵀ·q(G) · (s_x·s_m)`` (G: the MVUE sample) with XLA's fp8 dot."""
        return fp8_math.scaled_matmul(fp8_math.quantize(xp, s_x).T, fp8_math.quantize(gs, s_m), s_x * s_m)

    # --- GEMMs: CUDA lowerings (None: no kernel, the XLA GEMMs above) ---------------------------------
    def weight_gemm(self, *, m: int, n: int, k: int, transposed: bool, dtype, config_of=None, packed: bool = False):
        """The forward (``transposed``: A = W̃ᵀ) or input-gradient (A = W̃) GEMM from W and the mask:
        ``fn(b2, wc, mk)`` giving D (n, m) = b2 · Aᵀ (fp8: ``fn(b2, wc, mk, s_b, s_w)``); ``packed``: W̃
        in :mod:`~jax_sparse24._src.packed24`'s encoding (``fn(b2, values, bits, ...)``); None: no kernel."""
        return None

    def prepared_gemm(self, *, name: str, m: int, n: int, k: int, dtype, config_of=None):
        """``fn(b2, *operand)``: the GEMM ``name`` on a prepared operand; None: no prepared operands."""
        return None

    def mvue_weight_grad(self, *, o: int, i: int, tl: int, tokens: int, align: int, dtype, config: int = -1):
        """``fn(key, x2, g2)`` (fp8: ``fn(key, x2, g2, s_x, s_m)``): ∇W (I, O) = xᵀ·MVUE(∇y) on (``tl``
        tokens) shards, tokens padded to ``align`` (``tokens`` after padding); None: no kernel."""
        return None

    # --- operand layout and prepared operand -----------------------------------------------------------
    def operand_shapes(self, name: str, m: int, k: int, tokens: int, dtype) -> tuple:
        """Shapes of the arrays of a prepared (M, K) operand of GEMM ``name`` (planned for ``tokens``
        rows), in :attr:`operand_keys` order."""
        return ()

    def operand_dtype(self, entry):
        """The compute dtype a prepared operand was made for, or None where it does not record one."""
        return None

    def check_operand(self, entry, name: str, m: int, k: int, dtype, *, w_shape, op: str) -> None:
        """Trace-time check of a prepared (M, K) operand for ``w`` of ``w_shape`` in ``dtype`` (ValueError)."""
        raise ValueError(f"{op}: prepared[{name!r}]: the {self.name!r} backend has no prepared operands")

    def compressions(self, names: tuple, i: int, o: int, tokens: int, dtype) -> list:
        """The :class:`Compression` passes that write the prepared operands of the GEMMs ``names`` of a
        weight ``(i, o)`` (planned for ``tokens`` rows)."""
        return []

    def library_compress(self, name: str, wc, mk, *, m: int, k: int, tokens: int, dtype):
        """The operand of GEMM ``name`` from the masked weight by the backend's own library (a
        :class:`Compression` whose ``layout`` is None)."""
        raise NotImplementedError(f"the {self.name!r} backend has no library compressor")

    # --- sharding ------------------------------------------------------------------------------------
    def sharding_rule(self, kind: str, *, prepared: bool = False, **kwargs) -> partitioning.Rule:
        """The partitioning rule of this backend's ``kind`` GEMM (:func:`~jax_sparse24._src.partitioning.gemm_rule`);
        ``prepared``: the GEMM on a prepared operand (:func:`~jax_sparse24._src.partitioning.prepared_gemm_rule`
        with :attr:`operand_dims`)."""
        if prepared:
            return partitioning.prepared_gemm_rule(kind, self.name, self.operand_dims, **kwargs)
        return partitioning.gemm_rule(kind, **kwargs)

    def __repr__(self) -> str:
        return f"<{'fp8 ' if self.fp8 else ''}GEMM backend {self.name!r}>"


_REGISTRY: dict[tuple[str, bool], Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` resolvable by its name (``fp8`` backends separately); returns it."""
    key = (backend.name, backend.fp8)
    if key in _REGISTRY and _REGISTRY[key] is not backend:
        raise ValueError(f"a {'fp8 ' if backend.fp8 else ''}GEMM backend named {backend.name!r} is already registered")
    _REGISTRY[key] = backend
    return backend


def get(name: str, *, fp8: bool = False) -> Backend:
    """The registered backend ``name`` (of the fp8 GEMMs with ``fp8``); KeyError if there is none."""
    return _REGISTRY[(name, bool(fp8))]


def names() -> tuple[str, ...]:
    """Names of the registered 16-bit backends, in registration order."""
    return tuple(name for name, fp8 in _REGISTRY if not fp8)


def registered() -> tuple[Backend, ...]:
    """Every registered backend object, in registration order."""
    return tuple(_REGISTRY.values())
