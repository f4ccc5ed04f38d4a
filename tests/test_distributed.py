"""Multi-device and multi-process runs of benchmarks/harness/train_gpt.py on the CPU: FSDP and
tensor parallel equal the single-device step without resharding activations inside a layer,
checkpoints written on 4 devices resume on 2 processes (resharded, fingerprints verified) with the
losses of an uninterrupted run, and examples/launch.py stops every process when one dies."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import gpt_runtime  # noqa: E402
from jaxpr_util import sharding_constraints  # noqa: E402
import train_gpt  # noqa: E402

# tiny: 1 layer, width 32, 2 heads; 8 x 32 tokens per step
TINY = ["--size", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--seq-len", "32",
        "--batch-size", "8", "--eval-batches", "1", "--quiet", "--lr", "3e-3", "--warmup", "1",
        "--final-eval-tokens", "0", "--log-every", "1"]


def _env(devices: int) -> dict:
    """The environment of a run on ``devices`` CPU devices (this session's other XLA flags kept)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    return dict(os.environ, XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]), JAX_PLATFORMS="cpu",
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _runtime(recipe: str, mesh_shape, extra=(), layers: str = "scan"):
    args = train_gpt.build_parser().parse_args(["--size", "llama-tiny", "--n-layer", "1", "--batch-size", "8",
                                                "--seq-len", "20", "--recipe", recipe, *extra])
    hp = dict(train_gpt.resolve_flags(args, recipe), data_sha256="-")
    exp = train_gpt.build_experiment(hp)
    if exp.cfg.layers != layers:  # the other block layout: (L, in, out) stacks or h_<i> modules
        import model

        exp.cfg = dataclasses.replace(exp.cfg, layers=layers)
        exp.model, exp.sparse_paths = model.GPT(exp.cfg), model.sparse_layer_paths(exp.cfg)
    n = int(np.prod(mesh_shape))
    mesh = None if n == 1 else gpt_runtime.mesh_of_shape(mesh_shape, devices=jax.devices()[:n])
    return gpt_runtime.make_runtime(exp, mesh)


@pytest.mark.parametrize("layers", ["scan", "unroll"])
def test_fsdp_and_tensor_parallel_specs_of_stacked_and_unrolled_layers(layers):
    """The params, their Adam moments and the batch under fsdp=2 x model=2: kernels (stacked
    ``(L, in, out)`` or not) column / row parallel over ``model`` and FSDP over ``fsdp`` on their
    other axis, the layer axis never sharded; the batch split over data x fsdp."""
    rt = _runtime("ste", (1, 2, 2), layers=layers)
    specs = {jax.tree_util.keystr(p): tuple(s.spec) for p, s in jax.tree_util.tree_leaves_with_path(rt.state_shardings)}
    h, lead = ("['h']", (None,)) if layers == "scan" else ("['h_0']", ())
    assert specs[f"['params']{h}['attn']['qkv']['kernel']"] == lead + ("fsdp", "model")
    assert specs[f"['params']{h}['mlp']['proj']['kernel']"] == lead + ("model", "fsdp")
    assert specs[f"['opt_state'][1][0].mu{h}['mlp']['fc']['kernel']"] == lead + ("fsdp", "model")
    assert specs[f"['params']{h}['ln_1']['scale']"] in (lead + (None,), ())
    assert specs["['params']['wte']['embedding']"] == ("fsdp", None)
    assert tuple(rt.data_sharding.spec) == (("data", "fsdp"), None)


def test_fsdp_and_tensor_parallel_step_equals_one_device_and_reshards_no_activation():
    """One ste train step (2:4 kernels, deterministic) of a llama-tiny layer (scanned) under FSDP x
    tensor parallel (fsdp=2, model=2) equals the single-device step; in the compiled program no
    collective moves an activation (a dimension of 20 tokens per sequence or of the token count)
    except the row-parallel all-reduces: no all-to-all, no activation all-gather or
    collective-permute (before the qkv / gate-up columns were grouped per head, and before the GEMMs
    kept FSDP's token sharding and the runtime pinned the activations, there were all three)."""
    ref = _runtime("ste", (1, 1, 1))
    rt = _runtime("ste", (1, 2, 2))
    tokens = np.random.default_rng(0).integers(0, 256, (8, 21)).astype(np.int32)
    state0 = ref.init()
    st_ref, m_ref = ref.train_step(True)(state0, ref.put(tokens))
    state = jax.device_put(jax.device_get(state0), rt.state_shardings)
    step = rt.train_step(True).lower(*rt.abstract_args()).compile()
    st, m = step(state, rt.put(tokens))
    np.testing.assert_allclose(float(m["loss"]), float(m_ref["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(st["params"])), jax.tree.leaves(jax.device_get(st_ref["params"]))):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)

    hlo = step.as_text()
    moved = []
    for shape, op in re.findall(r"= (\S+|\([^)]*\)) (all-gather|all-to-all|collective-permute)(?:-start)?\(", hlo):
        dims = {int(d) for d in re.findall(r"\d+", re.sub(r"\{[^}]*\}", "", shape.split("[", 1)[-1]))}
        if op == "all-to-all" or dims & {20, 160, 80, 40}:
            moved.append(f"{op} {shape}")
    assert not moved, moved
    assert "all-gather" in hlo  # FSDP: the weights are gathered for the layer


@pytest.mark.parametrize("layers", ["scan", "unroll"])
@pytest.mark.parametrize("recipe", ["dense", "srste"])
def test_fsdp_pins_the_mlp_activations_to_the_batch_sharding(recipe, layers):
    """Under FSDP the blocks' inputs and outputs are constrained to the batch sharding, and the SwiGLU MLP's fc
    output (tokens x 2h) and proj input (tokens x h) to the batch sharding on the token axis, the feature axis
    left to the partitioner (a tensor-parallel column shard). Without the linear layers' pins, on 2 x H100,
    XLA resharded the MLP's activations between the fc kernel's column sharding and the batch sharding in
    the backward (all-to-alls of tokens x 11008 per LLaMA-7B layer); XLA's CPU partitioner does not make
    that choice, so this test checks the constraints in the traced step rather than the compiled program."""
    rt = _runtime(recipe, (1, 2, 1), layers=layers)
    h, d = rt.exp.cfg.ffn_hidden, rt.exp.cfg.n_embd
    found = sharding_constraints(jax.make_jaxpr(rt.train_step(recipe != "dense"))(*rt.abstract_args()))
    free = jax.sharding.PartitionSpec.UNCONSTRAINED
    for width in (2 * h, h):  # fc's output, proj's input; the forward's and the gradient's
        specs = [spec for shape, spec in found if shape[-1] == width]
        assert specs.count((gpt_runtime.BATCH_AXES, free, free)) >= 2, (width, specs)
    # the blocks' (and attention's, the MLP's) inputs and outputs: tokens x d on the batch sharding
    assert [shape[-1] for shape, spec in found if spec == (gpt_runtime.BATCH_AXES,)].count(d) >= 4, found
    # without an fsdp axis (data parallel) nothing is pinned
    dp = _runtime(recipe, (2, 1, 1), layers=layers)
    assert not sharding_constraints(jax.make_jaxpr(dp.train_step(recipe != "dense"))(*dp.abstract_args()))


def test_mesh_not_dividing_heads_or_groups_is_refused_before_compiling():
    with pytest.raises(train_gpt.CLIError, match=r"heads.*attn/qkv: 4 heads|attn/qkv: 4 heads"):
        _runtime("ste", (1, 1, 8))
    # a width whose 2:4 groups a model split cuts: 36 columns of proj's input over 2 -> 18 per device
    with pytest.raises(train_gpt.CLIError, match=r"h/attn/proj/kernel.*dimension 1 \(size 36\).*'model'"):
        _runtime("ste", (1, 1, 2), ["--n-embd", "36", "--n-head", "2"])


def test_checkpoint_of_four_devices_resumes_on_two_processes(tmp_path):
    """Saved on 4 devices (FSDP x tensor parallel, one process), resumed by 2 processes of one CPU device each (data
    parallel, examples/launch.py, gloo): restored into the new mesh's shardings, fingerprints
    verified, and the losses after the resume are those of the uninterrupted 4-device run."""
    part = tmp_path / "run"
    common = TINY + ["--recipe", "ste", "--steps", "4", "--eval-every", "2", "--ckpt-every", "2"]
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'benchmarks' / 'harness')!r})
import train_gpt
sys.exit(train_gpt.main({common!r} + ["--mesh", "fsdp=2,model=2", "--out", {str(part)!r}]))
"""
    res = subprocess.run([sys.executable, "-c", code], env=_env(4), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    a = _losses(part)  # the uninterrupted run; continued below from its checkpoint of step 2
    t = time.monotonic()
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "launch.py"), "--nproc", "2", "--cpu",
                          "--log-dir", str(tmp_path / "logs"), "--", str(ROOT / "benchmarks" / "harness" / "train_gpt.py"),
                          *common, "--distributed", "--mesh", "data=2", "--resume-from", "2", "--out", str(part)],
                         env=_env(1), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + (tmp_path / "logs" / "proc1.log").read_text()[-2000:]
    assert "resumed ste" in res.stderr and "2 cpu device(s)" in res.stderr, res.stderr[-2000:]
    # process 1 logged nothing of its own (quiet, no progress lines) but trained in step
    assert "resumed" not in (tmp_path / "logs" / "proc1.log").read_text()
    b = _losses(part)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    np.testing.assert_allclose([b[s] for s in (3, 4)], [a[s] for s in (3, 4)], rtol=1e-4)
    assert time.monotonic() - t < 120


def test_launcher_stops_the_others_when_one_process_dies(tmp_path):
    """Process 1 exits with code 3 while process 0 would wait forever (as in a collective): the
    launcher stops process 0, prints the failed process's last lines, and exits with code 3."""
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['JAX_PROCESS_ID'] == '1':\n"
                      "    print('rank 1 failing', flush=True); sys.exit(3)\n"
                      "time.sleep(600)\n")
    t = time.monotonic()
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "launch.py"), "--nproc", "2", "--cpu",
                          "--grace", "2", "--log-dir", str(tmp_path / "logs"), "--", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 3
    assert time.monotonic() - t < 20
    assert re.search(r"process 1 \(pid \d+\) exited with code 3; stopping", res.stderr) and "rank 1 failing" in res.stderr


def test_launcher_names_a_killed_process_and_keeps_the_survivors_errors_off_the_terminal(tmp_path):
    """Process 1 is killed by SIGKILL; process 0 (which ignores SIGTERM, as a JAX process with the
    distributed runtime does) then prints a traceback, as a collective or compilation cut short would: the
    launcher names process 1, its pid and its signal, the traceback stays in process 0's log, process 0 is
    killed after --grace, and the launcher exits 128 + 9."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "if os.environ['JAX_PROCESS_ID'] == '1':\n"
        "    time.sleep(1); os.kill(os.getpid(), signal.SIGKILL)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('rank 0 training', flush=True)\n"
        "time.sleep(3)\n"  # the peer is dead by now
        "print('Traceback (most recent call last):\\nRuntimeError: ptxas exited with non-zero error code 15',"
        " file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n")
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "launch.py"), "--nproc", "2", "--cpu",
                          "--grace", "4", "--log-dir", str(tmp_path / "logs"), "--", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 128 + 9, res.stderr
    assert "rank 0 training" in res.stdout
    assert re.search(r"process 1 \(pid \d+\) was killed by SIGKILL \(signal 9\); stopping the other", res.stderr)
    assert "Traceback" not in res.stderr + res.stdout and "ptxas" not in res.stderr, res.stderr
    assert "ptxas exited" in (tmp_path / "logs" / "proc0.log").read_text()


def test_distributed_flag_without_environment_is_a_clear_error(capsys, monkeypatch):
    for k in gpt_runtime.DIST_ENV:
        monkeypatch.delenv(k, raising=False)
    assert train_gpt.main(TINY + ["--distributed", "--out", "unused"]) == 2
    assert "JAX_COORDINATOR_ADDRESS" in capsys.readouterr().err


def test_fingerprint_never_gathers_and_does_not_depend_on_the_sharding():
    """Checkpoint fingerprints (gpt_checkpoints.fingerprint): each device hashes its own shards and
    only scalars are all-reduced (no all-gather, no all-to-all in the program); the hashes equal
    those of the unsharded arrays, so a checkpoint verifies on any mesh."""
    import gpt_checkpoints
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = gpt_runtime.mesh_of_shape((2, 1, 2), devices=jax.devices()[:4])
    x = jax.random.normal(jax.random.key(0), (3, 16, 32)).astype(jnp.bfloat16)
    tree = {"k": x, "m": x > 0, "s": jnp.arange(5, dtype=jnp.int32)}
    specs = {"k": P(None, "fsdp", "model"), "m": P(None, "model", "data"), "s": P()}
    sharded = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in tree.items()}
    want = [int(v) for v in gpt_checkpoints.fingerprint(jax.device_get(tree))]
    assert [int(v) for v in gpt_checkpoints.fingerprint(sharded)] == want
    leaves = jax.tree.leaves(sharded)
    prog = gpt_checkpoints.fingerprint_program(tuple(a.sharding for a in leaves), NamedSharding(mesh, P()))
    hlo = prog.lower(leaves).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo and "all-reduce" in hlo
