"""Whether XLA's GPU lowering of ``fp8.quantize`` is bit-exact with the CPU's (the documented float32
math: one correctly rounded ``1/s``, one product, round to nearest even): random float32 tensors and
random scales, every element compared. Prints the mismatches; exit 0 either way (a diagnostic).

    python scripts/check_xla_quantize.py [--n 1048576] [--trials 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jax_sparse24._src import fp8_math as f8  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args(argv)
    cpu, dev = jax.devices("cpu")[0], jax.devices()[0]
    q = jax.jit(f8.quantize)
    rng = np.random.default_rng(0)
    bad = total = 0
    for _ in range(args.trials):
        t = (rng.standard_normal(args.n) * rng.uniform(0.5, 30)).astype(np.float32)
        s = np.float32(rng.uniform(1e-3, 0.3))
        a = np.asarray(q(jax.device_put(t, dev), jax.device_put(jnp.float32(s), dev))).view(np.uint8)
        b = np.asarray(q(jax.device_put(t, cpu), jax.device_put(jnp.float32(s), cpu))).view(np.uint8)
        diff = np.nonzero(a != b)[0]
        bad, total = bad + diff.size, total + t.size
        for k in diff[:2]:
            inv = np.float32(1) / s
            print(f"  t={t[k]!r} s={s!r}: {dev.platform} {a[k]:#04x}, cpu {b[k]:#04x}; t*(1/s)={t[k] * inv!r} t/s={t[k] / s!r}")
    print(f"XLA fp8.quantize, {dev.platform} vs cpu: {bad} of {total} elements differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
