"""Session-wide test setup.

Eight host (CPU) devices for the sharding tests (tests/test_sharding.py), and XLA at -O0 where no GPU is visible.
XLA reads ``XLA_FLAGS`` when the CPU backend starts, which happens on first use anywhere in the pytest
process, so the flags are set here — before any test module is collected. Single-device tests are
unaffected by the device count: un-sharded computations still run on device 0.
"""

import os

import pytest

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_FLAG}=8").strip()


def _gpu_visible() -> bool:
    """An NVIDIA device node exists (checked without starting JAX)."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0"))


# XLA's code generation without LLVM's optimization passes, where no GPU is visible (the GPU tests keep XLA's
# default): the tests' programs are tiny, compiling them is most of the suite's CPU time, and -O0 takes about 40%
# less of it. Comparisons between two programs compare programs compiled alike; a test that compares with numbers
# recorded from XLA's default code compiles with compiler_options of its own (test_step_trajectory.py). Inherited by
# the example runs the tests start as subprocesses. An --xla_backend_optimization_level in XLA_FLAGS is kept.
_OPT = "--xla_backend_optimization_level"
if _OPT not in os.environ["XLA_FLAGS"] and not _gpu_visible():
    os.environ["XLA_FLAGS"] += f" {_OPT}=0"

# Property-based tests (tests/test_properties.py): derandomized so CI runs the same examples every time;
# no per-example deadline (the first example of a shape includes XLA compilation).
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("jax_sparse24", derandomize=True, deadline=None, print_blob=True)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "jax_sparse24"))
except ImportError:  # hypothesis is in the `test` extra; test_properties.py skips without it
    pass


# JAX's persistent compilation cache for the whole session, in a fresh temp directory that every pytest-xdist worker
# of the run shares: tests that build the same tiny models compile identical XLA programs through different jitted
# functions and in different workers; the cache (keyed on the program, the compile options and the jax/jaxlib
# versions) compiles each once.
try:
    from jax_cache import compilation_cache as _compilation_cache

    @pytest.fixture(scope="session", autouse=True)
    def _session_compilation_cache(tmp_path_factory):
        if not os.environ.get("PYTEST_XDIST_WORKER"):  # not distributed: this process's own directory
            with _compilation_cache(tmp_path_factory.mktemp("jax_session_cache")):
                yield
            return
        # every worker's base temp directory is a sub-directory of the run's (pytest-of-<user>/pytest-<N>/popen-gw<i>)
        shared = tmp_path_factory.getbasetemp().parent / "jax_session_cache"
        shared.mkdir(exist_ok=True)
        with _compilation_cache(shared, shared=True):
            yield
except ImportError:
    pass


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# `-n auto` (pyproject.toml's addopts): one pytest-xdist worker per core, at most 4 (each worker holds its own JAX
# runtime and compiled programs: up to ~5 GiB, ~10 GiB for the whole run with two); none where a GPU is visible:
# the GPU tests share one device and their timings are read alone. `-n 0` runs in one process anywhere;
# PYTEST_XDIST_AUTO_NUM_WORKERS=N overrides.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    if _gpu_visible():
        return 0
    return min(_cpu_count(), 4)


# `--shard I/N`: run the I-th of N parts of the collected tests (1-based), the tests dealt round-robin in node-id
# order, so the N parts together are the whole suite and each part mixes the test files. The GPU suite no longer fits
# one 10-minute device call on a multi-GPU host: scripts/gpu_check.sh runs it in parts (TEST_SHARD=I/N) and
# scripts/gpu_test_report.py adds the parts' JUnit files up into one report.
def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` → ``(I, N)`` with ``1 <= I <= N``; ``ValueError`` naming the constraint otherwise."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or not 1 <= i <= n:
        raise ValueError(f"--shard wants I/N with 1 <= I <= N (e.g. 2/3), got {text!r}")
    return i, n


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N round-robin parts of the collected tests (1-based)")


def pytest_collection_modifyitems(config, items):
    text = config.getoption("--shard")
    if not text:
        return
    try:
        i, n = parse_shard(text)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    ordered = sorted(items, key=lambda item: item.nodeid)
    keep = {id(item) for k, item in enumerate(ordered) if k % n == i - 1}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in keep])
    items[:] = [item for item in items if id(item) in keep]
