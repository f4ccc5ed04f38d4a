"""Devices of ``train_gpt.py``: the ``--mesh`` flag, Megatron-style shardings of the train state,
:class:`Runtime` (the experiment's init/train/eval jitted over a mesh) and :func:`kernel_plan` (which
GEMM kernel each sparse layer runs)."""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_sparse24 as s24
from jax_sparse24 import sharding as shd

from data import CLIError
from gpt_model import student_params_from_teacher
from gpt_experiment import (Experiment, subtree, init_state, make_eval_step, make_train_step, measures_flips,
                            prepares_weights, refreshes_masks, start_finetune)


def _key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


#: environment variables of ``--distributed`` (set by ``examples/launch.py``, or by you on each host)
DIST_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def init_distributed(heartbeat_timeout_s: int = 60) -> None:
    """``--distributed``: ``jax.distributed.initialize`` from the standard environment variables
    :data:`DIST_ENV` (one process per GPU, or per host); must run before any other JAX call.

    On a CPU the cross-process collectives are gloo's. A process that dies stops sending
    heartbeats; after ``heartbeat_timeout_s`` the coordination service fails the others (their
    next collective raises) instead of leaving them waiting forever -- and ``launch.py`` kills the
    rest as soon as one exits with an error."""
    import os

    missing = [k for k in DIST_ENV if not os.environ.get(k)]
    if missing:
        raise CLIError(f"--distributed needs the environment variables {', '.join(DIST_ENV)} (missing: "
                       f"{', '.join(missing)}); start the processes with examples/launch.py --nproc N -- ARGS, "
                       "or set them on every host (the same address and count, process ids 0..N-1)")
    try:
        n, i = int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"])
    except ValueError:
        raise CLIError("--distributed: JAX_NUM_PROCESSES and JAX_PROCESS_ID must be integers") from None
    if not 0 <= i < n:
        raise CLIError(f"--distributed: JAX_PROCESS_ID {i} is not in 0..{n - 1} (JAX_NUM_PROCESSES {n})")
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw = dict(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"], num_processes=n, process_id=i)
    try:
        jax.distributed.initialize(**kw, heartbeat_timeout_seconds=heartbeat_timeout_s,
                                   initialization_timeout=max(60, heartbeat_timeout_s))
    except TypeError:  # a jax without the timeout arguments
        jax.distributed.initialize(**kw)


def is_writer() -> bool:
    """Whether this process logs, plots and writes the run's files (process 0)."""
    return jax.process_index() == 0


def writer_only(fn):
    """``fn`` on process 0; a no-op returning None on the others (their files would be copies)."""
    import functools

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs) if is_writer() else None

    return wrapped


#: mesh axes of ``--mesh``, in device order: ``model`` (tensor parallel) innermost, so a model group
#: is neighbouring devices (one host's NVLink); ``fsdp`` next, ``data`` outermost.
MESH_AXES = ("data", "fsdp", "model")
#: the mesh axes the batch is split over (data parallel and FSDP both split the tokens)
BATCH_AXES = ("data", "fsdp")


def parse_mesh(spec: Optional[str]):
    """``"data=2,fsdp=2,model=1"`` -> a ``jax.sharding.Mesh`` over all devices (or None).

    Axes: ``data`` (data parallel: params replicated), ``fsdp`` (ZeRO-3: the batch split as over
    ``data``, and every >=2-D leaf of the train state sharded too), ``model`` (Megatron tensor
    parallel). Missing axes have size 1; the sizes must multiply to the device count (of all
    processes)."""
    if spec is None:
        return None
    sizes = dict.fromkeys(MESH_AXES, 1)
    try:
        for part in spec.split(","):
            name, val = part.split("=")
            name = name.strip()
            if name not in sizes:
                raise ValueError(f"unknown axis {name!r}; the axes are {', '.join(MESH_AXES)}")
            sizes[name] = int(val)
            if sizes[name] < 1:
                raise ValueError("sizes must be >= 1")
    except ValueError as e:
        raise CLIError(f"--mesh {spec!r}: expected e.g. 'data=2,fsdp=2,model=1' ({e})") from None
    n = math.prod(sizes.values())
    have = jax.device_count()
    if n != have:
        hint = (" (on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before starting)"
                if jax.default_backend() == "cpu" and jax.process_count() == 1 else "")
        raise CLIError(f"--mesh {spec}: the mesh has {n} devices but {have} are available{hint}")
    return mesh_of_shape(tuple(sizes[a] for a in MESH_AXES))


def single_device_mesh():
    return mesh_of_shape((1,) * len(MESH_AXES), devices=jax.devices()[:1])


def mesh_of_shape(shape, devices=None):
    names = MESH_AXES
    kw = {} if devices is None else {"devices": devices}
    try:
        from jax.sharding import AxisType

        return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names), **kw)
    except (ImportError, TypeError):  # older jax: Auto is the only kind
        return jax.make_mesh(shape, names, **kw)


#: dimensions of one layer's leaf (after any leading layer axis of a scanned stack): a leaf of more
#: dimensions is a stack of them, ``(L, in, out)``; its leading axes are never sharded.
_OWN_DIMS = {"kernel": 2, "mask": 2, "transposable_mask": 2, "lora_b": 2, "embedding": 2, "bias": 1,
             "scale": 1, "beta": 1}


def _tp_role(keys) -> Optional[str]:
    """``"col"`` (qkv / fc: column parallel), ``"row"`` (proj: row parallel) or None."""
    for a, b in zip(keys, keys[1:]):
        if a in ("attn", "mlp"):
            if b in ("qkv", "fc"):
                return "col"
            if b == "proj":
                return "row"
    return None


def _leaf_spec(path, leaf, mesh) -> P:
    """Placement of one train-state leaf on ``mesh`` (axes :data:`MESH_AXES`).

    Tensor parallel (``model``, Megatron): ``qkv`` / ``fc`` column parallel (kernel, mask, bias on
    ``out``), ``proj`` row parallel (kernel, mask on ``in``); the fused kernels' columns are grouped
    per head (q|k|v of head 0, head 1, ...) and gate/up interleaved (``gpt_model``), so a column
    shard holds whole heads and matching gate and up columns. FSDP (``fsdp``): every >=2-D leaf also
    sharded on its largest axis that splits evenly (whole 4-groups for 2:4 kernels and masks;
    ``jax_sparse24.sharding.fsdp_spec``). A scanned stack's leading layer axis is never sharded.
    Optimizer moments have their param's path inside the optax state, so they follow it.
    A tensor-parallel split that would cut a 4-group or leave uneven shards raises CLIError naming
    the leaf, the mesh axis and the sizes (before anything is compiled).
    """
    shape = tuple(getattr(leaf, "shape", ()))
    if len(shape) == 0:
        return P()
    keys = [_key_str(k) for k in path]
    if keys and keys[0] == "fp8_meta":  # delayed-scaling scales and amax histories: per tensor, replicated
        return P()
    name = keys[-1] if keys else ""
    own = _OWN_DIMS.get(name, len(shape))
    lead = max(0, len(shape) - own)
    model = mesh.shape.get("model", 1)
    tp: list = [None] * len(shape)
    role = _tp_role(keys)
    if model > 1 and role is not None and name in ("kernel", "mask", "transposable_mask", "bias"):
        if name == "bias":
            if role == "col":
                tp[-1] = "model"
        elif len(shape) - lead == 2:
            tp[-1 if role == "col" else -2] = "model"
    spec = P(*tp)
    where = "/".join(keys)
    try:
        shd.check_leaf_sharding(where, shape, spec, mesh, name, lead)
    except ValueError as e:
        raise CLIError(f"--mesh: tensor parallel over 'model' ({model} devices) does not fit layer {where}: "
                       f"{str(e).split(': ', 1)[1]}") from None
    if mesh.shape.get("fsdp", 1) > 1:
        spec = shd.fsdp_spec(shape, spec, mesh, axis="fsdp", leaf_name=name, lead=lead)
        shd.check_leaf_sharding(where, shape, spec, mesh, name, lead)
    return spec


def check_mesh_fits(cfg, mesh) -> None:
    """Tensor parallelism splits attention by heads and the FFN by hidden units: refuse a ``model``
    axis that does not divide them (CLIError naming the layer, axis and sizes, before compiling)."""
    model = mesh.shape.get("model", 1)
    if model == 1:
        return
    if cfg.n_head % model:
        raise CLIError(f"--mesh: the 'model' axis ({model} devices) must divide the attention heads of every "
                       f"layer (attn/qkv: {cfg.n_head} heads), so that each device holds whole heads")
    if cfg.ffn_hidden % model:
        raise CLIError(f"--mesh: the 'model' axis ({model} devices) must divide the FFN hidden width of every "
                       f"layer (mlp/fc: {cfg.ffn_hidden})")


def state_shardings(mesh, abstract_state):
    return jax.tree_util.tree_map_with_path(lambda p, x: NamedSharding(mesh, _leaf_spec(p, x, mesh)),
                                            abstract_state)


#: modules (class names) whose input and output ``Runtime`` pins to the batch sharding under FSDP (the linear
#: layers' token axes too: ``jax_sparse24.sharding.LINEAR_MODULES``)
_PINNED = r"^(GPT|Block|MLP|CausalSelfAttention)|Block"


class Runtime:
    """Jitted init/train/eval of an experiment over a mesh (see :func:`make_runtime`).

    ``train_step(sparse)`` / ``eval_step(sparse)`` return the jitted program for a (static)
    ``sparse`` flag, built on first use.
    """

    def __init__(self, exp: Experiment, mesh=None, teacher_params=None):
        if mesh is None:
            mesh = single_device_mesh()
        self.exp, self.mesh = exp, mesh
        self.teacher = self.teacher_shardings = None
        if exp.teacher_model is not None:
            if teacher_params is None:
                raise ValueError("the ast recipe needs the teacher's params (make_runtime(..., teacher_params=))")
            self.teacher_shardings = state_shardings(mesh, teacher_params)
            self.teacher = jax.device_put(teacher_params, self.teacher_shardings)
        init_fn = lambda: init_state(exp, exp.hp["seed"])  # noqa: E731
        check_mesh_fits(exp.cfg, mesh)
        rows = exp.hp["batch_size"] // int(exp.hp.get("grad_accum", 1))
        n_batch = math.prod(mesh.shape.get(a, 1) for a in BATCH_AXES)
        if rows % n_batch:
            raise CLIError(f"--batch-size {exp.hp['batch_size']} / --grad-accum {exp.hp.get('grad_accum', 1)} = {rows} "
                           f"rows per micro-batch is not divisible by the mesh's data x fsdp axes ({n_batch} devices)")
        self.abstract_state = jax.eval_shape(init_fn)
        self.state_shardings = state_shardings(mesh, self.abstract_state)
        self.data_sharding = NamedSharding(mesh, P(BATCH_AXES, None))
        self._fsdp = mesh.shape.get("fsdp", 1) > 1
        self._repl = NamedSharding(mesh, P())
        self._donate = () if jax.default_backend() == "cpu" else (0,)
        self.init = jax.jit(init_fn, out_shardings=self.state_shardings)
        self._train: dict = {}
        self._eval: dict = {}
        self._start_finetune = None
        # the host-scheduled mask work (run_step): srste's refresh on due steps, ste/soft/ast's flip
        # rate on logging steps; small programs of their own, so the train step has no conditional
        self.mask_periods = (exp.hp["mask_every"],) if refreshes_masks(exp) else ()
        self.flip_every = int(exp.hp.get("flip_every", 1)) if measures_flips(exp) else 0
        params_sh, sparsity_sh = self.state_shardings["params"], self.state_shardings["sparsity"]
        # srste: the layers due at the state's step (the number of updates applied), no conditional
        self._refresh = jax.jit(lambda p, sp, step: s24.masks.refresh_masks(p, sp, step=step, skip_idle=False),
                                in_shardings=(params_sh, sparsity_sh, self._repl),
                                out_shardings=(sparsity_sh, self._repl))
        # ste/soft/ast: the sparse layers' 2:4 masks before a logging step's update, compared after it (two
        # magnitude masks of every sparse weight per step cost ~2% of a GPT-2-medium step on the H100:
        # ste kernel time per step 43.9 -> 43.0 ms without; so on logging steps only)
        self._kernel_masks = jax.jit(lambda p: s24.masks.kernel_masks(p, paths=exp.sparse_paths),
                                     in_shardings=(params_sh,))
        self._flip_rate = jax.jit(
            lambda m, p: s24.masks.kernel_flip_rate(m, p, paths=exp.sparse_paths).astype(jnp.float32),
            out_shardings=self._repl)

    def put(self, tokens):
        """The global batch ``tokens`` (every process computes the same one: the data stream is a
        function of the seed and step) on the mesh; with several processes each process transfers
        only the rows its devices hold (``jax.make_array_from_callback``)."""
        if jax.process_count() == 1:
            return jax.device_put(tokens, self.data_sharding)
        tokens = np.asarray(tokens)
        return jax.make_array_from_callback(tokens.shape, self.data_sharding, lambda idx: tokens[idx])

    def _batch_sharded(self, fn):
        """``fn`` traced inside :func:`jax_sparse24.sharding.batch_sharded_activations`: the input and
        output of the model, of every transformer block and of its attention and MLP constrained to the
        batch sharding (tokens over ``data`` x ``fsdp``), as MaxText constrains its activations, and the
        token axis of every linear layer's input and output too.

        Under FSDP a weight and the tokens are split over the same mesh axis; left to propagation,
        XLA (and the 2:4 GEMMs' rules) could as well move the activations to match the weight (an
        all-to-all of activations per layer) as gather the weight. Pinned activations leave one
        choice: each layer's weights are all-gathered over ``fsdp`` and their gradients reduced back
        (reduce-scattered on GPUs). Without the linear layers' pins, on 2 x H100 XLA moved the SwiGLU
        activations between the fc kernel's column sharding and the batch sharding in the MLP's
        backward. Only with an ``fsdp`` axis; other meshes are unchanged."""
        if not self._fsdp:
            return fn

        def wrapped(*args):
            with shd.batch_sharded_activations(self.mesh, BATCH_AXES, modules=_PINNED):
                return fn(*args)

        return wrapped

    def train_step(self, sparse: Optional[bool]):
        if sparse not in self._train:
            if self.teacher is None:
                self._train[sparse] = jax.jit(
                    self._batch_sharded(make_train_step(self.exp, sparse, micro_tokens_per_device(self))), in_shardings=(self.state_shardings, self.data_sharding),
                    out_shardings=(self.state_shardings, self._repl), donate_argnums=self._donate)
            else:
                step = jax.jit(
                    self._batch_sharded(make_train_step(self.exp, sparse)),
                    in_shardings=(self.state_shardings, self.data_sharding, self.teacher_shardings),
                    out_shardings=(self.state_shardings, self._repl), donate_argnums=self._donate)
                self._train[sparse] = lambda state, tokens: step(state, tokens, self.teacher)
        return self._train[sparse]

    def run_step(self, state, tokens, step: int, sparse: Optional[bool], train=None):
        """One optimizer step as the example runs it, from a ``state`` with ``step`` updates applied
        (the host's count; it must equal ``state["step"]``, which the refresh program reads):
        ``(state, metrics)`` after the update.

        ``train`` (default :meth:`train_step` ``(sparse)``; the benchmarks pass their compiled
        program) does the forward, backward and update; around it, on the steps that need it, the
        host runs what the step leaves out so that it has no conditional (a GPU step with one
        waits for the host to read its predicate): srste's mask refresh after the update when a
        layer is due (``jax_sparse24.masks.refresh_due``; the refresh's flip rate is the step's
        ``"flip"``), and for ste/soft/ast on logging steps (every ``flip_every``) the flip rate
        across the update (the masks taken before it, compared after it). Other steps' ``"flip"``
        is NaN.
        """
        train = self.train_step(sparse) if train is None else train
        measure = self.flip_every and (step + 1) % self.flip_every == 0
        old_masks = self._kernel_masks(state["params"]) if measure else None
        state, metrics = train(state, tokens)
        if measure:
            metrics = dict(metrics, flip=self._flip_rate(old_masks, state["params"]))
        if s24.masks.refresh_due(self.mask_periods, step + 1):
            sparsity, flip = self._refresh(state["params"], state["sparsity"], state["step"])
            state, metrics = dict(state, sparsity=sparsity), dict(metrics, flip=flip)
        return state, metrics

    def warm_host_programs(self, state) -> None:
        """Compile (by running once, results dropped) the programs :meth:`run_step` runs on some
        steps only, so a timed loop does not compile them."""
        outs = []
        if self.mask_periods:
            outs.append(self._refresh(state["params"], state["sparsity"], state["step"]))
        if self.flip_every:
            outs.append(self._flip_rate(self._kernel_masks(state["params"]), state["params"]))
        jax.block_until_ready(outs)

    def start_finetune(self, state):
        """``gpt_experiment.start_finetune`` jitted with the state's shardings (run once per run)."""
        if self._start_finetune is None:
            self._start_finetune = jax.jit(lambda st: start_finetune(self.exp, st), in_shardings=(self.state_shardings,),
                                           out_shardings=self.state_shardings, donate_argnums=self._donate)
        return self._start_finetune(state)

    def init_from_teacher(self, state):
        """ast: the student's params copied from the teacher (SLoRB ``lora_b`` from the pruned
        weights) and a fresh optimizer state for them."""
        exp = self.exp

        def fn(st, teacher):
            params = student_params_from_teacher(exp.cfg, st["params"], teacher)  # (either block layout)
            return dict(st, params=params, opt_state=exp.tx.init(params))

        return jax.jit(fn, in_shardings=(self.state_shardings, self.teacher_shardings),
                       out_shardings=self.state_shardings)(state, self.teacher)

    def eval_step(self, sparse: Optional[bool]):
        if sparse not in self._eval:
            self._eval[sparse] = jax.jit(
                self._batch_sharded(make_eval_step(self.exp, sparse)), in_shardings=(self.state_shardings, self.data_sharding),
                out_shardings=self._repl)
        return self._eval[sparse]

    def abstract_args(self):
        """``(state, tokens)`` as ``ShapeDtypeStruct`` with shardings, e.g. for ``.lower()``."""
        st = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          self.abstract_state, self.state_shardings)
        hp = self.exp.hp
        tok = jax.ShapeDtypeStruct((hp["batch_size"], hp["seq_len"] + 1), jnp.int32, sharding=self.data_sharding)
        return st, tok


def make_runtime(exp: Experiment, mesh=None, teacher_params=None) -> Runtime:
    """Jit init/train/eval with explicit shardings over ``mesh`` (default: a 1x1 mesh of device 0).

    The single-device case uses the same code path as a real mesh, so a resumed run (whose
    restored arrays carry these shardings) runs exactly the programs of a fresh run.
    """
    return Runtime(exp, mesh, teacher_params)


def _single_device() -> bool:
    return jax.device_count() == 1


def kernel_plan(rt: "Runtime") -> dict:
    """``{"IxO": jax_sparse24.linear_plan(...)}`` per distinct sparse layer shape: which kernel each
    GEMM of the layer runs. ``backend="auto"`` decides on the per-device shapes, so they come from
    the runtime's shardings (tokens of one micro-batch on a ``data`` shard, the kernel's local
    block). Empty for dense models and for ``ast`` (its layers are not ``sparse24_linear``)."""
    exp = rt.exp
    if not exp.sparse_paths or exp.cfg.linear != "sparse24":
        return {}
    hp, cfg = exp.hp, exp.cfg
    tokens = micro_tokens_per_device(rt)
    reuse = int(hp.get("grad_accum", 1)) if prepares_weights(exp) else None
    # nn.prepare(batch="auto") batches on one device (under a mesh of Auto axes it prepares per layer)
    batched = reuse is not None and _single_device()
    params, shardings = rt.abstract_state["params"], rt.state_shardings["params"]
    plan = {}
    for path in exp.sparse_paths:
        kernel = subtree(params, path)["kernel"]  # (in, out), or (L, in, out) in a scanned stack
        # the GEMMs' operand: the stored shard gathered over fsdp (FSDP gathers each layer's weight)
        sh = subtree(shardings, path)["kernel"]
        spec = P(*(tuple(a for a in ((e,) if isinstance(e, str) else e or ()) if a != "fsdp") or None for e in sh.spec))
        i, o = NamedSharding(sh.mesh, spec).shard_shape(kernel.shape)[-2:]
        plan.setdefault("x".join(map(str, kernel.shape[-2:])), s24.linear_plan(
            tokens, i, o, cfg.dtype, backend=cfg.backend, transposable=cfg.transposable and cfg.method == "srste",
            mvue=cfg.mvue, reuse=reuse, batched=batched, fp8=cfg.fp8))
    return plan


def micro_tokens_per_device(rt: "Runtime") -> int:
    """Tokens of one micro-batch on one ``data`` shard (what ``backend="auto"`` plans for)."""
    hp = rt.exp.hp
    rows = rt.data_sharding.shard_shape((hp["batch_size"], hp["seq_len"] + 1))[0]
    return max(1, rows // hp.get("grad_accum", 1)) * hp["seq_len"]


def format_plan(plan: dict) -> str:
    """One line of :func:`kernel_plan`: ``IxO: fwd K, dx K, dW K; ...``."""
    return "; ".join(f"{k}: fwd {p['forward']}, dx {p['input_grad']}, dW {p['weight_grad']}" for k, p in plan.items())
