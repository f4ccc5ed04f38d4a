"""JAX's persistent compilation cache in a directory for a block of tests (tests/conftest.py for the
session, tests/test_train_gpt.py for its module): identical XLA programs compile once."""

import contextlib

_KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_persistent_cache_min_entry_size_bytes")


@contextlib.contextmanager
def compilation_cache(directory):
    """Every program compiled inside the block is cached in ``directory``; the previous settings after."""
    import jax
    from jax._src import compilation_cache as cc

    old = {k: getattr(jax.config, k) for k in _KEYS}
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    cc.reset_cache()
    try:
        yield
    finally:
        for k, v in old.items():
            jax.config.update(k, v)
        cc.reset_cache()
