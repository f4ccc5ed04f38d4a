"""Which custom calls a rematerialised train step runs: the example's step (bench_train_gpt's
experiment) compiled under --remat none / dots / full, on one device and over a mesh, with the
custom-call targets counted in the lowered (pre-partitioning) and the optimized HLO.

    python scripts/probe_remat_hlo.py --size llama-7b --n-layer 2 --batch-size 8 --mesh fsdp=4

Exit 1 when, on a mesh (or one device), ``--remat dots`` runs more 2:4 GEMM custom calls than ``--remat none``:
a kept 2:4 GEMM output must not be computed twice (``checkpoint_policy``; the optimization barrier on the
GEMMs' CUDA results, ``ffi.per_platform(..., barrier=True)``). On a CPU there are no custom calls to count.
"""
import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import jax  # noqa: E402

import bench_train_gpt as btg  # noqa: E402
import train_gpt  # noqa: E402


def counts(text: str) -> collections.Counter:
    return collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))


#: the custom-call targets of the 2:4 GEMMs (16-bit CUTLASS and cuSPARSELt, fp8; forward, input and weight gradient)
GEMM_TARGETS = ("jax_sparse24_cutlass_spmm", "jax_sparse24_cutlass_spmm_kn", "jax_sparse24_cusparselt_spmm",
                "jax_sparse24_cutlass_spmm_fp8")


def gemm_calls(c: collections.Counter) -> int:
    return sum(n for t, n in c.items() if t in GEMM_TARGETS)


def recomputed(by_mode: dict) -> list[str]:
    """Meshes on which ``dots`` runs more 2:4 GEMMs than ``none``: ``{(mesh, remat): Counter}`` -> messages."""
    return [f"mesh {mesh}: remat=dots runs {gemm_calls(c)} 2:4 GEMM calls, remat=none {gemm_calls(by_mode[(mesh, 'none')])}"
            for (mesh, remat), c in by_mode.items()
            if remat == "dots" and (mesh, "none") in by_mode and gemm_calls(c) > gemm_calls(by_mode[(mesh, "none")])]


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
    by_mode = {}
    for mesh in [None, *a.mesh]:
        for remat in a.remat.split(","):
            exp = btg.experiment(a.size, a.recipe, a.batch_size, a.seq_len, 10,
                                  ["--remat", remat, "--n-layer", a.n_layer], 32000)
            rt = train_gpt.make_runtime(exp, train_gpt.parse_mesh(mesh) if mesh else None)
            st, tok = rt.abstract_args()
            sparse = None if exp.cfg.method == "dense" else True
            with btg.weight_gather(btg.weight_gather_of(a.recipe)):
                low = rt.train_step(sparse).lower(st, tok)
            pre = low.as_text().count("@CustomSPMDPartitioning")
            comp = low.compile().as_text()
            c = counts(comp)
            by_mode[(mesh or "one device", remat)] = c
            if a.dump:
                Path(a.dump).mkdir(parents=True, exist_ok=True)
                (Path(a.dump) / f"{a.recipe}_{remat}_{(mesh or 'one').replace('=', '')}.hlo.txt").write_text(comp)
            print(f"{a.recipe} mesh={mesh or 'one device'} remat={remat}: lowered CustomSPMDPartitioning {pre}; "
                  f"optimized custom calls {dict(sorted(c.items()))}", flush=True)
    bad = recomputed(by_mode)
    for msg in bad:
        print(f"probe_remat_hlo: {msg}: a kept 2:4 GEMM output is computed twice", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
