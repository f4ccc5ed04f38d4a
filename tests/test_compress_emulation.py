"""CPU check of the fused 2:4 compressors' kernel code (xla_ffi/compress_kernels.cu) without a GPU.

Compiles tests/cpp/compress_emulation.cu with nvcc (host code only runs) and runs it: the kernels'
real per-thread code is emulated with 256 host threads per CTA and compared byte for byte with an
independent implementation of CUTLASS's compressor (see the .cu file). Skipped without nvcc or the
XLA FFI headers. About 15 s to compile on 2 cores.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_compress_kernels_host_emulation(tmp_path):
    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    inc = _jaxlib_include()
    if nvcc is None or inc is None:
        pytest.skip("needs nvcc and the XLA FFI headers (jaxlib/include)")
    exe = tmp_path / "compress_emulation"
    cmd = [nvcc, "-std=c++20", "-O1", "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "xla_ffi"), "-I", inc,
           os.path.join(ROOT, "tests", "cpp", "compress_emulation.cu"), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, f"nvcc failed:\n{build.stderr[-4000:]}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    failures = [line for line in run.stdout.splitlines() if "FAIL" in line or line.startswith("  ")]
    assert run.returncode == 0, "emulation mismatches:\n" + "\n".join(failures[:40])
    assert "all cases ok" in run.stdout
