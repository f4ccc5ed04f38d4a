"""JAX's persistent compilation cache in a directory for a block of tests (tests/conftest.py, for the
whole session and every pytest-xdist worker): identical XLA programs compile once."""

import contextlib

_KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_persistent_cache_min_entry_size_bytes", "jax_compilation_cache_max_size")

# With a size limit JAX's cache takes a file lock around each read and write, so processes sharing the
# directory (pytest-xdist workers) never read an entry another one is still writing. The limit itself
# is never reached by the test suite.
_SHARED_MAX_SIZE = 64 << 30


@contextlib.contextmanager
def compilation_cache(directory, shared: bool = False):
    """Every program compiled inside the block is cached in ``directory``; the previous settings after.

    ``shared``: other processes use the same directory at the same time (reads and writes locked; needs
    the ``filelock`` package, else the directory is this process's alone: ``directory/pid``)."""
    import os

    import jax
    from jax._src import compilation_cache as cc

    if shared:
        try:
            import filelock  # noqa: F401  (what JAX's cache locks with)
        except ImportError:
            directory, shared = os.path.join(str(directory), str(os.getpid())), False
    old = {k: getattr(jax.config, k) for k in _KEYS}
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if shared:
        jax.config.update("jax_compilation_cache_max_size", _SHARED_MAX_SIZE)
    cc.reset_cache()
    try:
        yield
    finally:
        for k, v in old.items():
            jax.config.update(k, v)
        cc.reset_cache()
