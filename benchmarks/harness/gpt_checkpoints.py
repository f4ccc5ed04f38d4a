"""Checkpoints of ``train_gpt.py``: orbax checkpoints of the sparse train state with fingerprints
(:class:`Checkpoints`), config checks, the ``--out`` / ``--resume`` / ``--resume-from`` rules, and
the ``ast`` teacher. Orbax's logging and its leftovers after a failed restore are quieted here."""

from __future__ import annotations

import functools
import gc
import logging
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from data import CLIError
from gpt_errors import PROG
from gpt_experiment import TEACHER_MATCH_KEYS, build_experiment, init_state
from gpt_report import read_jsonl


def _leaf_fingerprint(x):
    """uint32 hash of the exact bits of one array: ``sum_i (u_i ^ i·2654435761)·(i | 1) ^ size`` over
    the row-major index ``i`` of every 32-bit word ``u_i`` (mod 2**32).

    A sum of per-element terms of the *global* index (``broadcasted_iota`` per dimension, no
    reshape), so it partitions like any elementwise op + reduction: under ``jit`` with the array's
    own sharding each device sums its shard and only the scalar is all-reduced -- no array is
    gathered (a ``reshape(-1)`` of a column-sharded kernel made XLA gather the whole state onto one
    device: 41.7 GiB on the LLaMA-7B run of issue 37). The value does not depend on the sharding, so
    a checkpoint written on 4 devices verifies on 2 or 1; it equals the hash of earlier versions
    (``arange`` over the flattened array)."""
    if x.dtype == jnp.bool_:
        u = x.astype(jnp.uint32)
    elif jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        u = jax.random.key_data(x).astype(jnp.uint32)
    else:
        bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        u = jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32)
    i = jnp.zeros(u.shape, jnp.uint32)
    stride = 1
    for d in reversed(range(u.ndim)):
        i = i + jax.lax.broadcasted_iota(jnp.uint32, u.shape, d) * jnp.uint32(stride % 2**32)
        stride *= u.shape[d]
    return jnp.sum((u ^ (i * jnp.uint32(2654435761))) * (i | jnp.uint32(1)), dtype=jnp.uint32) ^ jnp.uint32(u.size % 2**32)


def _leaf_sharding(x):
    sh = getattr(x, "sharding", None)
    return sh if isinstance(sh, jax.sharding.Sharding) else None


def fingerprint(tree):
    """Per-leaf uint32 hashes of the exact bits of ``tree`` (detects corrupt checkpoint data).

    One program over the whole tree, each array read in its own sharding (``in_shardings``) and
    every hash a replicated scalar (``out_shardings``): each device hashes the shards it holds,
    then the scalars are summed across devices (all-reduce); on several processes every process
    gets all hashes. Arrays are never gathered (``test_fingerprint_never_gathers``)."""
    leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in jax.tree.leaves(tree)]
    shardings = [_leaf_sharding(x) for x in leaves]
    mesh_sh = next((s for s in shardings if isinstance(s, jax.sharding.NamedSharding)), None)
    if mesh_sh is not None:
        out = jax.sharding.NamedSharding(mesh_sh.mesh, jax.sharding.PartitionSpec())
    else:
        out = None
    return fingerprint_program(tuple(shardings), out)(leaves)


@functools.lru_cache(maxsize=8)
def fingerprint_program(shardings: tuple, out):
    return jax.jit(lambda xs: [_leaf_fingerprint(x) for x in xs], in_shardings=(list(shardings),),
                   out_shardings=None if out is None else [out] * len(shardings))


def _quiet_orbax():
    for name in ("absl", "orbax", "orbax.checkpoint"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    warnings.filterwarnings("ignore", module=r"orbax(\.|$)")
    _ignore_orbax_teardown_errors()
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _OrbaxAsyncioFilter) for f in asyncio_log.filters):
        asyncio_log.addFilter(_OrbaxAsyncioFilter())


def _raised_in_orbax(exc) -> bool:
    """Raised by orbax's checkpoint reads: an orbax or TensorStore frame in the traceback, or (a read
    that TensorStore failed from its own threads, with no Python frames: seen in CI) TensorStore's
    message about the checkpoint's OCDBT database."""
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        if any(s in tb.tb_frame.f_code.co_filename for s in ("orbax", "tensorstore")):
            return True
        tb = tb.tb_next
    return exc is not None and "OCDBT database" in str(exc)


class _OrbaxAsyncioFilter(logging.Filter):
    """Drops asyncio's "exception was never retrieved" reports of orbax's abandoned reads (a failed
    restore has already been reported as one line); anything else asyncio logs passes."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        return not ("never retrieved" in record.getMessage() and _raised_in_orbax(exc))


def _is_orbax_teardown_error(unraisable) -> bool:
    """An exception orbax leaves behind after a failed restore: the reads still in flight when its
    event loop closed finish later (``RuntimeError: Event loop is closed`` from
    ``call_soon_threadsafe``), and its abandoned read coroutines raise when they are collected."""
    exc, obj = unraisable.exc_value, unraisable.object
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is None or "asyncio" in tb.tb_frame.f_code.co_filename
    code = getattr(obj, "cr_code", None)
    return code is not None and "orbax" in code.co_filename


def _ignore_orbax_teardown_errors():
    """Drop (only) those leftovers from ``sys.unraisablehook``: after the one-line error for a corrupt
    checkpoint they printed dozens of tracebacks that looked like a crash. Installed once; every
    other unraisable exception goes to the previous hook."""
    prev = sys.unraisablehook
    if getattr(prev, "_train_gpt_filter", False):
        return

    def hook(unraisable):
        if not _is_orbax_teardown_error(unraisable):
            prev(unraisable)

    hook._train_gpt_filter = True
    sys.unraisablehook = hook


def _with_target_shardings(abstract_state):
    """The restore target: every leaf a ``ShapeDtypeStruct`` with the sharding it is to have *now*.

    Orbax reads each array's shards straight into that sharding (every process reads only what its
    devices hold), so a checkpoint written on 4 devices restores onto the current mesh of 2 or 1
    (resharded while reading; never gathered). Leaves given without a sharding (the ast teacher's
    params, the intact-checkpoint search) are replicated over all devices -- not the sharding they
    were saved with, whose devices may not exist any more."""
    repl = None

    def one(x):
        nonlocal repl
        sh = getattr(x, "sharding", None)
        if not isinstance(sh, jax.sharding.Sharding):
            if repl is None:
                mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("all",))
                repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            sh = repl
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

    return jax.tree.map(one, abstract_state)


def is_writer() -> bool:
    """Whether this process writes the run's own files (process 0; orbax writes checkpoints from all)."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """All processes wait here (no-op with one process): after process 0 changed files the others read."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class Checkpoints:
    """Orbax checkpoints of the train state + a JSON ``meta`` (config, fingerprints, history)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory).resolve()

    def steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.dir.iterdir() if p.is_dir() and p.name.isdigit())

    def _manager(self, read_only: bool):
        import orbax.checkpoint as ocp

        _quiet_orbax()
        opts = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=False,
                                            read_only=read_only, create=not read_only)
        return ocp.CheckpointManager(self.dir, options=opts)

    def read_meta(self, step: int) -> dict:
        import orbax.checkpoint as ocp

        meta_file = self.dir / str(step) / "meta"
        if not meta_file.exists():
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt or incomplete: no 'meta' item")
        try:
            meta = self._restore(step, ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt or unreadable: {_short(e)}") from None
        if not isinstance(meta, dict) or "config" not in meta or "fingerprint" not in meta:
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt: its meta has no config/fingerprint")
        return meta

    def _restore(self, step: int, args):
        """One orbax restore; the manager is closed however it ends, and a failed restore's
        abandoned reads are collected here (their leftovers are dropped, see _quiet_orbax)."""
        mngr = self._manager(read_only=True)
        try:
            return mngr.restore(step, args=args)
        except BaseException:
            gc.collect()
            raise
        finally:
            mngr.close()

    def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
        import orbax.checkpoint as ocp

        meta = self.read_meta(step)
        target = _with_target_shardings(abstract_state)
        try:
            state = self._restore(step, ocp.args.Composite(state=ocp.args.StandardRestore(target))).state
        except Exception as e:  # noqa: BLE001
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt or unreadable: {_short(e)}") from None
        got = [int(v) for v in jax.device_get(fingerprint(state))]
        if got != list(meta["fingerprint"]):
            bad = sum(a != b for a, b in zip(got, meta["fingerprint"]))
            raise CLIError(f"checkpoint {self.dir / str(step)} is corrupt: {bad} arrays do not match "
                           "the fingerprints stored when it was written")
        return state, meta

    def newest_intact(self, below: int, abstract_state, config: dict) -> Optional[int]:
        """The newest checkpoint before step ``below`` that restores, matches its fingerprints and
        was written by ``config`` (None if there is none)."""
        for step in reversed([s for s in self.steps() if s < below]):
            try:
                check_config(self.read_meta(step)["config"], config, self.dir)
                self.restore(step, abstract_state)
            except CLIError:
                continue
            return step
        return None

    def with_intact_hint(self, err: CLIError, bad: int, abstract_state, config: dict) -> CLIError:
        """``err`` (checkpoint ``bad`` is corrupt) plus which older checkpoint can be resumed instead."""
        good = self.newest_intact(bad, abstract_state, config)
        if good is None:
            older = [s for s in self.steps() if s < bad]
            return CLIError(f"{err}; no older checkpoint is intact ({'steps ' + str(older) if older else 'there are none'}): "
                            "start over with --overwrite")
        return CLIError(f"{err}; the newest intact checkpoint is step {good}: continue from it with "
                        f"--resume-from {good} (this discards the checkpoints after it)")

    def discard_after(self, step: int) -> list[int]:
        """Delete the checkpoints after ``step`` (a resume from an older one rewrites them)."""
        later = [s for s in self.steps() if s > step]
        if is_writer():
            for s in later:
                shutil.rmtree(self.dir / str(s))
        sync("discard_after")
        return later

    def save(self, step: int, state, meta: dict) -> None:
        import orbax.checkpoint as ocp

        meta = dict(meta, fingerprint=[int(v) for v in jax.device_get(fingerprint(state))])
        mngr = self._manager(read_only=False)
        if step in mngr.all_steps():
            return
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 meta=ocp.args.JsonSave(meta)))
        mngr.wait_until_finished()
        mngr.close()


def _short(e: Exception, n: int = 300) -> str:
    text = str(e).split(" See full TensorStore details")[0]  # orbax appends a page of spec
    if e.__cause__ is not None:  # e.g. tensorstore's OUT_OF_RANGE under orbax's generic Exception
        text += f" ({type(e.__cause__).__name__}: {e.__cause__})"
    s = f"{type(e).__name__}: {text}".replace("\n", " ")
    return s if len(s) <= n else s[:n] + "..."


#: flags added after checkpoints were first written: a checkpoint without one ran with this value.
CONFIG_DEFAULTS = {"grad_accum": 1, "fp8": False, "sparse_lr_scale": 1.0, "finetune_start": "weights",
                   "fp8_scaling": "current", "fp8_dense": "sparse24", "layers": "unroll"}


def check_config(saved: dict, now: dict, where: Path) -> None:
    saved, now = {**CONFIG_DEFAULTS, **saved}, {**CONFIG_DEFAULTS, **now}
    diffs = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    if diffs:
        parts = ", ".join(f"{k}={saved.get(k)!r} in the checkpoint but {now.get(k)!r} now" for k in diffs[:6])
        raise CLIError(
            f"the checkpoint in {where} was written by a different configuration ({parts}); "
            "resume with the same flags, or start a fresh run in another --out"
        )



def check_teacher(hp: dict) -> tuple["Checkpoints", int, dict]:
    """Validates ``--teacher`` for an ast run: ``(checkpoints, latest step, meta)``.

    The teacher must be a ``--recipe dense`` checkpoint of this script whose model flags
    (:data:`TEACHER_MATCH_KEYS`) equal the student's; anything else is a :class:`CLIError`.
    """
    path = Path(hp["teacher"])
    if not path.is_dir():
        raise CLIError(f"--teacher {path}: no such directory")
    ck = Checkpoints(path / "ckpt" if (path / "ckpt").is_dir() else path)
    steps = ck.steps()
    if not steps:
        raise CLIError(f"--teacher {path}: no checkpoint found (give the --out directory of a "
                       "`--recipe dense` run of this script, or its ckpt/)")
    meta = ck.read_meta(steps[-1])
    saved = meta["config"]
    if saved.get("recipe") != "dense":
        raise CLIError(f"--teacher {ck.dir}: the teacher must be a `--recipe dense` checkpoint, this one "
                       f"is recipe={saved.get('recipe')!r}")
    diffs = [k for k in TEACHER_MATCH_KEYS if saved.get(k) != hp[k]]
    if diffs:
        parts = ", ".join(f"{k}={saved.get(k)!r} in the teacher but {hp[k]!r} now" for k in diffs)
        raise CLIError(f"--teacher {ck.dir}: the teacher was trained with a different model configuration "
                       f"({parts}); the student needs the teacher's vocabulary, width, depth, heads and "
                       "sequence length: train the teacher with the same --size/--n-layer/--n-head/"
                       "--n-embd/--seq-len/--ffn/--untied-head flags")
    return ck, steps[-1], meta


def load_teacher(hp: dict):
    """The dense teacher's params from ``hp["teacher"]`` (validated, fingerprints checked)."""
    ck, step, meta = check_teacher(hp)
    teacher_exp = build_experiment(dict(meta["config"]))
    abstract = jax.eval_shape(lambda: init_state(teacher_exp, 0))
    state, _ = ck.restore(step, abstract)
    params = state["params"]
    if teacher_exp.cfg.layers != hp.get("layers", "unroll"):  # a teacher of the other block layout
        from gpt_model import convert_layout

        params = convert_layout(params, teacher_exp.cfg.n_layer, to=hp.get("layers", "unroll"))
    return params


#: files a run writes into --out (besides ckpt/); never replaced without --overwrite.
RUN_FILES = ("summary.json", "metrics.jsonl", "loss.png")
#: files --compare writes into --out.
COMPARE_FILES = ("compare.md", "compare.json", "compare.png")


def _check_out_is_dir(out: Path) -> None:
    """``--out`` (or the first of its parents that exists) must be a directory."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file" if p == out else f"is inside {p}, which is a file"
                raise CLIError(f"--out {out} {what}, not a directory; choose another --out")
            return


def precheck_out(out: Path, resume: bool, overwrite: bool, resume_from: Optional[int] = None) -> None:
    """Refuse to write over a previous run (any of its files, not only ckpt/) without --overwrite."""
    _check_out_is_dir(out)
    ck = Checkpoints(out / "ckpt")
    steps = ck.steps()
    if resume and not steps:
        raise CLIError(f"--resume: no checkpoint found in {ck.dir}")
    if resume_from is not None and resume_from not in steps:
        raise CLIError(f"--resume-from {resume_from}: {ck.dir} has no checkpoint of that step (steps {steps})")
    if resume or overwrite:
        return
    held = [f"checkpoints (steps {steps})"] if steps or (ck.dir.exists() and any(ck.dir.iterdir())) else []
    held += [f for f in RUN_FILES if (out / f).exists()]
    if held:
        how = "--resume to continue it, " if steps else ""
        raise CLIError(f"--out {out} already holds a previous run ({', '.join(held)}); pass {how}--overwrite to "
                       "replace it, or choose another --out")


def precheck_compare_out(out: Path, resume: bool, overwrite: bool) -> None:
    """``--compare``: refuse to write over a previous comparison in ``out`` without --overwrite."""
    _check_out_is_dir(out)
    held = [f for f in COMPARE_FILES if (out / f).exists()]
    if held and not (overwrite or resume):
        raise CLIError(f"--out {out} already holds a comparison ({', '.join(held)}); pass "
                       "--overwrite to replace it, or choose another --out")


def check_resume(ck: Checkpoints, hp: dict, config: dict, resume_from: Optional[int]) -> None:
    """``--resume``: refuse a checkpoint of another configuration, or a corrupt one (naming the newest
    intact one), before anything is trained."""
    step = resume_from if resume_from is not None else ck.steps()[-1]
    try:
        check_config(ck.read_meta(step)["config"], config, ck.dir)
    except CLIError as e:
        if "corrupt" not in str(e):
            raise
        exp = build_experiment(hp)
        raise ck.with_intact_hint(e, step, jax.eval_shape(lambda: init_state(exp, hp["seed"])), config) from None


def start_or_resume(rt, ckpts: Checkpoints, out: Path, config: dict, resume: bool,
                    resume_from: Optional[int]) -> tuple[Any, int, list[dict], float, int]:
    """The train state a run starts from: ``(state, step, history, train_time, train_tokens)``.

    With ``resume``: the checkpoint of step ``resume_from`` (default: the latest) of ``ckpts``,
    checked against ``config`` and its fingerprints; the checkpoints after it are deleted and the
    history of ``out/metrics.jsonl`` is cut there. Otherwise a fresh ``rt.init()`` (the ``ast``
    student from the teacher) and no file of a previous run in ``out`` survives (--overwrite).
    """
    if not resume:
        if is_writer():
            if ckpts.dir.exists():
                shutil.rmtree(ckpts.dir)  # --overwrite (checked before)
            for f in RUN_FILES:  # --overwrite: no file of the previous run survives a shorter new one
                (out / f).unlink(missing_ok=True)
        sync("overwrite")
        state = rt.init()
        if rt.exp.teacher_model is not None:
            state = rt.init_from_teacher(state)
        return state, 0, [], 0.0, 0
    step0 = resume_from if resume_from is not None else ckpts.steps()[-1]
    abstract = rt.abstract_args()[0]  # with the runtime's shardings
    try:
        meta = ckpts.read_meta(step0)
        check_config(meta["config"], config, ckpts.dir)
        state, meta = ckpts.restore(step0, abstract)
    except CLIError as e:
        if "corrupt" not in str(e):
            raise
        raise ckpts.with_intact_hint(e, step0, abstract, config) from None
    discarded = ckpts.discard_after(step0)
    if discarded and is_writer():
        print(f"{PROG}: discarded the checkpoints after step {step0} (steps {discarded}) in {ckpts.dir}",
              file=sys.stderr)
    history = [r for r in read_jsonl(out / "metrics.jsonl") if r.get("step", 0) <= step0]
    if is_writer():
        print(f"{PROG}: resumed {config['recipe']} from {ckpts.dir / str(step0)} (step {step0}/{config['steps']})",
              file=sys.stderr)
    return state, step0, history, float(meta.get("train_time", 0.0)), int(meta.get("train_tokens", 0))
