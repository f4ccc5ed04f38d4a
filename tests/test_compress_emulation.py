"""CPU check of the fused 2:4 compressors' kernel code (xla_ffi/compress_kernels.cu, and the fp8 MVUE,
masked and quantize-transpose kernels of xla_ffi/fp8_compress_kernels.cu) without a GPU.

Compiles tests/cpp/compress_emulation.cu (and fp8_compress_emulation.cu) with nvcc (host code only runs)
and runs it: the kernels' real per-thread code is emulated with 256 host threads per CTA and compared
byte for byte with an independent implementation of CUTLASS's compressor (see the .cu files), the
many-tensor kernel (one launch over a table of (x, mask) pairs) included. Skipped without nvcc or the
XLA FFI headers. Both programs compile at once (about 15 s on 2 cores), cached by a hash of their inputs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _jaxlib_include():
    try:
        import jaxlib
    except ImportError:
        return None
    inc = os.path.join(os.path.dirname(jaxlib.__file__), "include")
    return inc if os.path.exists(os.path.join(inc, "xla", "ffi", "api", "ffi.h")) else None


_SOURCES = ("compress_emulation.cu", "fp8_compress_emulation.cu")


def _build_key(nvcc: str, inc: str, cmd_tail: list) -> str:
    """Hash of everything a build reads: the emulation sources, the kernels (xla_ffi/), the FFI headers' jaxlib,
    nvcc's version and the flags."""
    import hashlib

    import jaxlib

    h = hashlib.sha256()
    for d in (os.path.join(ROOT, "tests", "cpp"), os.path.join(ROOT, "xla_ffi")):
        for dirpath, dirnames, files in os.walk(d):
            dirnames.sort()
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                h.update(os.path.relpath(path, ROOT).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    h.update("\0".join([version, inc, getattr(jaxlib, "__version__", ""), *cmd_tail]).encode())
    return h.hexdigest()[:24]


@pytest.fixture(scope="module")
def emulation_executables(tmp_path_factory):
    """Both emulation programs, built at once (two nvcc processes in parallel) and cached under the temp dir
    by a hash of every input (see _build_key), so a rerun with nothing changed skips nvcc. Returns
    {source: executable path or the nvcc error}. The device half of nvcc's work (cicc, ptxas) is built
    with -O0: only host code runs here."""
    import tempfile

    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    inc = _jaxlib_include()
    if nvcc is None or inc is None:
        pytest.skip("needs nvcc and the XLA FFI headers (jaxlib/include)")
    flags = ["-std=c++20", "-O1", "--expt-relaxed-constexpr", "-Xcicc", "-O0", "-Xptxas", "-O0",
             "-I", os.path.join(ROOT, "xla_ffi"), "-I", inc]
    cache = os.path.join(tempfile.gettempdir(), "jax_sparse24_emulation", _build_key(nvcc, inc, flags))
    os.makedirs(cache, exist_ok=True)
    work = tmp_path_factory.mktemp("emulation")
    # one build per key at a time: a second process (a pytest-xdist worker given this module's other test) waits
    # for the first one's executables instead of compiling them again
    with open(os.path.join(cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(nvcc, flags, cache, work)


def _build(nvcc, flags, cache, work):
    """The executables of _SOURCES in ``cache``, built (in ``work``) where missing."""
    result, builds = {}, {}
    for source in _SOURCES:
        exe = os.path.join(cache, os.path.splitext(source)[0])
        if os.path.exists(exe):
            result[source] = exe
            continue
        out = str(work / os.path.splitext(source)[0])
        cmd = [nvcc, *flags, os.path.join(ROOT, "tests", "cpp", source), "-o", out]
        builds[source] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out, exe)
    for source, (proc, out, exe) in builds.items():
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            result[source] = f"nvcc failed:\n{err[-4000:]}"
            continue
        shutil.copy2(out, exe + f".{os.getpid()}.tmp")
        os.replace(exe + f".{os.getpid()}.tmp", exe)  # atomic: a concurrent run sees a whole file or none
        result[source] = exe
    return result


def _run_host_emulation(executables, source: str):
    """Run the built tests/cpp/``source`` (host code only runs); assert it printed "all cases ok"."""
    exe = executables[source]
    assert os.path.exists(exe), exe  # otherwise the nvcc error
    run = subprocess.run([exe], capture_output=True, text=True, timeout=900)
    failures = [line for line in run.stdout.splitlines() if "FAIL" in line or line.startswith("  ")]
    assert run.returncode == 0, "emulation mismatches:\n" + "\n".join(failures[:40])
    assert "all cases ok" in run.stdout


@pytest.mark.slow
def test_compress_kernels_host_emulation(emulation_executables):
    _run_host_emulation(emulation_executables, "compress_emulation.cu")


@pytest.mark.slow
def test_fp8_compress_kernels_host_emulation(emulation_executables):
    """The fp8 operand kernels' bodies on host threads (tests/cpp/fp8_compress_emulation.cu), every byte
    against an independent implementation: the MVUE one (Fp8MvueTile: tiles, shared-memory staging and
    swizzles, the nibble taken from the draw, padding) against the element-wise MVUE draw + e4m3
    quantization + CUTLASS's 8-bit compressor rule; the masked one (Fp8MaskTile, both directions) against
    quantize-where-masked + the same rule; the quantize-transpose one (Fp8QuantizeTransposeTile) against
    e4m3 of the transpose. bfloat16 / float16 / float32 inputs, shapes on and off the tile grid, scales that
    saturate or flush kept values to +-0."""
    _run_host_emulation(emulation_executables, "fp8_compress_emulation.cu")


def _layout_positions(tmp_path, call: str, rows: int, cols: int):
    """Compile a host program printing ``call`` (a C++ expression of ``r`` and ``c`` from
    compress_layout.h) for every ``r < rows``, ``c < cols``; return the values as a (rows, cols) array.
    Skips without a C++ compiler."""
    import numpy as np

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    src = tmp_path / "layout_positions.cc"
    src.write_text('#include "compress_layout.h"\n#include <cstdio>\nint main() {\n'
                   f'  for (int r = 0; r < {rows}; ++r) for (int c = 0; c < {cols}; ++c)\n'
                   f'    std::printf("%lld\\n", (long long)jax_sparse24::compress::{call});\n'
                   '}\n')
    exe = tmp_path / "layout_positions"
    build = subprocess.run([cxx, "-std=c++17", "-D__host__=", "-D__device__=", "-D__forceinline__=inline",
                            "-I", os.path.join(ROOT, "xla_ffi"), str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    return np.array(out, np.int64).reshape(rows, cols)


def test_cusparselt_layout_formula_matches_the_library_bytes(tmp_path):
    """compress_layout.h's LtMetaNibble (what the fused compressors write for layout="cusparselt")
    against bytes cusparseLtSpMMACompress wrote on the H100 (cuSPARSELt 0.8, bf16, A (128, 128)
    stored row-major, two nonzeros in every group; scripts/probe_cusparselt.py): the values and
    every metadata nibble are where the formula puts them. Runs without a GPU (host compiler only)."""
    import numpy as np

    z = np.load(os.path.join(ROOT, "tests", "data", "cusparselt_probe_bf16_m128_k128.npz"))
    dense, lib = z["dense"].astype(np.float32), z["compressed"]
    m, k = dense.shape
    pos = _layout_positions(tmp_path, f"LtMetaNibble(r, 4 * c, {k})", m, k // 4)
    assert lib.shape == (m * k + m * k // 8,)
    # values: the two nonzeros of each group, (m, k/2) row-major, bf16 bit patterns
    groups = dense.reshape(m, k // 4, 4)
    assert ((groups != 0).sum(-1) == 2).all()
    kept = groups[groups != 0].reshape(m, k // 2)
    bf16_bits = (kept.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(lib[: m * k].view(np.uint16).reshape(m, k // 2), bf16_bits)
    # metadata: nibble i | j << 2 of the group's nonzero lanes i < j, at LtMetaNibble
    lanes = np.argsort(groups == 0, axis=-1, kind="stable")[..., :2]
    want = (lanes[..., 0] | (lanes[..., 1] << 2)).astype(np.uint8)
    meta = lib[m * k:]
    got = (meta[pos >> 1] >> (4 * (pos & 1))) & 0xF
    np.testing.assert_array_equal(got, want)
    assert np.unique(pos).size == pos.size == 2 * meta.size  # every nibble of the buffer, once


def test_cusparselt_fp8_layout_formula_matches_the_library_bytes(tmp_path):
    """compress_layout.h's LtMetaByte8 (cuSPARSELt's compressed 8-bit A, not yet written by our compressors)
    against bytes cusparseLtSpMMACompress 0.8.0 wrote on the H100 for a float8_e4m3fn A (128, 256) stored
    row-major (scripts/probe_fp8.py), beside CUTLASS's compressor of the same operand: the values are CUTLASS's,
    and every metadata byte of CUTLASS's (fp8 layout of fp8_compress_kernels.cu) sits where the formula puts it.
    Runs without a GPU (host compiler only)."""
    import numpy as np

    z = np.load(os.path.join(ROOT, "tests", "data", "cusparselt_probe_fp8_m128_k256.npz"))
    lib, values, cut_meta = z["compressed"], z["cutlass_values"], z["cutlass_meta"].reshape(-1)
    m, k = values.shape[0], 2 * values.shape[1]
    pos = _layout_positions(tmp_path, f"LtMetaByte8(r, 8 * c, {k})", m, k // 8)
    assert lib.shape == (m * k // 2 + m * k // 8,)
    np.testing.assert_array_equal(lib[: m * k // 2], values.reshape(-1))
    # CUTLASS's fp8 metadata byte of (row, 8 columns): (k / 128) * M_al * 16 + row * 16 + (k % 128) / 8
    rows, cols = np.meshgrid(np.arange(m), np.arange(k // 8) * 8, indexing="ij")
    cut = cut_meta[(cols >> 7) * m * 16 + rows * 16 + ((cols & 127) >> 3)]
    meta = lib[m * k // 2:]
    np.testing.assert_array_equal(meta[pos], cut)
    assert np.unique(pos).size == pos.size == meta.size  # every byte of the metadata, once
