"""The ``"sparsity"`` collection of the linen layers: masks, their refresh, flip rates, layouts.

:class:`~jax_sparse24.nn.Sparse24Dense` keeps its sparsity state — the ``srste`` mask, its refresh
period, the ``soft`` scale β — in the non-parameter collection :data:`SPARSITY`, never in
``params``, so optimizers and checkpoints of ``params`` are unchanged. The functions here read and
update that collection next to the model's ``params``:

* a train step: :func:`masks_for_params` (the ``masks=`` of
  :func:`jax_sparse24.optim.masked_decay`), :func:`refresh_masks` (after the update; returns the
  flip rate), :func:`mask_periods` / :func:`refresh_due` (a refresh in a program of its own),
  :func:`check_sparsity` (a collection handed in by the user);
* measuring: :func:`layer_flip_rates`, :func:`kernel_flip_rate` / :func:`kernel_masks` (layers
  whose mask is recomputed from the kernel);
* deploying and switching to dense: :func:`apply_sparsity`, :func:`sparse_weights`,
  :func:`prune_to_masks`, :func:`zero_pruned`;
* scanned layers: :func:`stack_layers` / :func:`unstack_layers` convert a tree (variables,
  optimizer or train state) between the unrolled and the ``nn.scan`` layouts.

A stack of layers under ``nn.scan`` keeps every collection stacked along a leading layer axis
(``kernel (L, in, out)`` with ``mask (L, in, out)``, ``mask_every (L,)``); the functions work per
layer: the 2:4 groups run along ``in`` (axis -2), a transposable mask is per ``(in, out)`` slice,
each layer refreshes on its own period, :func:`layer_flip_rates` gives one rate per layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24 import optim as _optim
from jax_sparse24._src import layer as _layer
from jax_sparse24._src import ops as _ops
from jax_sparse24._src import validation as _validation
from jax_sparse24._src.tree_paths import path_str, path_tuple

__all__ = [
    "SPARSITY",
    "MASK",
    "TRANSPOSABLE_MASK",
    "MASK_EVERY",
    "BETA",
    "srste_layers",
    "check_sparsity",
    "refresh_masks",
    "layer_flip_rates",
    "mask_periods",
    "refresh_due",
    "masks_for_params",
    "apply_sparsity",
    "sparse_weights",
    "prune_to_masks",
    "zero_pruned",
    "kernel_flip_rate",
    "kernel_masks",
    "stack_layers",
    "unstack_layers",
]

#: Name of the Flax collection holding masks, β and refresh periods.
SPARSITY = "sparsity"
#: A layer's entries in the collection: the 2:4 mask along ``in`` (``srste``, ``transposable=False``),
MASK = "mask"
#: the transposable mask, 2:4 along ``in`` and ``out`` (``srste``, ``transposable=True``),
TRANSPOSABLE_MASK = "transposable_mask"
#: the refresh period of an ``srste`` mask (optimizer steps),
MASK_EVERY = "mask_every"
#: and the frozen scale β of a ``soft`` (S-STE) layer.
BETA = "beta"


def _mask_name(layer) -> str:
    return TRANSPOSABLE_MASK if TRANSPOSABLE_MASK in layer else MASK


def srste_layers(sparsity):
    """Yield ``(layer_path, layer)`` for every ``srste`` layer of a sparsity collection: its module path
    (a tuple of keys) and its entries (:data:`MASK` or :data:`TRANSPOSABLE_MASK`, :data:`MASK_EVERY`)."""
    def walk(node, path):
        if isinstance(node, dict) or hasattr(node, "items"):
            keys = set(node.keys())
            if keys & {TRANSPOSABLE_MASK, MASK}:
                yield path, node
                return
            for k, child in node.items():
                yield from walk(child, path + (k,))
    yield from walk(sparsity, ())


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    if not path:
        return value
    out = dict(tree)
    out[path[0]] = _set(tree[path[0]], path[1:], value)
    return out


def refresh_masks(params, sparsity, *, step=None, skip_idle: bool = True):
    """Recompute every ``srste`` mask from the current kernels; return ``(sparsity, flip_rate)``.

    Call once per optimizer step (not per micro-batch) after the update. With ``step`` given a
    layer refreshes only when ``step % mask_every == 0`` (its own period; one ``lax.cond`` for the
    whole model skips the mask computation on steps where no layer refreshes, ``jit``-friendly);
    with ``step=None`` every mask is refreshed.

    The ``lax.cond`` has a price on a GPU: XLA reads a conditional's predicate on the host, which
    waits for the device to reach it, so the queue of launched kernels drains once per step
    (measured: ~0.5% of a GPT-2 124M step on the H200, ``docs/performance.md``). To avoid it, refresh in a
    program of its own that the host runs only on the steps where a layer is due, with
    ``skip_idle=False`` (no conditional)::

        periods = mask_periods(sparsity)                  # host ints, read once
        refresh = jax.jit(lambda p, s, step: refresh_masks(p, s, step=step, skip_idle=False))
        for step in range(n):
            params, opt_state = train_step(params, sparsity, opt_state, step)  # no refresh inside
            if refresh_due(periods, step + 1):
                sparsity, flips = refresh(params, sparsity, step + 1)

    (:meth:`jax_sparse24.training.SparseTrainState.refresh_masks` does this for the train state.)

    Args:
      params: the model's ``params`` (kernels in Flax (in, out) layout).
      sparsity: the model's ``"sparsity"`` collection.
      step: optimizer step (int or scalar array) or ``None``.
      skip_idle: with ``step``, skip the mask computation under a ``lax.cond`` when no layer is
        due (``True``); ``False``: no conditional -- every layer's mask is computed and the due
        layers' kept (same result, for a program run only when some layer is due).

    Returns:
      The new sparsity collection and the flip rate: the fraction of mask entries (over all
      refreshed layers) that changed; 0 when no layer refreshed.
    """
    layers = list(srste_layers(sparsity))
    names = [_mask_name(layer) for _, layer in layers]
    masks, rate = _layer.refresh([_get(params, path)["kernel"] for path, _ in layers],
                                 [layer[name] for (_, layer), name in zip(layers, names)],
                                 [name == TRANSPOSABLE_MASK for name in names],
                                 [layer.get(MASK_EVERY, 1) for _, layer in layers], step, skip_idle=skip_idle)
    new = sparsity
    for (path, layer), name, mask in zip(layers, names, masks):
        layer_new = dict(layer)
        layer_new[name] = mask
        new = _set(new, path, layer_new)
    return new, rate


def layer_flip_rates(old_sparsity, new_sparsity) -> dict:
    """The flip rate of each ``srste`` layer between two versions of the sparsity collection (e.g.
    before and after :func:`refresh_masks`): ``{"a/b/c": rate}``, keyed by the layer's module path.

    A layer of a stack (``nn.scan``'s, masks ``(L, in, out)``) has one rate per layer, shape ``(L,)``;
    other layers a scalar. The rate is the fraction of the layer's mask entries that differ (0 for a
    layer that was not due). :func:`refresh_masks` returns the rate over all refreshed layers.

    >>> import jax.numpy as jnp
    >>> old = {"fc": {"mask": jnp.array([[True], [True], [False], [False]])}}
    >>> new = {"fc": {"mask": jnp.array([[True], [False], [False], [True]])}}
    >>> float(layer_flip_rates(old, new)["fc"])
    0.5
    """
    new_layers = dict(srste_layers(new_sparsity))
    rates = {}
    for path, layer in srste_layers(old_sparsity):
        name = _mask_name(layer)
        key = "/".join(map(str, path))
        if path not in new_layers or name not in new_layers[path]:
            raise ValueError(f"layer_flip_rates: new_sparsity has no '{key}/{name}'")
        old, new = layer[name], new_layers[path][name]
        if np.shape(old) != np.shape(new) or np.ndim(old) < 2:
            raise ValueError(f"layer_flip_rates: the masks of '{key}' must have the same (..., in, out) shape, got "
                             f"{np.shape(old)} and {np.shape(new)}")
        rates[key] = jnp.mean(old != new, axis=(-2, -1), dtype=jnp.float32)
    return rates


def mask_periods(sparsity) -> tuple:
    """The distinct ``srste`` mask refresh periods (``mask_every``) of a sparsity collection, as
    sorted Python ints; ``()`` without ``srste`` layers.

    A host read of the collection's period entries: call it once, outside ``jit`` (the periods
    never change), and decide each step with :func:`refresh_due` -- reading them every step
    would wait for the previous step to finish.

    Raises:
      ValueError: called on traced values (inside ``jit``).
    """
    periods = set()
    for path, layer in srste_layers(sparsity):
        every = layer.get(MASK_EVERY, 1)
        try:
            # (a stack of layers, e.g. nn.scan's, holds one period per layer)
            periods.update(max(1, int(p)) for p in np.ravel(np.asarray(every)))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
            raise ValueError(
                f"mask_periods: the refresh period of '{'/'.join(map(str, path))}' is traced; call mask_periods "
                "outside jit, once, on the sparsity collection of model.init(...) or of the train state"
            ) from None
    return tuple(sorted(periods))


def refresh_due(periods, step: int) -> bool:
    """Whether some layer with a refresh period in ``periods`` (:func:`mask_periods`) refreshes at
    optimizer step ``step`` (``step % period == 0``, the rule of :func:`refresh_masks`): the host's
    side of a refresh run in its own program."""
    return any(int(step) % int(p) == 0 for p in periods)


def masks_for_params(params, sparsity, *, sparse=True):
    """A params-shaped tree with the ``srste`` mask at each such layer's ``kernel`` and ``None`` elsewhere.

    This is what :func:`jax_sparse24.optim.masked_decay` takes as ``masks=``. ``sparse``: whether the
    model ran sparse (a bool or a traced bool scalar); where it ran dense the masks are all ones, so
    nothing is decayed.
    """
    masks = {path: layer[_mask_name(layer)] for path, layer in srste_layers(sparsity)}
    if sparse is False:
        masks = {path: jnp.ones_like(m) for path, m in masks.items()}
    elif sparse is not True:
        flag = jnp.asarray(sparse)
        masks = {path: jnp.where(flag, m, jnp.ones_like(m)) for path, m in masks.items()}

    def pick(path, leaf):
        p = path_tuple(path)
        if p and p[-1] == "kernel" and p[:-1] in masks:
            return masks[p[:-1]]
        return None

    return jax.tree_util.tree_map_with_path(pick, params)


def check_sparsity(params, sparsity, owner: str = "check_sparsity") -> None:
    """Check a sparsity collection against its ``params`` once, on the host.

    Every ``srste`` layer has a kernel of its mask's shape in ``params``, its (concrete) mask is 2:4
    along ``in`` (and along ``out`` for a transposable one), per layer of a stack, and its refresh
    period is at least 1. The layers trust their collection's masks (no device check in the step):
    check a collection edited or loaded by the user before training with it. Traced values are not
    checked.

    Raises:
      ValueError: naming ``owner`` and the layer.
    """
    for path, layer in srste_layers(sparsity):
        name = _mask_name(layer)
        try:
            kernel = _get(params, path)["kernel"]
        except (KeyError, TypeError, IndexError):
            raise ValueError(
                f"{owner}: the sparsity collection has a 2:4 layer at '{path_str(path)}' but params has no "
                f"'{path_str(path + ('kernel',))}': pass the 'params' and 'sparsity' collections of the same "
                "model.init(...)") from None
        if np.shape(kernel) != np.shape(layer[name]):
            raise ValueError(
                f"{owner}: the mask of '{path_str(path)}' has shape {np.shape(layer[name])} but its kernel "
                f"{np.shape(kernel)}: pass the 'params' and 'sparsity' collections of the same model.init(...)")
        where = f"{owner}: sparsity '{path_str(path + (name,))}'"
        _validation.check_concrete_mask_on_device(layer[name], 2, 4, -2, where, name, axis_name="in")
        if name == TRANSPOSABLE_MASK:
            _validation.check_concrete_mask_on_device(layer[name], 2, 4, -1, where, name,
                                                      axis_name="out, transposable")
        try:  # (a stack of layers, nn.scan's, has one period per layer)
            every = None if MASK_EVERY not in layer else int(np.min(np.asarray(layer[MASK_EVERY])))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError, ValueError):
            every = None  # traced: not checked
        if every is not None and every < 1:
            raise ValueError(
                f"{owner}: '{path_str(path)}' has mask_every={every}; the mask refresh period must be a "
                "positive number of optimizer steps (Sparse24Dense(mask_every=...))")


def apply_sparsity(params, sparsity):
    """Params with every ``srste`` kernel multiplied by its mask from the ``sparsity`` collection (the
    deployed sparse weights). (:func:`jax_sparse24.prune.apply_masks` zeroes a tree where a tree of masks
    says so.)"""
    masks = {}
    for path, layer in srste_layers(sparsity):
        masks[path] = layer[_mask_name(layer)]

    def apply(path, leaf):
        p = path_tuple(path)
        if p and p[-1] == "kernel" and p[:-1] in masks:
            return jnp.where(masks[p[:-1]], leaf, jnp.zeros((), leaf.dtype))
        return leaf

    return jax.tree_util.tree_map_with_path(apply, params)


def _layer_paths(paths, op: str) -> list:
    """Module paths given as a list of key tuples or ``"a/b"`` strings, as a list of tuples."""
    if isinstance(paths, (str, tuple)):
        raise ValueError(f"{op}: paths must be a list of layer paths, got {paths!r}; wrap a single path in a list")
    return [tuple(p.strip("/").split("/")) if isinstance(p, str) else tuple(p) for p in paths]


def sparse_weights(params, sparsity, *, method: str, paths):
    """Params with the kernels of the given 2:4 layers replaced by the weights their sparse forward
    pass computes with, as dense ``(in, out)`` arrays (zeros at the pruned positions).

    ``method="srste"``: ``kernel ⊙ mask`` (the stored mask, as :func:`apply_sparsity`); ``"ste"``:
    ``kernel ⊙ mask24(kernel)`` along ``in``; ``"soft"`` (S-STE): ``β·S(kernel)``, the soft-thresholded
    kernel times the layer's frozen β from ``sparsity``. For a switch to dense training that starts
    from the function the 2:4 model computed (the example's ``--finetune-start masked``): for
    ``soft`` the plain kernel is not that function at all (S subtracts each group's threshold and β
    rescales), so a dense phase from the raw kernels starts elsewhere.

    Args:
      params: the model's params.
      sparsity: the ``"sparsity"`` collection (β of ``soft`` layers, masks of ``srste`` ones).
      method: the layers' :class:`Sparse24Dense` method.
      paths: module paths of the layers (tuples of keys or ``"a/b"`` strings), each with a
        ``kernel`` ``(in, out)``.

    Returns:
      ``(new_params, masks)``: masks is a params-shaped tree with each replaced kernel's 2:4 mask
      (bool) and ``None`` elsewhere.
    """
    if method not in ("srste", "ste", "soft"):
        raise ValueError(f"sparse_weights: method must be 'srste', 'ste' or 'soft', got {method!r}")
    paths = _layer_paths(paths, "sparse_weights")
    stored = dict(srste_layers(sparsity)) if method == "srste" else {}
    new_params, masks = params, jax.tree.map(lambda _: None, params)
    for path in paths:
        try:
            kernel = _get(params, path + ("kernel",))
        except (KeyError, TypeError):
            raise ValueError(f"sparse_weights: no kernel at {'/'.join(path)} in params") from None
        zero = jnp.zeros((), kernel.dtype)
        if method == "srste":
            if path not in stored:
                raise ValueError(f"sparse_weights: no srste mask for {'/'.join(path)} in sparsity")
            layer = stored[path]
            mask = layer[_mask_name(layer)]
            w = jnp.where(mask, kernel, zero)
        elif method == "ste":
            mask = _ops.mask24(kernel, axis=-2)
            w = jnp.where(mask, kernel, zero)
        else:
            try:
                beta = _get(sparsity, path + (BETA,))
            except (KeyError, TypeError):
                raise ValueError(f"sparse_weights: no S-STE beta for {'/'.join(path)} in sparsity") from None
            if kernel.ndim < 2 or np.shape(beta) != kernel.shape[:-2]:
                raise ValueError(f"sparse_weights: soft kernels must be (in, out) (or a stack (L, in, out) with "
                                 f"one beta per layer), got kernel {kernel.shape} and beta {np.shape(beta)} at "
                                 f"{'/'.join(path)}")
            soft = _layer.soft_weight
            for _ in range(kernel.ndim - 2):  # a stack of layers (nn.scan): each (in, out) slice with its beta
                soft = jax.vmap(soft)
            w, mask = soft(kernel, beta)
        new_params = _set(new_params, path + ("kernel",), w)
        masks = _set(masks, path + ("kernel",), mask)
    return new_params, masks


def prune_to_masks(params, sparsity, *, method: str | None = None, paths=None):
    """The 2:4 kernels set to the weights the sparse forward pass uses: ``(params, sparsity, masks)``.

    For a switch to dense training that starts from exactly the function the 2:4 model computed.
    Without ``method``: every ``srste`` kernel becomes ``kernel ⊙ mask`` (as :func:`apply_sparsity`).
    With ``method`` and ``paths``: the layers at ``paths`` of that method, as :func:`sparse_weights`
    (``"ste"``, ``"soft"``: masks not stored); the ``soft`` layers' β become 1 in the returned
    collection (with β = 1 the soft threshold of the new kernels is the kernels themselves), so
    pruning twice changes nothing. ``masks`` is the params-shaped tree of the masks used (``None``
    elsewhere), for :func:`zero_pruned`.
    """
    if (method is None) != (paths is None):
        raise ValueError("prune_to_masks: pass method and paths together (or neither, for srste's stored masks)")
    if method is None:
        masks = masks_for_params(params, sparsity)
        return zero_pruned(params, masks), sparsity, masks
    params, masks = sparse_weights(params, sparsity, method=method, paths=paths)
    if method == "soft":
        for path in _layer_paths(paths, "prune_to_masks"):
            sparsity = _set(sparsity, path + (BETA,), jnp.ones_like(_get(sparsity, path + (BETA,))))
    return params, sparsity, masks


def zero_pruned(tree, masks):
    """``tree`` with zeros where ``masks`` (params-shaped, ``None`` for unmasked leaves) prune: ``tree``
    itself if it has the params' structure, else every params-shaped subtree of it (e.g. Adam's
    ``mu`` and ``nu`` inside an optimizer state; other leaves pass)."""
    is_none = lambda x: x is None  # noqa: E731
    params_def = jax.tree.structure(jax.tree.map(lambda _: 0, masks, is_leaf=is_none))

    def prune(t):
        return jax.tree.map(lambda m, x: x if m is None else jnp.where(m, x, jnp.zeros((), x.dtype)), masks, t,
                            is_leaf=is_none)

    def is_params(x):
        return not isinstance(x, (jax.Array, np.ndarray)) and jax.tree.structure(x) == params_def

    return jax.tree.map(lambda x: prune(x) if is_params(x) else x, tree, is_leaf=is_params)


def _kernel_paths(params) -> list:
    """Layer paths (tuples) of every ``kernel`` leaf of at least 2 dimensions, in tree order."""
    found = []

    def visit(path, leaf):
        p = path_tuple(path)
        if p and p[-1] == "kernel" and np.ndim(leaf) >= 2:
            found.append(p[:-1])
        return leaf

    jax.tree_util.tree_map_with_path(visit, params)
    return found


def kernel_flip_rate(old_params, new_params, paths=None):
    """Fraction of 2:4 mask entries that changed between two versions of the kernels.

    For layers whose 2:4 mask is not stored but recomputed from the kernel on every call
    (``method="ste"`` and ``"soft"`` — S-STE's soft threshold keeps the same 2 of 4 entries — and
    AST's :class:`jax_sparse24.distill.Sparse24LowRankDense`): the mask is the 2:4 magnitude mask
    along ``in`` (:func:`jax_sparse24.mask24` of the ``(in, out)`` kernel on axis ``-2``), and its
    flip rate across an optimizer update is this function of the params before and after it.
    (``srste`` layers keep their masks in the ``"sparsity"`` collection; their flip rate is what
    :func:`refresh_masks` returns.)

    ::

        new_params = optax.apply_updates(params, updates)
        flip = kernel_flip_rate(params, new_params, paths=[("h_0", "mlp", "fc"), ...])

    It computes two masks per kernel. To log it every ``n`` steps only, either put it under
    ``lax.cond((step + 1) % n == 0, ...)`` in the step (a conditional costs a host round trip per
    step on a GPU, see :func:`refresh_masks`), or keep the step free of it: on logging steps take
    ``old = kernel_masks(params, paths)`` before the step (1 byte per entry instead of the old
    params) and ``kernel_flip_rate(old, new_params, paths)`` after it, each a small program.

    Args:
      old_params, new_params: params trees of the same structure (e.g. before and after
        ``optax.apply_updates``); only the compared kernels are read, so trees holding just those
        (``{"h_0": {"mlp": {"fc": {"kernel": k}}}}``) work too. ``old_params`` may hold the old
        masks instead of the old kernels (:func:`kernel_masks`: a bool ``kernel`` leaf is taken as
        the mask).
      paths: the layers to compare: module paths in ``params`` (tuples of keys, or ``"a/b"``
        strings), each with a ``kernel`` of shape ``(..., in, out)``, ``in % 4 == 0``. ``None``:
        every ``kernel`` of 2 or more dimensions in ``old_params`` — pass ``paths`` when the model
        also has dense layers (a dense head's kernel would otherwise count too).

    Returns:
      A float32 scalar in [0, 1]: changed mask entries summed over the layers, divided by their
      total number of entries (0 when there is no layer).

    Raises:
      ValueError: a path with no ``kernel`` in either tree, kernels of different shapes, or an
        ``in`` dimension not divisible by 4.

    >>> import jax.numpy as jnp
    >>> old = {"fc": {"kernel": jnp.array([[4.0], [3.0], [1.0], [0.0]])}}
    >>> new = {"fc": {"kernel": jnp.array([[4.0], [0.0], [1.0], [3.0]])}}
    >>> float(kernel_flip_rate(old, new))  # [T, T, F, F] -> [T, F, F, T]: 2 of 4 entries changed
    0.5
    """
    if paths is None:
        paths = _kernel_paths(old_params)
    else:
        paths = _layer_paths(paths, "kernel_flip_rate")
    flips, total = jnp.zeros((), jnp.float32), 0
    for path in paths:
        kernels = []
        for name, tree in (("old_params", old_params), ("new_params", new_params)):
            try:
                kernels.append(_get(tree, path)["kernel"])
            except (KeyError, TypeError, IndexError):
                raise ValueError(f"kernel_flip_rate: {name} has no '{'/'.join(map(str, path + ('kernel',)))}'") from None
        old, new = kernels
        if np.shape(old) != np.shape(new) or np.ndim(old) < 2:
            raise ValueError(f"kernel_flip_rate: the kernels at '{'/'.join(map(str, path))}' must have the same "
                             f"(..., in, out) shape, got {np.shape(old)} and {np.shape(new)}")
        axis = np.ndim(old) - 2
        old_mask = old if jnp.result_type(old) == jnp.bool_ else _kernel_mask(old, path, "kernel_flip_rate")
        flips = flips + jnp.sum(old_mask != _kernel_mask(new, path, "kernel_flip_rate"), dtype=jnp.float32)
        total += int(np.size(old))
    return flips / max(total, 1)


def _check_kernel(kernel, path, op: str):
    """ValueError unless ``kernel`` is ``(..., in, out)`` with ``in`` divisible by 4 (whole 2:4 groups)."""
    if np.ndim(kernel) < 2 or np.shape(kernel)[-2] % 4:
        raise ValueError(f"{op}: the kernel at '{'/'.join(map(str, path))}' must have shape (..., in, out) with "
                         f"in divisible by 4 (whole 2:4 groups), got {np.shape(kernel)}")


def _kernel_mask(kernel, path, op: str):
    """The 2:4 magnitude mask of an ``(..., in, out)`` kernel along ``in``."""
    _check_kernel(kernel, path, op)
    return _ops.mask24(kernel, axis=np.ndim(kernel) - 2)


def kernel_masks(params, paths=None):
    """The 2:4 magnitude masks of the kernels of the layers ``paths``, as a tree holding just them
    (``{"h_0": {"mlp": {"fc": {"kernel": bool mask}}}}``): the ``old_params`` of :func:`kernel_flip_rate`
    for a flip rate measured across an update without keeping the old params.

    A thin alias of :func:`jax_sparse24.optim.magnitude_masks` (the one way to make the 2:4 magnitude
    masks of a params tree) that selects the layers by path and keeps just their kernels.

    Args:
      params: a params tree.
      paths: the layers, as for :func:`kernel_flip_rate` (``None``: every kernel of 2 or more
        dimensions).
    """
    paths = _kernel_paths(params) if paths is None else _layer_paths(paths, "kernel_masks")
    kernels: dict = {}
    for path in paths:
        try:
            kernel = _get(params, path)["kernel"]
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"kernel_masks: params has no '{'/'.join(map(str, path + ('kernel',)))}'") from None
        _check_kernel(kernel, path, "kernel_masks")
        node = kernels
        for k in path:
            node = node.setdefault(k, {})
        node["kernel"] = kernel
    return _optim.magnitude_masks(kernels, where=lambda path, leaf: True)


# --------------------------------------------------------------------------------------------------
# Scanned <-> unrolled layouts
# --------------------------------------------------------------------------------------------------


def _is_mapping(x) -> bool:
    return hasattr(x, "keys") and hasattr(x, "items") and not isinstance(x, (jax.Array, np.ndarray))


def _relayout(tree, has_layers, convert, op: str):
    """``tree`` with every mapping for which ``has_layers(mapping)`` holds replaced by ``convert(mapping)``
    (the top-most such mappings; other pytree nodes — optimizer states, train states — pass through)."""
    hits = [0]

    def is_leaf(x):
        return _is_mapping(x) and has_layers(x)

    def fn(x):
        if is_leaf(x):
            hits[0] += 1
            return convert(x)
        return x

    out = jax.tree_util.tree_map(fn, tree, is_leaf=is_leaf)
    return out, hits[0]


def stack_layers(tree, names, name: str):
    """Convert a tree from the unrolled layout (one entry per layer, ``names``) to the scanned one (one
    entry ``name`` whose leaves are stacked along a new leading layer axis), as ``nn.scan`` with
    ``variable_axes={...: 0}`` lays out its variables.

    Works on any pytree holding such mappings — a variables dict, a ``params`` or ``sparsity``
    collection, an optimizer state, a :class:`~jax_sparse24.training.SparseTrainState` — wherever a
    mapping has every key of ``names``. E.g. ``stack_layers(params, [f"h_{i}" for i in range(n)], "h")``.

    Raises:
      ValueError: no mapping has all of ``names``, or a mapping also has ``name``, or the layers'
        trees differ in structure or shapes.
    """
    names = list(names)
    if not names or isinstance(names, str):
        raise ValueError(f"stack_layers: names must be a non-empty list of the layers' keys, got {names!r}")

    def convert(d):
        if name in d:
            raise ValueError(f"stack_layers: a mapping has both the per-layer keys {names[:2]}... and the stacked "
                             f"key {name!r}")
        layers = [d[n] for n in names]
        try:
            stacked = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *layers)
        except (ValueError, TypeError) as e:
            raise ValueError(f"stack_layers: the layers {names[0]!r}...{names[-1]!r} differ in structure or "
                             f"shapes: {e}") from None
        out = {k: v for k, v in d.items() if k not in names}
        out[name] = stacked
        return type(d)(out) if not isinstance(d, dict) else out

    out, hits = _relayout(tree, lambda d: all(n in d for n in names), convert, "stack_layers")
    if not hits:
        raise ValueError(f"stack_layers: no mapping in the tree has the per-layer keys {names[0]!r}...{names[-1]!r} "
                         "(is it already in the scanned layout?)")
    return out


def unstack_layers(tree, name: str, names):
    """The inverse of :func:`stack_layers`: every mapping's entry ``name`` (leaves with a leading layer
    axis of length ``len(names)``) split into one entry per layer, keyed ``names``.

    Raises:
      ValueError: no mapping has ``name``, or a leaf's leading axis is not ``len(names)``.
    """
    names = list(names)
    if not names or isinstance(names, str):
        raise ValueError(f"unstack_layers: names must be a non-empty list of the layers' keys, got {names!r}")

    def convert(d):
        stacked = d[name]
        for leaf in jax.tree_util.tree_leaves(stacked):
            if np.ndim(leaf) < 1 or np.shape(leaf)[0] != len(names):
                raise ValueError(f"unstack_layers: a leaf of {name!r} has shape {np.shape(leaf)}; a stack of "
                                 f"{len(names)} layers needs a leading axis of {len(names)}")
        out = {k: v for k, v in d.items() if k != name}
        for i, n in enumerate(names):
            if n in out:
                raise ValueError(f"unstack_layers: a mapping has both {name!r} and the per-layer key {n!r}")
            out[n] = jax.tree.map(lambda x: x[i], stacked)
        return type(d)(out) if not isinstance(d, dict) else out

    out, hits = _relayout(tree, lambda d: name in d, convert, "unstack_layers")
    if not hits:
        raise ValueError(f"unstack_layers: no mapping in the tree has the stacked key {name!r} (is it already in "
                         "the unrolled layout?)")
    return out
