"""Compile-time profile of the 2:4 ops' partitioner callbacks (``bench_train_gpt.py --profile-compile``).

The 2:4 ops partition through ``jax.experimental.custom_partitioning``
(``jax_sparse24/_src/partitioning.py``): XLA calls back into Python while it compiles (``partition``,
GSPMD's ``infer_sharding_from_operands``, and the tracing of the per-shard function ``partition``
returns). Importing this module instruments those callbacks — it substitutes a subclass of
``custom_partitioning`` that times them — so that a benchmark can split a compile time into the
callbacks and the rest:

* :func:`partition_callback_stats` — ``{rule name: (calls, seconds)}`` since the import (cumulative: take
  the difference around a ``compile()``); the tracing of a per-shard function is named ``"<rule> (trace)"``,
  an instance that reused an identical one's partition result (the opt-in shared partitions) ``"<rule> (cached)"``;
* :func:`profile_partition_callbacks` — run a ``cProfile.Profile`` inside the callbacks from now on
  (``None`` stops); they may run on XLA's threads, where a profiler started around ``compile()`` does
  not see them.

Import it before the ops are traced (the library creates one ``custom_partitioning`` per traced op).
"""

from __future__ import annotations

import functools
import sys
import time

from jax.experimental.custom_partitioning import custom_partitioning

from jax_sparse24._src import partitioning

__all__ = ["partition_callback_stats", "profile_partition_callbacks"]

_STATS: dict[str, list] = {}  # rule name -> [calls, seconds]
_PROFILE: list = []  # [cProfile.Profile] while profiling


def partition_callback_stats() -> dict[str, tuple[int, float]]:
    """``{rule name: (calls, seconds)}``: the partitioner's callbacks into each 2:4 op's rule so far
    (``partition``/``infer``, and — named ``"<rule> (trace)"`` — the tracing of the per-shard function
    they return) and their wall time (cumulative)."""
    out = {k: (n, sec) for k, (n, sec) in _STATS.items()}
    # instances that reused an identical instance's partition result (JAX_SPARSE24_SHARED_PARTITIONS=1): no callback
    out.update({f"{rule} (cached)": (n, 0.0) for rule, n in partitioning.shared_partition_hits().items()})
    return out


def profile_partition_callbacks(profile=None):
    """Profile the partitioner callbacks with ``profile`` (a ``cProfile.Profile``) from now on; ``None`` stops."""
    _PROFILE[:] = [] if profile is None else [profile]


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args):
        prof = _PROFILE[0] if _PROFILE else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            return fn(*args)
        finally:
            if prof is not None:
                prof.disable()
            entry = _STATS.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    return wrapper


class _TimedCustomPartitioning(custom_partitioning):
    """``custom_partitioning`` whose callbacks are timed under the name of the library's rule."""

    def __init__(self, fun, *args, **kwargs):
        super().__init__(fun, *args, **kwargs)
        rule = sys._getframe(1).f_locals.get("rule")  # partitioning._cp_call(rule, impl, *args) creates it
        self._rule_name = getattr(rule, "name", getattr(fun, "__name__", "custom_partitioning"))

    def def_partition(self, partition, infer_sharding_from_operands=None, **kwargs):
        name = self._rule_name

        def timed_partition(*args):
            mesh, lower_fn, out_shardings, in_shardings = _timed(name, partition)(*args)
            return mesh, _timed(name + " (trace)", lower_fn), out_shardings, in_shardings

        if infer_sharding_from_operands is not None:
            kwargs["infer_sharding_from_operands"] = _timed(name, infer_sharding_from_operands)
        return super().def_partition(timed_partition, **kwargs)


partitioning.custom_partitioning = _TimedCustomPartitioning
