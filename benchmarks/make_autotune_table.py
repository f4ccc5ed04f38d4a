"""Turn a bench_spmm.py result (spmm.json) into the table ``backend="auto"`` reads.

    python benchmarks/make_autotune_table.py benchmarks/results/spmm.json [...] [--layer benchmarks/results/layer.json ...]

writes ``jax_sparse24/_src/spmm_autotune.json``: per measured (M, N, K, dtype) the fastest
configuration and its speedup over the faster XLA dense GEMM *with the per-call compression of
the sparse operand counted* (what ``sparse24_linear`` pays today). ``auto`` uses the sparse kernel
for a shape only where the nearest measured shape shows a speedup > autotune.MIN_GAIN (1.03, the noise floor) — so it never loses to dense
by the table's own measurement.

With ``--layer`` (a bench_layer.py result, the FFN shapes at T tokens): the forward and input-gradient
GEMMs measured there *with the fused compressor* (``fwd/dx cutlass + fused compress``, what
``sparse24_linear`` runs) replace the spmm.json speedup of the same (M, N, K) — the smaller of the
two when a shape is measured twice (forward of one layer, input gradient of the other). It also
writes ``entries_kn``: per measured weight-gradient GEMM (M = O, N = I, K = T) the fastest "kn"
configuration and the speedup of the fused MVUE+compress + sparse GEMM over XLA's exact dense
``xᵀ·∇y`` (what ``backend="auto"`` runs otherwise); ``autotune.choose_weight_grad`` reads it. Several
``--layer`` files (runs at different widths) are read as one (records concatenated; each file's
dtype applies to its own records). Where a layer run also measured cuSPARSELt with our fused
compressor writing its operand (``fwd/dx cusparselt + fused compress``, ``dw cusparselt + fused mvue
compress``), the entries get ``cusparselt_speedup_with_compress`` and ``cusparselt_gemm_speedup`` (GEMM
only, for prepared weights); ``auto`` runs cuSPARSELt where that beats both CUTLASS and the noise
floor. bench_spmm.py's own cuSPARSELt timings (``cusparselt_speedup``, ``..._with_compress``) fill
the same two fields for its shapes where no layer run measured them.

The cuSPARSELt version the inputs were measured with (their ``meta["cusparselt_version"]``, recorded
by bench_spmm.py / bench_layer.py, or ``--cusparselt-version`` for older results) is written as the
table's ``cusparselt_version``: ``auto`` uses the cuSPARSELt fields only with a library of the same
major.minor version (``cuda_cusparselt_ops.table_version_matches``).
"""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "jax_sparse24", "_src", "spmm_autotune.json")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spmm_json", nargs="+",
                   help="bench_spmm.py result(s); a later file's record of the same (T, I, O, dtype) replaces an "
                        "earlier one (e.g. a full older run, then a newer bfloat16-only run)")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--layer", nargs="+", default=None,
                   help="bench_layer.py result(s) (layer.json): replace the fwd/dx speedups, add entries_kn")
    p.add_argument("--cusparselt-version", default=None,
                   help="cuSPARSELt version of the measurements (results older than its meta field)")
    a = p.parse_args()
    versions = {}  # path -> the cuSPARSELt version its meta records
    records, meta = {}, None
    for path in a.spmm_json:
        with open(path) as f:
            data = json.load(f)
        if meta is not None and data["meta"]["configs"] != meta["configs"]:
            raise SystemExit(f"{path}: its CUTLASS configurations differ from {a.spmm_json[0]}'s; "
                             "the table's config_id would be ambiguous")
        meta = data["meta"]
        if meta.get("cusparselt_version"):
            versions[path] = meta["cusparselt_version"]
        for r in data["records"]:
            records[(r["T"], r["I"], r["O"], r["dtype"])] = r
    entries = []
    for r in records.values():
        if not r.get("config_ms"):
            continue
        cfg, ms = min(r["config_ms"].items(), key=lambda kv: kv[1])
        compress = r.get("fused_compress_ms") or r.get("compress_ms") or 0.0
        # CUTLASS's heuristic tile order: bench_spmm's tile-order sweep found no order that wins
        # consistently (best orders moved between runs, within ~4%; swizzle 8 was 2x slower on some
        # shapes), so a nearest-shape lookup must not carry one to other shapes.
        entries.append({
            "m": r["O"], "n": r["T"], "k": r["I"], "dtype": r["dtype"],
            "config": cfg, "config_id": meta["configs"].index(cfg),
            "gemm_speedup": r["baseline_ms"] / ms,
            "speedup_with_compress": r["baseline_ms"] / (ms + compress),
        })
        if r.get("cusparselt_ms"):  # cuSPARSELt timed beside CUTLASS (a --layer measurement replaces it)
            entries[-1]["cusparselt_speedup_with_compress"] = r["cusparselt_speedup_with_compress"]
            entries[-1]["cusparselt_gemm_speedup"] = r["cusparselt_speedup"]
    layer = None
    if a.layer:
        layer = {"records": []}
        for path in a.layer:
            with open(path) as f:
                part = json.load(f)
            dt = part["meta"].get("dtype", "bfloat16")
            if part["meta"].get("cusparselt_version"):
                versions[path] = part["meta"]["cusparselt_version"]
            layer["records"] += [dict(r, dtype=dt) for r in part["records"]]
        measured = {}  # (m, n, k, dtype) -> speedup with the fused compressor
        gemm_only = {}  # (m, n, k, dtype) -> GEMM-only speedup (default configuration)
        measured_lt = {}  # (m, n, k, dtype) -> cuSPARSELt GEMM + our fused compressor in its layout
        gemm_only_lt = {}  # (m, n, k, dtype) -> cuSPARSELt GEMM-only speedup (prepared weights)
        for r in layer["records"]:
            dtype = r["dtype"]
            if r.get("section") != "gemm":
                continue
            ms = r["ms"]
            fwd_base = min(ms.get("fwd dense x@w", float("inf")), ms.get("fwd dense x@(w*m)", float("inf")))
            for key, total, gemm_ms, base, lt_total, lt_gemm in (
                    ((r["O"], r["T"], r["I"], dtype), ms.get("fwd cutlass + fused compress"), ms.get("fwd cutlass gemm"),
                     fwd_base, ms.get("fwd cusparselt + fused compress"), ms.get("fwd cusparselt gemm")),
                    ((r["I"], r["T"], r["O"], dtype), ms.get("dx cutlass + fused compress"), ms.get("dx cutlass gemm"),
                     ms.get("dx dense g@w.T"), ms.get("dx cusparselt + fused compress"), ms.get("dx cusparselt gemm"))):
                if total and base:
                    measured[key] = min(measured.get(key, float("inf")), base / total)
                if gemm_ms and base:
                    gemm_only[key] = min(gemm_only.get(key, float("inf")), base / gemm_ms)
                if lt_total and base:
                    measured_lt[key] = min(measured_lt.get(key, float("inf")), base / lt_total)
                if lt_gemm and base:
                    gemm_only_lt[key] = min(gemm_only_lt.get(key, float("inf")), base / lt_gemm)
        for e in entries:
            hit = measured.pop((e["m"], e["n"], e["k"], e["dtype"]), None)
            if hit is not None:
                e["speedup_with_compress"] = hit
                e["compress_source"] = "layer (fused compressor)"
        for (m, n, k, dt), sp in measured.items():  # FFN shapes spmm.json does not have
            entries.append({"m": m, "n": n, "k": k, "dtype": dt, "config": None, "config_id": -1,
                            "gemm_speedup": gemm_only.get((m, n, k, dt)), "speedup_with_compress": sp,
                            "compress_source": "layer (fused compressor)"})
        for e in entries:  # cuSPARSELt beside CUTLASS where the layer run measured it (per-call operand)
            key = (e["m"], e["n"], e["k"], e["dtype"])
            if measured_lt.get(key) is not None:
                e["cusparselt_speedup_with_compress"] = measured_lt[key]
                # GEMM only: what a prepared weight pays per call (compression amortized)
                e["cusparselt_gemm_speedup"] = gemm_only_lt.get(key) or measured_lt[key]
    found = set(versions.values()) | ({a.cusparselt_version} if a.cusparselt_version else set())
    if len(found) > 1:
        raise SystemExit(f"the inputs were measured with different cuSPARSELt versions {versions} "
                         f"(--cusparselt-version {a.cusparselt_version}); make the table from one version's results")
    lt_version = found.pop() if found else None
    if lt_version is None:
        print("note: no cuSPARSELt version recorded (--cusparselt-version): auto will use the table's cuSPARSELt "
              "measurements with any library version")
    out = {
        "source": [os.path.relpath(path, os.path.join(HERE, "..")) for path in a.spmm_json],
        "device": meta["device"], "date": meta["date"], "configs": meta["configs"],
        "cusparselt_version": lt_version,
        "entries": entries,
    }
    if layer is not None:
        entries_kn = []
        for r in layer["records"]:
            if r.get("section") != "gemm" or not r.get("kn_best_config"):
                continue
            ms = r["ms"]
            fused = ms.get("dw cutlass + fused mvue compress")
            exact = ms.get("dw dense x.T@g")
            if not fused or not exact:
                continue
            cfg = r["kn_best_config"]
            gemm_ms = ms[f"dw cutlass kn gemm [{cfg}]"]
            default_gemm = ms.get("dw cutlass kn gemm")
            if default_gemm is not None and default_gemm < gemm_ms:
                # the build's own heuristic choice (config -1) beat every named configuration
                # (e.g. 0.808 vs 0.855 ms, layer_llama1b_t16384.json 2048x11264): keep it
                cfg, gemm_ms = None, default_gemm
            entry = {
                "m": r["O"], "n": r["I"], "k": r["T"], "dtype": r["dtype"],
                "config": cfg,
                # the fused path measured with the default config; credit the best config's GEMM gain
                "speedup_with_compress": exact / (fused - (default_gemm or gemm_ms) + gemm_ms),
            }
            lt_fused = ms.get("dw cusparselt + fused mvue compress")
            if lt_fused:
                entry["cusparselt_speedup_with_compress"] = exact / lt_fused
            entries_kn.append(entry)
        out["entries_kn"] = entries_kn
        out["source_kn"] = [os.path.relpath(path, os.path.join(HERE, "..")) for path in a.layer]
        for e in entries_kn:
            lt_sp = e.get("cusparselt_speedup_with_compress")
            print(f"kn {e['m']:>6} {e['n']:>6} {e['k']:>6} {e['dtype']:<9} {str(e['config']):<32} "
                  f"with fused MVUE compress {e['speedup_with_compress']:.2f}x"
                  + ("" if lt_sp is None else f", cusparselt {lt_sp:.2f}x"))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for e in entries:
        gemm = "   - " if e["gemm_speedup"] is None else f"{e['gemm_speedup']:.2f}x"
        lt_sp = e.get("cusparselt_speedup_with_compress")
        print(f"{e['m']:>6} {e['n']:>6} {e['k']:>6} {e['dtype']:<9} {str(e['config']):<36} "
              f"gemm {gemm}  with compress {e['speedup_with_compress']:.2f}x"
              + ("" if lt_sp is None else f"  cusparselt {lt_sp:.2f}x"))


if __name__ == "__main__":
    main()
