"""Which custom calls a rematerialised train step runs: the example's step (bench_train_gpt's
experiment) compiled under --remat none / dots / full, on one device and over a mesh, with the
custom-call targets counted in the lowered (pre-partitioning) and the optimized HLO.

    python scripts/probe_remat_hlo.py --size llama-7b --n-layer 2 --batch-size 8 --mesh fsdp=4
"""
import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "examples")]

import jax  # noqa: E402

import bench_train_gpt as btg  # noqa: E402
import train_gpt  # noqa: E402


def counts(text: str) -> collections.Counter:
    return collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="llama-7b")
    ap.add_argument("--n-layer", default="2")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--recipe", default="srste")
    ap.add_argument("--mesh", action="append", default=[], help="meshes besides one device (repeatable)")
    ap.add_argument("--remat", default="none,dots,full")
    ap.add_argument("--dump", default=None, help="write each optimized HLO here")
    a = ap.parse_args()
    for mesh in [None, *a.mesh]:
        for remat in a.remat.split(","):
            exp = btg._experiment(a.size, a.recipe, a.batch_size, a.seq_len, 10,
                                  ["--remat", remat, "--n-layer", a.n_layer], 32000)
            rt = train_gpt.make_runtime(exp, train_gpt.parse_mesh(mesh) if mesh else None)
            st, tok = rt.abstract_args()
            sparse = None if exp.cfg.method == "dense" else True
            with btg.weight_gather(btg.weight_gather_of(a.recipe)):
                low = rt.train_step(sparse).lower(st, tok)
            pre = low.as_text().count("@CustomSPMDPartitioning")
            comp = low.compile().as_text()
            c = counts(comp)
            if a.dump:
                Path(a.dump).mkdir(parents=True, exist_ok=True)
                (Path(a.dump) / f"{a.recipe}_{remat}_{(mesh or 'one').replace('=', '')}.hlo.txt").write_text(comp)
            print(f"{a.recipe} mesh={mesh or 'one device'} remat={remat}: lowered CustomSPMDPartitioning {pre}; "
                  f"optimized custom calls {dict(sorted(c.items()))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
