"""JAX's persistent compilation cache in a directory for a block of tests (tests/conftest.py, for the
whole session and every pytest-xdist worker): identical XLA programs compile once."""

import contextlib
import os

_KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_persistent_cache_min_entry_size_bytes")


def _atomic_writes() -> bool:
    """Make JAX's file cache write each entry atomically (a temporary file renamed into place), so processes
    sharing the directory never read an entry another one is still writing. False where this JAX's cache
    class is not the one expected (the caller then keeps a directory per process).

    JAX's own way, a size limit (``jax_compilation_cache_max_size``), locks every read and write and reads
    every entry's access time at every write: quadratic in the entries, minutes over the test suite."""
    try:
        from jax._src import lru_cache
    except ImportError:
        return False
    cls, suffix = getattr(lru_cache, "LRUCache", None), getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cls is None or suffix is None or not hasattr(cls, "put"):
        return False
    if getattr(cls.put, "_atomic", False):
        return True
    put = cls.put

    def atomic_put(self, key: str, value: bytes) -> None:
        if getattr(self, "eviction_enabled", True):  # JAX's locked path
            return put(self, key, value)
        if not key:
            raise ValueError("key cannot be empty")
        path = self.path / f"{key}{suffix}"
        if path.exists():
            return
        tmp = self.path / f".{key}.{os.getpid()}.tmp"
        tmp.write_bytes(value)
        os.replace(tmp, path)

    atomic_put._atomic = True
    cls.put = atomic_put
    return True


@contextlib.contextmanager
def compilation_cache(directory, shared: bool = False):
    """Every program compiled inside the block is cached in ``directory``; the previous settings after.

    ``shared``: other processes use the same directory at the same time (entries written atomically; where
    that cannot be arranged, the directory is this process's alone: ``directory/<pid>``)."""
    import jax
    from jax._src import compilation_cache as cc

    if shared and not _atomic_writes():
        directory = os.path.join(str(directory), str(os.getpid()))
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
