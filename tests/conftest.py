"""Session-wide test setup.

Eight host (CPU) devices for the sharding tests (tests/test_sharding.py, issue 6). XLA reads
``XLA_FLAGS`` when the CPU backend starts, which happens on first use anywhere in the pytest
process, so the flag is set here — before any test module is collected. Single-device tests are
unaffected: un-sharded computations still run on device 0.
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_FLAG}=8").strip()

# Property-based tests (tests/test_properties.py): derandomized so CI runs the same examples every time;
# no per-example deadline (the first example of a shape includes XLA compilation).
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("jax_sparse24", derandomize=True, deadline=None, print_blob=True)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "jax_sparse24"))
except ImportError:  # hypothesis is in the `test` extra; test_properties.py skips without it
    pass


# JAX's persistent compilation cache for the whole session, in a fresh temp directory: tests that build the same
# tiny models compile identical XLA programs through different jitted functions; the cache (keyed on the program,
# the compile options and the jax/jaxlib versions) compiles each once. Modules that set their own cache directory
# (test_train_gpt.py) restore this one afterwards.
try:
    import pytest as _pytest

    from jax_cache import compilation_cache as _compilation_cache

    @_pytest.fixture(scope="session", autouse=True)
    def _session_compilation_cache(tmp_path_factory):
        with _compilation_cache(tmp_path_factory.mktemp("jax_session_cache")):
            yield
except ImportError:
    pass
