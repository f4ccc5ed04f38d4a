"""Devices of ``train_gpt.py``: the ``--mesh`` flag, Megatron-style shardings of the train state,
:class:`Runtime` (the experiment's init/train/eval jitted over a mesh) and :func:`kernel_plan` (which
GEMM kernel each sparse layer runs)."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_sparse24 as s24
from jax_sparse24 import distill as s24distill

from gpt_errors import CLIError
from gpt_experiment import (Experiment, _get, init_state, make_eval_step, make_train_step, measures_flips,
                            prepares_weights, refreshes_masks, start_finetune)


def _key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def parse_mesh(spec: Optional[str]):
    """``"data=2,model=1"`` -> a ``jax.sharding.Mesh`` over all devices (or None)."""
    if spec is None:
        return None
    sizes = {"data": 1, "model": 1}
    try:
        for part in spec.split(","):
            name, val = part.split("=")
            name = name.strip()
            if name not in sizes:
                raise ValueError(f"unknown axis {name!r}")
            sizes[name] = int(val)
            if sizes[name] < 1:
                raise ValueError("sizes must be >= 1")
    except ValueError as e:
        raise CLIError(f"--mesh {spec!r}: expected e.g. 'data=2,model=1' ({e})") from None
    n = sizes["data"] * sizes["model"]
    have = jax.device_count()
    if n != have:
        hint = (" (on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before starting)"
                if jax.default_backend() == "cpu" else "")
        raise CLIError(f"--mesh {spec}: the mesh has {n} devices but {have} are available{hint}")
    return _make_mesh((sizes["data"], sizes["model"]))


def single_device_mesh():
    return _make_mesh((1, 1), devices=jax.devices()[:1])


def _make_mesh(shape, devices=None):
    names = ("data", "model")
    kw = {} if devices is None else {"devices": devices}
    try:
        from jax.sharding import AxisType

        return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * 2, **kw)
    except (ImportError, TypeError):  # older jax: Auto is the only kind
        return jax.make_mesh(shape, names, **kw)


def _leaf_spec(path, leaf, model: int) -> P:
    """Megatron placement of one state leaf: qkv/fc column-parallel, proj row-parallel."""
    shape = getattr(leaf, "shape", ())
    if model == 1 or len(shape) == 0:
        return P()
    keys = [_key_str(k) for k in path]
    if keys and keys[0] == "fp8_meta":  # delayed-scaling scales and amax histories: per tensor, replicated
        return P()
    col = row = False
    for a, b in zip(keys, keys[1:]):
        if a in ("attn", "mlp"):
            col |= b in ("qkv", "fc")
            row |= b == "proj"
    if col and len(shape) == 2 and shape[1] % (4 * model) == 0:
        return P(None, "model")
    if col and len(shape) == 1 and shape[0] % model == 0:
        return P("model")
    if row and len(shape) == 2 and shape[0] % (4 * model) == 0:
        return P("model", None)
    return P()


def state_shardings(mesh, abstract_state):
    model = mesh.shape["model"]
    return jax.tree_util.tree_map_with_path(
        lambda p, x: NamedSharding(mesh, _leaf_spec(p, x, model)), abstract_state
    )



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
            model = mesh.shape["model"]
            self.teacher_shardings = jax.tree_util.tree_map_with_path(
                lambda p, x: NamedSharding(mesh, _leaf_spec(p, x, model)), teacher_params)
            self.teacher = jax.device_put(teacher_params, self.teacher_shardings)
        init_fn = lambda: init_state(exp, exp.hp["seed"])  # noqa: E731
        self.abstract_state = jax.eval_shape(init_fn)
        self.state_shardings = state_shardings(mesh, self.abstract_state)
        self.data_sharding = NamedSharding(mesh, P("data", None))
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
        self._refresh = jax.jit(lambda p, sp, step: s24.nn.refresh_masks(p, sp, step=step, skip_idle=False),
                                in_shardings=(params_sh, sparsity_sh, self._repl),
                                out_shardings=(sparsity_sh, self._repl))
        # ste/soft/ast: the sparse layers' 2:4 masks before a logging step's update, compared after it (two
        # magnitude masks of every sparse weight per step cost ~2% of a GPT-2-medium step on the H100:
        # ste kernel time per step 43.9 -> 43.0 ms without; so on logging steps only)
        self._kernel_masks = jax.jit(lambda p: s24.nn.kernel_masks(p, paths=exp.sparse_paths),
                                     in_shardings=(params_sh,))
        self._flip_rate = jax.jit(
            lambda m, p: s24.nn.kernel_flip_rate(m, p, paths=exp.sparse_paths).astype(jnp.float32),
            out_shardings=self._repl)

    def put(self, tokens):
        return jax.device_put(tokens, self.data_sharding)

    def train_step(self, sparse: Optional[bool]):
        if sparse not in self._train:
            if self.teacher is None:
                self._train[sparse] = jax.jit(
                    make_train_step(self.exp, sparse, micro_tokens_per_device(self)), in_shardings=(self.state_shardings, self.data_sharding),
                    out_shardings=(self.state_shardings, self._repl), donate_argnums=self._donate)
            else:
                step = jax.jit(
                    make_train_step(self.exp, sparse),
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
        layer is due (``jax_sparse24.nn.refresh_due``; the refresh's flip rate is the step's
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
        if s24.nn.refresh_due(self.mask_periods, step + 1):
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
            params = s24distill.student_params_from_dense(st["params"], teacher)
            return dict(st, params=params, opt_state=exp.tx.init(params))

        return jax.jit(fn, in_shardings=(self.state_shardings, self.teacher_shardings),
                       out_shardings=self.state_shardings)(state, self.teacher)

    def eval_step(self, sparse: Optional[bool]):
        if sparse not in self._eval:
            self._eval[sparse] = jax.jit(
                make_eval_step(self.exp, sparse), in_shardings=(self.state_shardings, self.data_sharding),
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
        kernel = _get(params, path)["kernel"]
        i, o = _get(shardings, path)["kernel"].shard_shape(kernel.shape)
        plan.setdefault("x".join(map(str, kernel.shape)), s24.linear_plan(
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
