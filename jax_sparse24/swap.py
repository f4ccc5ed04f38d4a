"""Swap the ``nn.Dense`` layers of an existing Flax linen model for 2:4 sparse layers.

The torchao-style workflow (``swap_linear_with_semi_sparse_linear``) for Flax linen::

    from jax_sparse24 import swap
    model = MyTransformer(...)                                   # uses nn.Dense inside
    sparse_model = swap.swap_dense(model, ["*mlp*"], method="srste")
    sparsity = swap.init_sparsity(sparse_model, params, x)       # masks from the existing kernels
    y = sparse_model.apply({"params": params, "sparsity": sparsity}, x, rngs={"mvue": key})
    dense_again = swap.unswap(sparse_model)                      # the original module

How it works (and why this approach). Linen submodules are usually created *inside*
``setup``/``@compact`` methods, so they are not attributes that could be rewritten on a module
tree before it runs. Instead :func:`swap_dense` wraps the model in :class:`SwappedModule`, which

1. shares its scope with the wrapped model (``flax.linen.share_scope``), so the variable tree is
   exactly the original one — no extra nesting level; and
2. runs every call of the model under a method interceptor (``flax.linen.intercept_methods``).
   When a matching ``nn.Dense`` is called, the interceptor builds the replacement layer from the
   Dense's own fields (``features, use_bias, dtype, param_dtype, precision, kernel_init,
   bias_init``) plus your keyword arguments, points it at the *Dense's scope* (``share_scope``)
   and calls it instead. The replacement therefore reads and writes ``<dense path>/kernel`` and
   ``<dense path>/bias`` — the same parameters (and, at ``init``, the same initial values, since
   it draws from the same RNG scope) — and keeps its own state (masks, β) in the ``"sparsity"``
   collection at the same path.

Inside another module, ``swap_dense(Block(name="block"), ...)(x)`` keeps the variables under
``block`` (the wrapper takes the wrapped module's scope, as ``share_scope`` does).

This works for Dense layers made in ``setup``, in ``@compact`` methods, nested at any depth,
called several times (weight sharing), and under lifted transforms. Only ``nn.Dense`` itself is
swapped (not subclasses, ``DenseGeneral`` or ``Einsum``); a Dense with a custom ``dot_general``
is refused with a clear error. Only the wrapped model's ``__call__`` is intercepted; to run
another method use ``model.apply(variables, "method_name", *args, method=SwappedModule.invoke)``
or run anything under :func:`swap_context`.

Patterns are ``fnmatch`` globs matched against the Dense's module path relative to the wrapped
model, joined by ``/`` (e.g. ``"h_0/mlp/fc"``, ``"Dense_0"``); ``*`` also matches ``/``, so
``"*mlp*"`` selects every Dense under any module named ``mlp``. A callable
``where(path: str, module: nn.Dense) -> bool`` may be given instead. ``exclude=`` globs (same
syntax) keep the layers they match dense, e.g. a classifier head whose 10 outputs cannot form
groups of 4: ``swap_dense(model, "*", exclude=["head"])``.

What is checked, on every call of a :class:`SwappedModule` (i.e. at ``init``/``apply``/tracing):

* a swapped Dense whose shapes cannot be 2:4 (input features not divisible by 4; output features
  not divisible by 4 for transposable ``srste`` masks) is a ``ValueError`` naming the Dense's path
  (relative to the wrapped model) and the ``exclude=[...]`` argument that leaves it dense; any
  other error of the replacement layer is re-raised with that path too;
* **a swap that replaces nothing is an error** (``ValueError`` listing the model's Dense paths), so
  a mistyped pattern cannot silently train a dense model; a glob pattern that matches no Dense while
  others do is a ``UserWarning`` (it may name a layer that this call does not reach);
* layers a pattern matches that are not ``nn.Dense`` — ``nn.DenseGeneral`` (the ``query``/``key``/
  ``value``/``out`` projections of ``nn.MultiHeadDotProductAttention``), ``nn.Einsum``, subclasses of
  ``nn.Dense`` — stay dense; a ``UserWarning`` lists them. To train attention 2:4, build its
  projections from ``nn.Dense`` (as ``examples/model.py`` does) or from ``Sparse24Dense``.

:meth:`SwappedModule.invoke` and :func:`swap_context` make the shape checks but not the
nothing-swapped check (a method may legitimately reach none of the patterns); ``swap_context``
warns at exit about patterns that matched nothing.

:class:`SemiSparseActivationDense` is the activation-sparse counterpart (torchao's
``SemiSparseActivationLinear``): ``y = mask24(x)·W + b`` with 2:4 groups along the input
features of the *activations*, gradient straight through to ``x``. Swap it in with
``swap_dense(model, patterns, layer=SemiSparseActivationDense)``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen.dtypes import promote_dtype
from jax import lax

from jax_sparse24._src import ops
from jax_sparse24.nn import Sparse24Dense
from jax_sparse24.masks import SPARSITY

__all__ = [
    "SemiSparseActivationDense",
    "SwappedModule",
    "init_sparsity",
    "semi_sparse_activation",
    "swap_context",
    "swap_dense",
    "unswap",
]

Patterns = Union[str, Sequence[str], Callable[[str, nn.Module], bool]]

_DENSE_FIELDS = ("features", "use_bias", "dtype", "param_dtype", "precision", "kernel_init", "bias_init")


# ------------------------------------------------------------------------------------------------
# Activation-sparse dense layer
# ------------------------------------------------------------------------------------------------


@jax.custom_vjp
def semi_sparse_activation(x):
    """``x ⊙ mask24(x)`` along the last axis, with a straight-through gradient (``∇x = ∇y``).

    >>> import jax.numpy as jnp
    >>> semi_sparse_activation(jnp.array([[1.0, -5.0, 3.0, 0.5]]))
    Array([[ 0., -5.,  3.,  0.]], dtype=float32)
    """
    return jnp.where(ops.mask24(x, axis=-1), x, jnp.zeros((), x.dtype))


def _ssa_fwd(x):
    return semi_sparse_activation(x), None


def _ssa_bwd(_, g):
    return (g,)


semi_sparse_activation.defvjp(_ssa_fwd, _ssa_bwd)


class SemiSparseActivationDense(nn.Module):
    """Dense layer on 2:4-sparsified input activations (torchao's ``SemiSparseActivationLinear``).

    ``y = (x ⊙ mask24(x))·W + b``: of every 4 consecutive input features of each token the two
    largest ``|x|`` are kept. The backward pass is straight-through to ``x`` (``∇x = ∇y·Wᵀ``),
    and ``∇W = (x ⊙ mask)ᵀ·∇y``. Same fields and parameter tree as ``flax.linen.Dense``, so it
    can replace one in place (see :func:`swap_dense`). The matmul is a dense GEMM on the masked
    activations (on Hopper a sparse GEMM would need the activations compressed on every call).

    >>> import jax, jax.numpy as jnp
    >>> v = SemiSparseActivationDense(3).init(jax.random.key(0), jnp.ones((2, 8)))
    >>> jax.tree_util.tree_map(jnp.shape, v["params"])
    {'bias': (3,), 'kernel': (8, 3)}
    """

    features: int
    use_bias: bool = True
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, inputs):
        in_features = jnp.shape(inputs)[-1]
        if in_features % 4:
            raise ValueError(
                f"SemiSparseActivationDense {self.name or ''}: the input feature size must be "
                f"divisible by 4 (2:4 groups along the features), got inputs of shape {jnp.shape(inputs)}"
            )
        kernel = self.param("kernel", self.kernel_init, (in_features, self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        xs = semi_sparse_activation(inputs)
        y = lax.dot_general(xs, kernel, (((xs.ndim - 1,), (0,)), ((), ())), precision=self.precision)
        if bias is not None:
            y = y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y


# ------------------------------------------------------------------------------------------------
# Swapping
# ------------------------------------------------------------------------------------------------


def _as_globs(patterns, what: str) -> list:
    if isinstance(patterns, str):
        patterns = [patterns]
    pats = list(patterns)
    if not all(isinstance(p, str) for p in pats):
        raise ValueError(f"swap_dense: {what} must be a glob string, a list of them, or a callable, got {patterns!r}")
    return pats


def _matcher(patterns: Patterns) -> Callable[[str, nn.Module], bool]:
    if callable(patterns):
        return patterns
    pats = _as_globs(patterns, "patterns")
    if not pats:
        raise ValueError(f"swap_dense: patterns must be a glob string, a list of them, or a callable, got {patterns!r}")
    return lambda path, module: any(fnmatch.fnmatchcase(path, p) for p in pats)


def _exclude_matcher(exclude) -> Callable[[str], bool]:
    pats = _as_globs(exclude, "exclude") if exclude else []
    return lambda path: any(fnmatch.fnmatchcase(path, p) for p in pats)


class _SwapLog:
    """What one call saw: Dense paths, swapped paths, matching layers left dense (path -> type)."""

    def __init__(self):
        self.dense: dict = {}
        self.swapped: dict = {}
        self.skipped: dict = {}


def _exclude_hint(path: str) -> str:
    return f"exclude=[{path!r}]"


def _precheck(path: str, dense: nn.Module, args, layer, layer_kwargs: dict) -> None:
    """Shape constraints of the 2:4 replacement, named by the Dense's path (before the layer runs)."""
    x = args[0] if args else None
    shape = getattr(x, "shape", None)
    in_features = shape[-1] if shape else None
    method = layer_kwargs.get("method", "srste") if issubclass(layer, Sparse24Dense) else None
    needs_in = method != "dense" if issubclass(layer, Sparse24Dense) else issubclass(layer, SemiSparseActivationDense)
    if needs_in and in_features is not None and in_features % 4:
        raise ValueError(
            f"swap_dense: nn.Dense at {path!r} has {in_features} input features, not divisible by 4 "
            f"(2:4 groups run along the input features). Leave it dense: {_exclude_hint(path)}"
        )
    if method == "srste" and layer_kwargs.get("transposable", True) and dense.features % 4:
        raise ValueError(
            f"swap_dense: nn.Dense at {path!r} has features={dense.features}, not divisible by 4, which "
            f"transposable srste masks need (2:4 along the outputs too). Leave this layer dense: "
            f"{_exclude_hint(path)} (transposable=False would instead drop transposable masks for every "
            "swapped layer)"
        )


def _dense_interceptor(match, layer, layer_kwargs: dict, prefix_len: int, excluded=None, log: Optional[_SwapLog] = None):
    default_dot_general = nn.Dense.__dataclass_fields__["dot_general"].default
    default_dot_general_cls = nn.Dense.__dataclass_fields__["dot_general_cls"].default
    excluded = excluded or (lambda path: False)
    log = log if log is not None else _SwapLog()

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, (nn.Dense, nn.DenseGeneral, nn.Einsum)):
            return next_fun(*args, **kwargs)
        if len(module.path) < prefix_len:  # not inside the wrapped model
            return next_fun(*args, **kwargs)
        path = "/".join(str(p) for p in module.path[prefix_len:])
        if type(module) is not nn.Dense:
            if not excluded(path) and match(path, module):
                log.skipped[path] = type(module).__name__
            return next_fun(*args, **kwargs)
        dense = module
        log.dense[path] = True
        if not match(path, dense) or excluded(path):
            return next_fun(*args, **kwargs)
        if dense.dot_general is not default_dot_general or dense.dot_general_cls is not default_dot_general_cls:
            raise ValueError(f"swap_dense: nn.Dense at {path!r} has a custom dot_general; it cannot be swapped. "
                             f"Leave it dense: {_exclude_hint(path)}")
        _precheck(path, dense, args, layer, layer_kwargs)
        fields = {f: getattr(dense, f) for f in _DENSE_FIELDS}
        # Created inside the Dense's method: its parent is the Dense; share_scope then makes it
        # use the Dense's scope, so its variables are the Dense's variables.
        replacement = layer(**fields, **layer_kwargs)
        nn.share_scope(dense, replacement)
        log.swapped[path] = True
        try:
            return replacement(*args, **kwargs)
        except ValueError as e:
            if str(e).startswith("swap_dense:"):
                raise
            raise ValueError(f"swap_dense: nn.Dense at {path!r} (swapped for {layer.__name__}): {e}") from e

    return interceptor


def _report(log: _SwapLog, patterns, *, require_swap: bool, where: str) -> None:
    """Warn about matching layers left dense and unused glob patterns; raise if nothing was swapped."""
    if log.skipped:
        listed = ", ".join(f"{p!r} ({t})" for p, t in log.skipped.items())
        warnings.warn(f"{where}: {len(log.skipped)} matching layer(s) are not nn.Dense and stay dense: {listed}; "
                      "only flax.linen.Dense is swapped", UserWarning, stacklevel=4)
    if require_swap and not log.swapped:
        what = "the predicate" if callable(patterns) else f"the pattern(s) {list(patterns)!r}"
        seen = list(log.dense)
        raise ValueError(
            f"{where}: {what} swapped no nn.Dense; the model's nn.Dense paths are "
            f"{seen[:20]!r}{' ...' if len(seen) > 20 else ''} (globs over '/'-joined paths relative to the "
            "wrapped model, e.g. '*mlp*')"
        )
    if not callable(patterns) and log.dense:
        unused = [p for p in patterns if not any(fnmatch.fnmatchcase(d, p) for d in log.dense)]
        if unused:
            warnings.warn(f"{where}: pattern(s) {unused!r} matched no nn.Dense (paths: {list(log.dense)[:20]!r})",
                          UserWarning, stacklevel=4)


def _check_layer(layer, layer_kwargs: dict) -> None:
    if not (isinstance(layer, type) and issubclass(layer, nn.Module)):
        raise TypeError(f"swap_dense: layer must be a flax.linen Module class, got {layer!r}")
    fields = getattr(layer, "__dataclass_fields__", {})
    missing = [f for f in _DENSE_FIELDS if f not in fields]
    if missing:
        raise TypeError(f"swap_dense: layer {layer.__name__} lacks the nn.Dense fields {missing}")
    if "name" in layer_kwargs or "parent" in layer_kwargs:
        raise TypeError(
            "swap_dense: name/parent are not layer fields; inside another module name the wrapped "
            "model instead: swap_dense(Block(name='block'), ...) keeps its variables under 'block'"
        )
    unknown = [k for k in layer_kwargs if k not in fields]
    if unknown:
        raise TypeError(f"swap_dense: {layer.__name__} has no field(s) {unknown}")
    clash = [k for k in layer_kwargs if k in _DENSE_FIELDS]
    if clash:
        raise TypeError(f"swap_dense: {clash} are taken from each swapped nn.Dense; do not pass them")


@contextlib.contextmanager
def swap_context(patterns: Patterns, *, layer: type = Sparse24Dense, exclude=(), **layer_kwargs):
    """Context manager: every ``nn.Dense`` call whose *absolute* module path matches runs as ``layer``.

    Paths are relative to the top-level module of the ``init``/``apply`` being run::

        with swap_context(["*mlp*"], method="ste"):
            y = model.apply(variables, x)

    At exit it warns about matching layers that are not ``nn.Dense`` (left dense) and glob patterns
    that matched no Dense.
    """
    _check_layer(layer, layer_kwargs)
    match = _matcher(patterns)
    log = _SwapLog()
    with nn.intercept_methods(_dense_interceptor(match, layer, layer_kwargs, 0, _exclude_matcher(exclude), log)):
        yield
    _report(log, patterns if callable(patterns) else _as_globs(patterns, "patterns"), require_swap=False,
            where="swap_context")


class SwappedModule(nn.Module):
    """A model whose matching ``nn.Dense`` layers run as ``layer`` (see :func:`swap_dense`).

    Same variable tree as ``module``; calling it calls ``module``.

    Attributes:
      module: the wrapped (original) model.
      patterns: tuple of glob patterns, or a ``where(path, module) -> bool`` callable.
      layer: replacement layer class (``Sparse24Dense`` or ``SemiSparseActivationDense``).
      layer_kwargs: extra fields of ``layer`` as a tuple of ``(name, value)`` pairs.
      exclude: tuple of glob patterns of Dense paths that stay dense.
    """

    module: nn.Module
    patterns: Any = ()
    layer: Any = Sparse24Dense
    layer_kwargs: tuple = ()
    exclude: tuple = ()

    def setup(self):
        nn.share_scope(self, self.module)

    def _interceptor(self, log: Optional[_SwapLog] = None):
        return _dense_interceptor(_matcher(self.patterns), self.layer, dict(self.layer_kwargs), len(self.path),
                                  _exclude_matcher(self.exclude), log)

    def __call__(self, *args, **kwargs):
        log = _SwapLog()
        with nn.intercept_methods(self._interceptor(log)):
            out = self.module(*args, **kwargs)
        _report(log, self.patterns, require_swap=True, where="swap_dense")
        return out

    def invoke(self, method_name: str, *args, **kwargs):
        """Call ``module.<method_name>(*args, **kwargs)`` with the layers swapped."""
        with nn.intercept_methods(self._interceptor()):
            return getattr(self.module, method_name)(*args, **kwargs)


def swap_dense(module: nn.Module, patterns: Patterns, *, layer: type = Sparse24Dense, exclude=(),
               **layer_kwargs) -> SwappedModule:
    """Return ``module`` with the ``nn.Dense`` layers matching ``patterns`` replaced by ``layer``.

    The parameter tree is unchanged (the replacement uses each Dense's ``kernel``/``bias``);
    ``layer`` state such as 2:4 masks lives in the ``"sparsity"`` collection at the Dense's path
    (create it from existing params with :func:`init_sparsity`). :func:`unswap` returns the
    original module.

    Args:
      module: an (unbound) Flax linen model.
      patterns: glob pattern(s) over ``/``-joined module paths relative to ``module``, or a
        callable ``where(path, dense_module) -> bool``.
      layer: replacement class with the ``nn.Dense`` fields; default
        :class:`jax_sparse24.nn.Sparse24Dense`.
      exclude: glob pattern(s) of Dense paths to leave dense even where ``patterns`` match (e.g.
        ``exclude=["head"]`` for a classifier whose outputs are not a multiple of 4).
      **layer_kwargs: extra fields of ``layer`` (e.g. ``method="srste", mvue=True``).

    >>> import jax, jax.numpy as jnp
    >>> from flax import linen as nn
    >>> class MLP(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         return nn.Dense(4, name="out")(nn.relu(nn.Dense(8, name="fc")(x)))
    >>> x = jnp.ones((2, 8))
    >>> params = MLP().init(jax.random.key(0), x)["params"]
    >>> sparse = swap_dense(MLP(), "fc", method="ste")
    >>> v = sparse.init(jax.random.key(0), x)
    >>> jax.tree_util.tree_map(jnp.shape, v["params"]) == jax.tree_util.tree_map(jnp.shape, params)
    True
    >>> y = sparse.apply({"params": params}, x)     # fc now runs with a 2:4 weight
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"swap_dense: expected a flax.linen Module, got {type(module).__name__}")
    _check_layer(layer, layer_kwargs)
    _matcher(patterns)  # validate
    if not callable(patterns):
        patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    exclude = tuple(_as_globs(exclude, "exclude")) if exclude else ()
    return SwappedModule(module=module, patterns=patterns, layer=layer, layer_kwargs=tuple(sorted(layer_kwargs.items())),
                         exclude=exclude)


def unswap(module: nn.Module) -> nn.Module:
    """The original model of a :func:`swap_dense` result (its params work unchanged)."""
    if not isinstance(module, SwappedModule):
        raise TypeError(f"unswap: expected a module returned by swap_dense, got {type(module).__name__}")
    return module.module


def init_sparsity(model: nn.Module, params, *args, method=None, **kwargs):
    """The ``"sparsity"`` collection of ``model`` computed from existing ``params``.

    Runs ``model.apply`` once with ``params`` and a mutable ``"sparsity"`` collection, so masks
    (and S-STE β) are derived from the given — e.g. pretrained — kernels. Returns ``{}`` if the
    model has no sparse layers that keep state.
    """
    apply_kwargs = {} if method is None else {"method": method}
    _, state = model.apply({"params": params}, *args, mutable=[SPARSITY], **apply_kwargs, **kwargs)
    return dict(state.get(SPARSITY, {}))
