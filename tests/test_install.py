"""The install: when JAX_SPARSE24_CUDA=auto builds the CUDA extension (cmake/Sparse24Cuda.cmake), the
stable header copies that let a second `pip install` reuse the compiled objects, and the build's
progress lines on the terminal (cmake/sp24_compile.py), and its object cache. CPU only: CMake runs in configure or
script mode with fake nvcc / nvidia-smi programs; nothing is compiled."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DECIDE = ROOT / "cmake" / "Sparse24Cuda.cmake"
LAUNCHER = ROOT / "cmake" / "sp24_compile.py"


def _cmake():
    exe = shutil.which("cmake")
    if exe is None:
        try:
            import cmake  # the PyPI package

            exe = os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
        except ImportError:
            pass
    if exe is None:
        pytest.skip("cmake is not installed")
    return exe


def _script(path: pathlib.Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fakes(tmp_path):
    """A bin directory for fake tools and the probe's inputs pointing at nothing real."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc13 = _script(bin_dir / "nvcc13", 'echo "Cuda compilation tools, release 13.0, V13.0.88"')
    nvcc12 = _script(bin_dir / "nvcc12", 'echo "Cuda compilation tools, release 12.4, V12.4.131"')
    return dict(bin=bin_dir, nvcc13=nvcc13, nvcc12=nvcc12, proc=str(tmp_path / "no_proc_driver"),
                libcuda="libsp24_no_such_cuda.so.1")


def _decide(f, mode, *, nvcc, extra=(), path_extra=()):
    env = {"PATH": os.pathsep.join([str(f["bin"]), *path_extra]), "CUDACXX": nvcc, "HOME": os.environ.get("HOME", "/")}
    args = [_cmake(), f"-DSP24_MODE={mode}", f"-DSP24_DRIVER_PROC={f['proc']}", f"-DSP24_LIBCUDA={f['libcuda']}",
            f"-DPython_EXECUTABLE={sys.executable}", *extra, "-P", str(DECIDE)]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    m = re.search(r"SP24_DECISION build=(\d) nvcc=(\S*) reason=(.*)", out)
    return r.returncode, (m.group(1) == "1", m.group(2), m.group(3)) if m else None, out


def test_auto_builds_only_with_cuda13_nvcc_and_a_driver(fakes, tmp_path):
    f = fakes
    # nvcc 13 but no driver: no build (the ~10 min compile would produce unusable kernels)
    rc, (build, ver, why), _ = _decide(f, "auto", nvcc=f["nvcc13"])
    assert rc == 0 and not build and ver == "13.0" and "no NVIDIA GPU driver" in why
    # a driver, found three ways
    _script(f["bin"] / "nvidia-smi", "exit 0")
    rc, (build, _, why), _ = _decide(f, "auto", nvcc=f["nvcc13"])
    assert build and "nvidia-smi" in why
    (f["bin"] / "nvidia-smi").unlink()
    _script(f["bin"] / "nvidia-smi", "exit 9")  # installed but failing (no device): not a driver
    assert not _decide(f, "auto", nvcc=f["nvcc13"])[1][0]
    proc = tmp_path / "version"
    proc.write_text("NVRM version: fake\n")
    rc, (build, _, why), _ = _decide(f, "auto", nvcc=f["nvcc13"], extra=[f"-DSP24_DRIVER_PROC={proc}"])
    assert build and str(proc) in why
    libc = "libc.so.6"  # any loadable library stands in for libcuda.so.1
    rc, (build, _, why), _ = _decide(f, "auto", nvcc=f["nvcc13"], extra=[f"-DSP24_LIBCUDA={libc}"])
    assert build and "libc.so.6 loads" in why
    # a driver but CUDA 12's nvcc, or no nvcc: no build, and the reason says which
    rc, (build, ver, why), _ = _decide(f, "auto", nvcc=f["nvcc12"], extra=[f"-DSP24_DRIVER_PROC={proc}"])
    assert not build and ver == "12.4" and "needs CUDA 13" in why
    rc, (build, ver, why), _ = _decide(f, "auto", nvcc=str(tmp_path / "missing_nvcc"),
                                       extra=[f"-DSP24_DRIVER_PROC={proc}"])
    assert not build and ver == "" and "no CUDA compiler" in why


def test_on_forces_the_build_and_off_never_builds(fakes):
    f = fakes
    for mode in ("ON", "on", "1", "TRUE"):  # CI (.ci/run) sets ON on a machine without a GPU
        rc, (build, ver, _), _ = _decide(f, mode, nvcc=f["nvcc13"])
        assert rc == 0 and build and ver == "13.0", mode
    _script(f["bin"] / "nvidia-smi", "exit 0")
    for mode in ("OFF", "off", "0"):
        assert not _decide(f, mode, nvcc=f["nvcc13"])[1][0]
    rc, decision, out = _decide(f, "maybe", nvcc=f["nvcc13"])
    assert rc != 0 and decision is None and "JAX_SPARSE24_CUDA must be auto, ON or OFF, got 'maybe'" in out


def _configure(tmp_path, build_dir, defs, env_extra=None, path=None):
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    env = dict(os.environ)
    env.pop("CMAKE_GENERATOR", None)
    if path is not None:
        env["PATH"] = path
    env.update(env_extra or {})
    r = subprocess.run([_cmake(), "-S", str(ROOT), "-B", str(build_dir), *gen, f"-DPython_EXECUTABLE={sys.executable}",
                        *(f"-D{k}={v}" for k, v in defs.items())], env=env, capture_output=True, text=True,
                       timeout=600)
    return r.returncode, r.stdout + r.stderr


def test_configure_skips_the_extension_and_rejects_bad_settings(fakes, tmp_path):
    """The whole CMakeLists in configure mode: auto with CUDA 12's nvcc skips the extension (the
    package is pure Python then); bad values of the two settings are errors naming them."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler for CMake's project()")
    f = fakes
    rc, out = _configure(tmp_path, tmp_path / "b1", {"JAX_SPARSE24_CUDA": "auto"}, {"CUDACXX": f["nvcc12"]})
    assert rc == 0, out
    assert "not building the CUDA extension" in out and "needs CUDA 13" in out
    assert "_sparse24_ffi" not in "".join(p.read_text() for p in (tmp_path / "b1").glob("*.ninja")) + "".join(
        p.read_text() for p in (tmp_path / "b1").glob("Makefile"))
    rc, out = _configure(tmp_path, tmp_path / "b2", {"JAX_SPARSE24_CUDA": "maybe"})
    assert rc != 0 and "JAX_SPARSE24_CUDA must be auto, ON or OFF" in out
    rc, out = _configure(tmp_path, tmp_path / "b3", {"JAX_SPARSE24_CUDA": "OFF", "JAX_SPARSE24_CUTLASS_CONFIGS": "few"})
    assert rc != 0 and "JAX_SPARSE24_CUTLASS_CONFIGS must be all or minimal" in out


def _fake_site(root: pathlib.Path, real_pkg, name: str):
    """A package directory `name` under `root` whose files are fresh copies (new timestamps) of the
    real package's, except big subdirectories, which are linked."""
    dst = root / name
    src = pathlib.Path(real_pkg.__file__).parent
    dst.mkdir(parents=True)
    (dst / "__init__.py").write_text("")
    return src, dst


def test_reinstall_reuses_objects_configure_twice_from_fresh_environments(tmp_path):
    """pip builds every install in a new isolated environment (a new temporary path, files with new
    timestamps). Configured from two such copies of jaxlib's headers, the compile commands must be
    identical and the staged headers untouched, so ninja recompiles nothing on the second install."""
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("needs nvcc (configure with JAX_SPARSE24_CUDA=ON)")
    if shutil.which("ninja") is None:
        pytest.skip("needs ninja")
    try:
        import cutlass_library
        import jaxlib
        import nanobind  # noqa: F401
    except ImportError as e:
        pytest.skip(f"needs the build requirements importable: {e}")
    build = tmp_path / "build"
    snapshots = []
    for env_name in ("env_a", "env_b"):
        site = tmp_path / env_name
        _, jl = _fake_site(site, jaxlib, "jaxlib")
        shutil.copytree(pathlib.Path(jaxlib.__file__).parent / "include", jl / "include")  # fresh mtimes
        _, cl = _fake_site(site, cutlass_library, "cutlass_library")
        os.symlink(pathlib.Path(cutlass_library.__file__).parent / "source", cl / "source")
        pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
        rc, out = _configure(tmp_path, build, {"JAX_SPARSE24_CUDA": "ON", "JAX_SPARSE24_CUTLASS_CONFIGS": "minimal"},
                             {"PYTHONPATH": pythonpath, "JAX_SPARSE24_BUILD_PROGRESS": "0"})
        assert rc == 0, out
        ninja = (build / "build.ninja").read_text()
        assert str(site) not in ninja  # no include path into the (temporary) environment
        staged = build / "sp24_deps" / "xla_ffi_include" / "xla" / "ffi" / "api" / "ffi.h"
        snapshots.append((re.findall(r"^\s*(?:FLAGS|INCLUDES|DEFINES|LAUNCHER) = .*$", ninja, re.M),
                          staged.stat().st_mtime_ns))
        shutil.rmtree(site)
    (cmds_a, mtime_a), (cmds_b, mtime_b) = snapshots
    assert cmds_a and cmds_a == cmds_b
    assert mtime_a == mtime_b


_PTY_HELPER = """
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
chunks = []
while True:
    try:
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data:
        break
    chunks.append(data)
_, status = os.waitpid(pid, 0)
sys.stdout.write(b"".join(chunks).decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run_in_pty(argv, env):
    """Run argv with a new pseudo-terminal as its controlling terminal: (exit code, terminal output).
    The fork happens in a fresh single-threaded interpreter (not in this multithreaded JAX process)."""
    r = subprocess.run([sys.executable, "-c", _PTY_HELPER, *argv], env=env, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout


def test_progress_lines_reach_the_terminal(tmp_path):
    """pip hides a build's output without -v: the compiler launcher writes per-file lines to the
    terminal, counts finished files, and passes the compiler's exit code through."""
    if not sys.platform.startswith("linux"):
        pytest.skip("pty test: Linux")
    state = tmp_path / "state"
    ok = _script(tmp_path / "cc_ok", "exit 0")
    bad = _script(tmp_path / "cc_bad", "exit 3")
    env = {"PATH": os.environ.get("PATH", "")}
    launch = [sys.executable, str(LAUNCHER), str(state), "6"]
    rc, out = _run_in_pty(launch + [ok, "-x", "cu", "-c", "/src/xla_ffi/spmm_cfg_a.cu", "-o", "a.o"], env)
    assert rc == 0 and "nvcc spmm_cfg_a.cu" in out and "[1/6] spmm_cfg_a.cu done" in out
    rc, out = _run_in_pty(launch + [bad, "-c", "/src/b.cu"], env)
    assert rc == 3 and "[2/6] b.cu FAILED (exit 3)" in out
    rc, out = _run_in_pty(launch + [ok, "-c", "/src/c.cu"], dict(env, JAX_SPARSE24_BUILD_PROGRESS="0"))
    assert rc == 0 and "c.cu" not in out
    rc, out = _run_in_pty([sys.executable, str(LAUNCHER), "--note", "about", "3", "min"], env)
    assert rc == 0 and "about 3 min" in out
    subprocess.run([sys.executable, str(LAUNCHER), "--reset", str(state)], check=True)
    assert not (state / "done").exists()
    # no controlling terminal (CI): silent, still runs the compiler
    r = subprocess.run(launch + [bad, "-c", "/src/d.cu"], capture_output=True, text=True, start_new_session=True)
    assert r.returncode == 3 and "d.cu" not in r.stdout + r.stderr
    r = subprocess.run([sys.executable, str(LAUNCHER), str(state)], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


FAKE_CC = '''import sys, pathlib
args = sys.argv[1:]
arg = lambda flag: args[args.index(flag) + 1]
src, out, dep = pathlib.Path(arg("-c")), pathlib.Path(arg("-o")), pathlib.Path(arg("-MF"))
hdr = src.with_name("kernel.h")
calls = src.with_name("calls")
calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text("object of " + src.read_text() + hdr.read_text() + " ".join(a for a in args if a.startswith("-D")))
dep.write_text(f"{out}: {src} \\\\\\n  {hdr}\\n")
sys.exit(int(src.read_text().strip() == "broken"))
'''


def test_object_cache_reuses_objects_only_when_every_input_is_unchanged(tmp_path):
    """What makes a second `pip install` fast: scikit-build-core wipes CMakeFiles/ (the objects) for
    every new isolated build environment; the launcher restores an object from its cache when the
    compile command, the compiler and the content of every file in the depfile are unchanged."""
    cc = tmp_path / "fakecc"
    cc.write_text(f"#!{sys.executable}\n" + FAKE_CC)
    cc.chmod(0o755)
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src, hdr, calls = src_dir / "k.cu", src_dir / "kernel.h", src_dir / "calls"
    src.write_text("kernel v1")
    hdr.write_text(" header v1")
    build = tmp_path / "build"
    (build / "CMakeFiles").mkdir(parents=True)
    obj, dep = build / "CMakeFiles" / "k.cu.o", build / "CMakeFiles" / "k.cu.o.d"
    state = build / "sp24_cache"

    def compile_(*defines, env_extra=None):
        cmd = [sys.executable, str(LAUNCHER), str(state), "1", str(cc), *defines, "-MD", "-MT", "CMakeFiles/k.cu.o",
               "-MF", "CMakeFiles/k.cu.o.d", "-x", "cu", "-c", str(src), "-o", "CMakeFiles/k.cu.o"]
        env = dict(os.environ, **(env_extra or {}))
        return subprocess.run(cmd, cwd=build, env=env, capture_output=True, text=True).returncode

    def n_calls():
        return len(calls.read_text()) if calls.exists() else 0

    assert compile_() == 0 and n_calls() == 1
    first = obj.read_text()
    shutil.rmtree(build / "CMakeFiles")  # a re-install in a new isolated environment
    assert compile_() == 0 and n_calls() == 1  # restored, not compiled
    assert obj.read_text() == first and str(hdr) in dep.read_text()
    hdr.write_text(" header v2")  # a header changed: compiled again
    assert compile_() == 0 and n_calls() == 2 and obj.read_text() == "object of kernel v1 header v2"
    assert compile_() == 0 and n_calls() == 2
    assert compile_("-DX=1") == 0 and n_calls() == 3 and obj.read_text().endswith("-DX=1")  # another command
    assert compile_(env_extra={"JAX_SPARSE24_OBJECT_CACHE": "0"}) == 0 and n_calls() == 4
    src.write_text("broken")  # a failing compile passes its exit code through and stores nothing
    assert compile_() == 1 and n_calls() == 5
    assert compile_() == 1 and n_calls() == 6
    src.write_text("kernel v1")  # the inputs of the last successful compile of this command: reused
    obj.unlink()
    assert compile_() == 0 and n_calls() == 6 and obj.read_text() == "object of kernel v1 header v2"
    hdr.write_text(" header v1")  # one entry per command (the newest): older inputs compile again
    assert compile_() == 0 and n_calls() == 7 and obj.read_text() == first


def test_depfile_parsing():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sp24_compile", LAUNCHER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = "CMakeFiles/a.o: /src/a.cu /inc/x.h \\\n  /inc/my\\ dir/y.h\\\n /inc/z.h\n"
    assert mod.depfile_paths(text) == ["/src/a.cu", "/inc/x.h", "/inc/my dir/y.h", "/inc/z.h"]
    assert mod.depfile_paths("garbage") == []
