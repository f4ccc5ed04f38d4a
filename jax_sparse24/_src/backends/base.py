"""The interface every GEMM backend implements, and the registry the planner resolves names in.

A backend is one object (:class:`Backend`) that answers, for the GEMMs of a 2:4 linear layer
(D(m×n) = A(m×k, 2:4)·B(k×n), see :mod:`jax_sparse24._src.gemm`):

* whether it can run a GEMM of this shape and dtype here (:meth:`Backend.can_run`), and if not why
  (the reason the errors of ``backend="<name>"`` show);
* its operand layout: the keys of a prepared operand (:attr:`Backend.operand_keys`) and the
  compressor that writes it;
* its GEMMs: the CUDA lowerings of the forward / input-gradient GEMM from ``W ⊙ M``, of the same GEMMs
  on a prepared operand, and of the MVUE weight gradient (the dense and reference backends have none:
  their GEMM is XLA's on the masked weight);
* its sharding rule (:meth:`Backend.sharding_rule`: the rule of :mod:`jax_sparse24._src.sharding`).

Which backend a GEMM runs is decided by the planner, :func:`jax_sparse24._src.autotune.resolve`,
which returns one of the registered objects. A new backend is one module in this package that builds
its object and calls :func:`register`, plus its import in ``backends/__init__.py``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jax_sparse24._src import sharding

__all__ = ["Verdict", "OK", "Backend", "register", "get", "names", "registered", "masked_weight", "bool_mask",
           "pad_rows"]


def masked_weight(w, mask):
    """W̃ = W ⊙ M: ``w`` where ``mask``, else zero (in ``w``'s dtype)."""
    return jnp.where(mask, w, jnp.zeros((), w.dtype))


def bool_mask(mask):
    """``mask`` as a bool array (nonzero: kept)."""
    mask = jnp.asarray(mask)
    return mask if mask.dtype == jnp.bool_ else mask != 0


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


class Backend:
    """One GEMM backend. Subclasses set the class attributes and override what they implement.

    Attributes:
      name: the value of ``backend=`` that requests it, and what the planner reports.
      sparse: True when its GEMMs run a 2:4 sparse kernel on a CUDA device (False: XLA's dense GEMM
        on the masked weight, on every platform).
      fp8: True for a backend of the fp8 GEMMs (``sparse24_linear(..., fp8=True)``).
      fp8_label: how the fp8 planner names this backend's fp8 GEMM (``"cutlass"`` / ``"xla"``).
      operand_keys: keys of one prepared operand (``prepare_weight(...)["forward"]``); empty for a
        backend without prepared operands.
    """

    name: str = ""
    sparse: bool = False
    fp8: bool = False
    fp8_label: str = "xla"
    operand_keys: tuple = ()

    def can_run(self, m: int, n: int, k: int, dtype=None, *, gemm: str = "forward") -> Verdict:
        """Whether this backend runs ``gemm`` (``"forward"``, ``"input_grad"``: D(m×n) = A(m×k)·B(k×n);
        ``"weight_grad"``: the MVUE weight gradient with m = O, n = I, k = padded tokens) here."""
        return OK

    def sharding_rule(self, kind: str, **kwargs) -> sharding.Rule:
        """The partitioning rule of this backend's ``kind`` GEMM (:func:`~jax_sparse24._src.sharding.gemm_rule`)."""
        return sharding.gemm_rule(kind, **kwargs)

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
