"""Helpers to run 2:4 sparse training on several devices (data and Megatron tensor parallel).

The 2:4 ops and :func:`jax_sparse24.sparse24_linear` partition by themselves under ``jit`` with
``NamedSharding`` and inside ``shard_map`` (see ``jax_sparse24/_src/partitioning.py`` for the rules).
What a training script still has to say is *where the parameters and the batch live*; this module
builds those shardings:

* :func:`make_mesh` — a mesh from ``"data=2,model=4"`` (``-1`` takes the remaining devices), with
  ``Auto`` axes (``jax.make_mesh`` defaults to ``Explicit`` axes in recent JAX).
* :func:`param_shardings` — ``NamedSharding`` for every leaf of a tree (params, the
  ``"sparsity"`` collection, optimizer state) from path-pattern rules; 2:4 masks follow their
  kernels; shards that would split a 4-group raise ``ValueError`` here, before compiling.
* :func:`megatron_mlp_rules` — the rules of a Megatron FFN: up-projection ``W1 (in, out)``
  sharded on ``out`` (column parallel), down-projection ``W2`` on ``in`` (row parallel, psum).
* :func:`fsdp_spec` / ``param_shardings(..., fsdp="fsdp")`` — FSDP (ZeRO-3): every ≥2-D leaf
  (params, their optimizer state, 2:4 masks; gradients follow) also sharded over the ``fsdp`` axis
  on its largest axis that splits evenly (as MaxText does), 4-groups along ``in`` whole per shard;
  combines with the tensor-parallel specs of the rules. Under ``jit`` XLA gathers each weight for
  its layer and reduce-scatters its gradient.
* ``param_shardings(..., stacked=regex)`` — leaves of scanned layers (a leading layer axis,
  ``(L, in, out)``): the rules describe one layer, the leading axis stays unsharded.
* :func:`shard_batch` — put a (per-process) batch on the mesh, sharded on its leading axis.
* :func:`batch_sharded_activations` — under FSDP, keep a Flax Linen model's activations on the batch
  sharding (the blocks' inputs and outputs, and the token axis of every linear layer's), so that XLA
  gathers each weight for its layer instead of moving activations to match the weight's sharding.
* :func:`weight_gather` — how a 2:4 GEMM gathers an FSDP-sharded weight: ``"packed"`` (default; the
  op gathers the kept values and the mask bits, 0.5625 of the bfloat16 weight's bytes) or
  ``"dense"`` (XLA gathers the weight and its ``bool`` mask: 1.5 times its bytes). The same result
  either way for 2:4 masks.

>>> import jax, jax.numpy as jnp
>>> from jax.sharding import PartitionSpec as P
>>> mesh = make_mesh("data=1,model=1", devices=jax.devices()[:1])
>>> params = {"mlp": {"fc1": {"kernel": jnp.zeros((8, 32)), "bias": jnp.zeros(32)},
...                   "fc2": {"kernel": jnp.zeros((32, 8)), "bias": jnp.zeros(8)}}}
>>> sh = param_shardings(params, mesh, megatron_mlp_rules("fc1", "fc2"))
>>> [tuple(sh["mlp"][k][n].spec) for k, n in [("fc1", "kernel"), ("fc2", "kernel"), ("fc2", "bias")]]
[(None, 'model'), ('model', None), ()]
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sparse24._src import partitioning as _impl
from jax_sparse24._src.tree_paths import path_str
from jax_sparse24._src.partitioning import WEIGHT_GATHERS, weight_gather

__all__ = [
    "make_mesh",
    "param_shardings",
    "megatron_mlp_rules",
    "fsdp_spec",
    "check_leaf_sharding",
    "shard_batch",
    "batch_sharded_activations",
    "weight_gather",
    "WEIGHT_GATHERS",
    "path_str",
    "MASK_NAMES",
]

#: Leaf names of 2:4 masks in the ``"sparsity"`` collection (see :mod:`jax_sparse24.nn`).
MASK_NAMES = ("transposable_mask", "mask")
#: Leaf names whose axis 0 is the contraction axis of a 2:4 GEMM (groups of 4 along ``in``).
_GROUPED_IN = ("kernel",) + MASK_NAMES

Rules = Sequence[tuple[str, P]]


def make_mesh(spec: str | Mapping[str, int] = "data=-1", *, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``Mesh`` with ``Auto`` axes from ``"data=2,model=4"`` or ``{"data": 2, "model": 4}``.

    One axis may be ``-1``: it takes all remaining devices. The product must equal the number of
    devices used (``devices``, default ``jax.devices()``, all processes' devices on multi-host).

    >>> make_mesh("data=-1").axis_names
    ('data',)
    """
    if isinstance(spec, str):
        items = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            if "=" not in part:
                raise ValueError(f"make_mesh: expected 'name=size' items like 'data=2,model=4', got {spec!r}")
            name, size = part.split("=", 1)
            items.append((name.strip(), int(size)))
    else:
        items = [(str(k), int(v)) for k, v in spec.items()]
    if not items:
        raise ValueError("make_mesh: the mesh needs at least one axis, e.g. 'data=-1'")
    devices = list(jax.devices() if devices is None else devices)
    names = [n for n, _ in items]
    sizes = [s for _, s in items]
    if len(set(names)) != len(names):
        raise ValueError(f"make_mesh: repeated axis name in {spec!r}")
    if sizes.count(-1) > 1:
        raise ValueError(f"make_mesh: at most one axis may be -1, got {spec!r}")
    if -1 in sizes:
        rest = math.prod(s for s in sizes if s != -1)
        if rest <= 0 or len(devices) % rest:
            raise ValueError(f"make_mesh: {len(devices)} devices cannot be split as {spec!r}")
        sizes[sizes.index(-1)] = len(devices) // rest
    if any(s <= 0 for s in sizes):
        raise ValueError(f"make_mesh: axis sizes must be positive, got {spec!r}")
    n = math.prod(sizes)
    if n != len(devices):
        raise ValueError(
            f"make_mesh: mesh {dict(zip(names, sizes))} needs {n} devices, but {len(devices)} are "
            "available; the axis sizes must multiply to the device count (use -1 for one axis)"
        )
    try:
        from jax.experimental import mesh_utils

        dev = mesh_utils.create_device_mesh(tuple(sizes), devices=devices)
    except Exception:  # pragma: no cover - odd topologies
        dev = np.asarray(devices, dtype=object).reshape(sizes)
    axis_types = (jax.sharding.AxisType.Auto,) * len(names)
    return Mesh(dev, tuple(names), axis_types=axis_types)


def megatron_mlp_rules(up: str, down: str, *, model_axis: str = "model") -> list[tuple[str, P]]:
    """Rules for a Megatron-style FFN (for :func:`param_shardings`).

    ``up`` and ``down`` are regular expressions matching the path of the up- and down-projection
    layers (e.g. ``"mlp/fc1"``, ``r"Dense_0"``). The up kernel ``(in, out)`` and its bias and mask
    are sharded on ``out`` (column parallel: its output stays sharded, no communication); the down
    kernel and mask on ``in`` (row parallel: partial sums and one ``psum``); the down bias is
    replicated. Add a data axis by sharding the batch (:func:`shard_batch`).
    """
    masks = "(" + "|".join(MASK_NAMES) + ")"
    m = model_axis
    return [
        (rf"{up}/kernel$", P(None, m)),
        (rf"{up}/bias$", P(m)),
        (rf"{up}/{masks}$", P(None, m)),
        (rf"{down}/kernel$", P(m, None)),
        (rf"{down}/{masks}$", P(m, None)),
        (rf"{down}/bias$", P()),
    ]


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _group_multiple(leaf_name: str, ndim: int, d: int, lead: int = 0) -> int:
    """The multiple every shard of dimension ``d`` must hold: 4 on ``in`` of a kernel or mask (the
    2:4 groups; ``in`` is the second-to-last axis, after any leading layer axes ``lead``), and on
    ``out`` of a transposable mask (4x4 blocks); 1 elsewhere."""
    if leaf_name not in _GROUPED_IN or ndim - lead != 2:
        return 1
    if d == ndim - 2 or (d == ndim - 1 and leaf_name == "transposable_mask"):
        return _impl.GROUP
    return 1


def check_leaf_sharding(path: str, shape, spec: P, mesh: Mesh, leaf_name: str, lead: int = 0) -> None:
    """Raise ``ValueError`` (naming ``path`` and the constraint) unless ``spec`` fits a leaf of ``shape`` on
    ``mesh``: its axes are the mesh's, each sharded dimension divides evenly, and a 2:4 kernel's or mask's ``in``
    dimension (and a transposable mask's ``out``) keeps whole groups of 4 per shard. ``leaf_name`` is the leaf's
    last path key (``kernel``, ``mask``, ``transposable_mask``, ...); ``lead``: leading stacked-layer axes."""
    if len(spec) > len(shape):
        raise ValueError(f"param_shardings: {path} has shape {tuple(shape)} but its rule gives {spec} "
                         f"with {len(spec)} entries")
    mesh_shape = dict(mesh.shape)
    for d, entry in enumerate(spec):
        axes = _axes(entry)
        for a in axes:
            if a not in mesh_shape:
                raise ValueError(f"param_shardings: {path}: mesh axis {a!r} of {spec} is not in the mesh "
                                 f"{dict(mesh_shape)}")
        n = math.prod(mesh_shape[a] for a in axes)
        if n == 1:
            continue
        size = shape[d]
        m = _group_multiple(leaf_name, len(shape), d, lead)
        if size % (n * m):
            per = f"{size // n}" if size % n == 0 else f"{size}/{n} (uneven)"
            why = (f"every shard of a 2:4 axis must hold a multiple of {m} (groups of {m} consecutive "
                   "elements along `in` are never split across devices)") if m > 1 else \
                "the dimension must split evenly"
            raise ValueError(
                f"param_shardings: {path} has shape {tuple(shape)}; dimension {d} (size {size}) sharded "
                f"{n} ways over mesh axes {axes} (sizes {tuple(mesh_shape[a] for a in axes)}) leaves "
                f"{per} per device, but {why}."
            )


def fsdp_spec(shape, spec: P = P(), mesh: Mesh | None = None, *, axis: str = "fsdp", leaf_name: str = "",
              lead: int = 0, axis_size: int | None = None) -> P:
    """``spec`` (a leaf's tensor-parallel spec, or ``P()``) with the FSDP ``axis`` added: ZeRO-3.

    Leaves of fewer than 2 dimensions (after ``lead`` leading layer axes, which are never sharded:
    a scan slices them) keep ``spec``. Otherwise ``axis`` shards the largest dimension that no
    other mesh axis shards and that splits evenly -- for a 2:4 kernel or mask (``leaf_name`` in
    ``kernel``, ``mask``, ``transposable_mask``) in multiples of 4 per shard on ``in`` and
    ``out``, so a shard holds whole 4-groups and 4x4 blocks; failing that, a dimension already
    sharded (``axis`` added after its axes, so gathering over ``axis`` gives back the
    tensor-parallel shard). If no dimension fits, the leaf keeps ``spec`` (replicated over
    ``axis``; small or odd leaves). Give ``mesh`` or ``axis_size``.

    >>> tuple(fsdp_spec((4096, 11008), P(None, "model"), axis_size=4, leaf_name="kernel"))
    ('fsdp', 'model')
    >>> tuple(fsdp_spec((32, 2048, 5632), P(), axis_size=2, leaf_name="kernel", lead=1))
    (None, None, 'fsdp')
    """
    shape = tuple(int(s) for s in shape)
    sizes = dict(mesh.shape) if mesh is not None else {}
    n = int(axis_size if axis_size is not None else sizes.get(axis, 1))
    entries = [_axes(spec[d]) if d < len(spec) else () for d in range(len(shape))]
    if n == 1 or len(shape) - lead < 2 or any(axis in e for e in entries):
        return spec
    def taken(d):
        return math.prod(sizes.get(a, 1) for a in entries[d]) if mesh is not None else (2 if entries[d] else 1)

    def fits(d):
        if mesh is None and entries[d]:
            return False
        m = _group_multiple(leaf_name, len(shape), d, lead) if leaf_name else 1
        if leaf_name in _GROUPED_IN and len(shape) - lead == 2:
            m = _impl.GROUP  # both axes of a 2:4 kernel/mask: whole 4-groups and 4x4 blocks per shard
        return shape[d] % (taken(d) * n * m) == 0

    own = sorted(range(lead, len(shape)), key=lambda d: (-shape[d], d))
    pick = next((d for d in own if not entries[d] and fits(d)), None)
    if pick is None:
        pick = next((d for d in own if entries[d] and fits(d)), None)
    if pick is None:
        return spec
    entries[pick] = entries[pick] + (axis,)
    return P(*(_entry(e) for e in entries))


def _entry(axes):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def param_shardings(tree, mesh: Mesh, rules: Rules = (), *, default: P = P(),
                    masks_follow_kernels: bool = True, check: bool = True, fsdp: str | None = None,
                    stacked: str | None = None):
    """A tree of ``NamedSharding`` (same structure as ``tree``) from path-pattern rules.

    Each leaf's path is written ``a/b/c`` (dict keys, attribute names, sequence indices, e.g.
    ``params/mlp/fc1/kernel`` or ``1/mu/mlp/fc1/kernel`` inside an optax state) and matched with
    ``re.search`` against the rules in order; the first match gives its ``PartitionSpec``, no match
    gives ``default`` (replicated). A 2:4 mask (``transposable_mask`` / ``mask``) that no rule
    matches gets the spec of its kernel (same path with ``kernel``, ``sparsity`` read as ``params``).
    Scalars are always replicated.

    Args:
      tree: arrays or ``jax.ShapeDtypeStruct`` (e.g. from ``jax.eval_shape(model.init, ...)``).
      mesh: the device mesh.
      rules: ``[(regex, PartitionSpec), ...]``, e.g. :func:`megatron_mlp_rules`.
      default: spec of unmatched leaves.
      masks_follow_kernels: give unmatched masks their kernel's spec.
      check: raise ``ValueError`` when a shard would split a 2:4 group (axis ``in`` of a kernel or
        mask, and ``out`` of a transposable mask) or a dimension does not split evenly.
      fsdp: a mesh axis name (e.g. ``"fsdp"``): every leaf of 2 or more dimensions is also sharded
        over it (:func:`fsdp_spec`: ZeRO-3 -- params, optimizer moments and masks; the gradients
        take the params' shardings under ``jit``). ``None``: no FSDP.
      stacked: a regex; leaves whose path matches carry one leading layer axis (the params of a
        scanned stack, ``(L, in, out)``): their rule specs describe one layer and are applied to
        the trailing dimensions, the layer axis is never sharded.

    Returns:
      The tree of shardings (pass to ``jit``'s ``in_shardings``/``out_shardings`` or
      ``jax.device_put``).
    """
    compiled = [(re.compile(pat), spec) for pat, spec in rules]
    stacked_rx = re.compile(stacked) if stacked else None
    if fsdp is not None and fsdp not in dict(mesh.shape):
        raise ValueError(f"param_shardings: fsdp axis {fsdp!r} is not in the mesh {dict(mesh.shape)}")

    def lookup(p: str):
        for rx, spec in compiled:
            if rx.search(p):
                return spec
        return None

    def one(path, leaf):
        p = path_str(path)
        shape = tuple(np.shape(leaf))
        name = p.rsplit("/", 1)[-1]
        spec = lookup(p)
        if spec is None and masks_follow_kernels and name in MASK_NAMES:
            kp = p[: -len(name)] + "kernel"
            spec = lookup(re.sub(r"(^|/)sparsity/", r"\1params/", kp)) or lookup(kp)
        lead = 1 if stacked_rx is not None and stacked_rx.search(p) and len(shape) >= 1 else 0
        if spec is None or len(shape) == 0:
            spec = default if len(shape) >= len(default) else P()
        elif lead and len(spec) < len(shape):
            spec = P(*((None,) * lead + tuple(spec)))
        if fsdp is not None and len(shape):
            spec = fsdp_spec(shape, spec, mesh, axis=fsdp, leaf_name=name, lead=lead)
        if check:
            check_leaf_sharding(p, shape, spec, mesh, name, lead)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, tree)


def shard_batch(batch, mesh: Mesh, axis: str | Sequence[str] = "data"):
    """Place a batch on ``mesh`` sharded along its leading (batch) axis over ``axis``.

    Single process: ``batch`` is the global batch; it is split over ``axis`` (the leading
    dimension must divide evenly). Multi-host (``jax.process_count() > 1``): ``batch`` is this
    process's part of the global batch (e.g. from a per-process data loader) and the global array
    is assembled with ``jax.make_array_from_process_local_data`` — no host sends its data to
    another.
    """
    axes = _axes(axis)
    n = math.prod(dict(mesh.shape)[a] for a in axes)
    entry = _entry(axes)

    def put(leaf):
        leaf_shape = np.shape(leaf)
        if not leaf_shape:
            return jax.device_put(leaf, NamedSharding(mesh, P()))
        sharding = NamedSharding(mesh, P(entry))
        if jax.process_count() > 1:
            return jax.make_array_from_process_local_data(sharding, np.asarray(leaf))
        if leaf_shape[0] % n:
            raise ValueError(f"shard_batch: the leading dimension {leaf_shape[0]} of a batch leaf of shape "
                             f"{leaf_shape} is not divisible by the {n} devices of mesh axes {axes}")
        return jax.device_put(leaf, sharding)

    return jax.tree_util.tree_map(put, batch)


#: Flax Linen linear layers (class names) whose token axis :func:`batch_sharded_activations` pins
LINEAR_MODULES = r"^(Dense|DenseGeneral|Sparse24Dense|Sparse24LowRankDense)$"


@contextlib.contextmanager
def batch_sharded_activations(mesh: Mesh, batch_axes: str | Sequence[str] = ("data", "fsdp"), *,
                              modules: str = r"Block|MLP|Attention", linear: str | None = LINEAR_MODULES):
    """Inside this context, Flax Linen modules traced keep their activations on the batch sharding.

    Under FSDP a weight and the tokens are split over the same mesh axis. Left to propagation, XLA
    can as well move the activations to match a weight's sharding (all-to-alls of activations in
    every layer) as gather the weight; with a LLaMA MLP on 2 x H100 it chose all-to-alls in the
    backward pass. Pinned activations leave one choice: each layer's weight is all-gathered and its
    gradient reduced back.

    * a linear layer — a module whose class, or one of its base classes, has a name that matches
      ``linear`` (``re.match``; ``None``: no linear layer is pinned) — keeps the token axis (the
      first) of its input and output on ``batch_axes``, its other axes left to the partitioner
      (``P.UNCONSTRAINED``), so a tensor-parallel column shard stays one;
    * any other module whose class or base class name matches ``modules`` (``re.search``) has its
      input and its output constrained to ``P(batch_axes)`` when they are 2-D or 3-D arrays (tokens
      first; the other axes replicated, as a transformer block's are).

    The input is the first positional argument, or the first keyword argument of a call without
    positional ones; of a tuple output, the first element. Other arguments and outputs are left alone.

    Trace the model inside the context, e.g. in the loss function that ``jax.jit`` compiles::

        def loss_fn(params, batch):
            with batch_sharded_activations(mesh, ("data", "fsdp")):
                logits = model.apply(params, batch["x"])
            ...

    The context acts while a function is traced: a jitted function traced before, outside it, runs
    from JAX's cache unpinned. The constraints transpose to the gradients, so the backward pass keeps
    the same shardings. Empty ``batch_axes``, or an axis that ``mesh`` lacks, raises ``ValueError``.
    """
    import flax.linen as nn

    axes = _axes(batch_axes)
    if not axes:
        raise ValueError("batch_sharded_activations: batch_axes is empty (name the mesh axes that split the batch)")
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise ValueError(f"batch_sharded_activations: batch axes {missing} are not axes of the mesh "
                         f"{tuple(mesh.axis_names)}")
    entry = _entry(axes)
    batch = NamedSharding(mesh, P(entry))
    blocks, linear_re = re.compile(modules), None if linear is None else re.compile(linear)

    def pin_block(x):
        return jax.lax.with_sharding_constraint(x, batch) if getattr(x, "ndim", 0) in (2, 3) else x

    def pin_tokens(x):
        if getattr(x, "ndim", 0) < 2:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(entry, *[P.UNCONSTRAINED] * (x.ndim - 1))))

    def names(module):
        return [c.__name__ for c in type(module).__mro__]

    def call(pin, next_fun, args, kwargs):
        if args:
            args = (pin(args[0]),) + tuple(args[1:])
        elif kwargs:
            first = next(iter(kwargs))
            kwargs = {**kwargs, first: pin(kwargs[first])}
        out = next_fun(*args, **kwargs)
        return (pin(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) and out else pin(out)

    def interceptor(next_fun, args, kwargs, context):
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        classes = names(context.module)
        if linear_re is not None and any(linear_re.match(n) for n in classes):
            return call(pin_tokens, next_fun, args, kwargs)
        if any(blocks.search(n) for n in classes):
            return call(pin_block, next_fun, args, kwargs)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield
