"""Compiler launcher of the extension's build: an object cache that survives re-installs, and
progress lines on the terminal.

Object cache. pip builds every install in a fresh isolated environment, and scikit-build-core then
clears the build directory's CMakeCache.txt and CMakeFiles/ (where CMake keeps the objects), so
without this every `pip install` of the same checkout would recompile the whole extension (~10 min
on 2 cores). CMake runs every compile through this script, which keeps each object with its depfile
in ``<state dir>/objects/`` (outside CMakeFiles/) under a hash of the compile command (stable: the
headers are staged into the build directory, see CMakeLists.txt) and of the compiler binary, with the
content hash of every file the depfile lists (the source and all headers). When all of them are
unchanged the object is copied back instead of compiled. ``JAX_SPARSE24_OBJECT_CACHE=0`` disables it.

Progress. pip shows a build's output only with ``pip install -v``; without it a long nvcc build
looks like a hang. For the CUDA files (``total`` > 0) one line per file goes to the controlling
terminal (``/dev/tty``; nothing when there is none, e.g. in CI, whose log has ninja's own lines).
``JAX_SPARSE24_BUILD_PROGRESS=0`` silences it.

  python sp24_compile.py <state dir> <number of CUDA files, 0: no progress lines> <compiler command ...>
  python sp24_compile.py --note <text>      (one line on the terminal; used at configure time)
  python sp24_compile.py --reset <state dir> (restart the progress count; the cache stays)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

PROGRESS_ENV = "JAX_SPARSE24_BUILD_PROGRESS"
CACHE_ENV = "JAX_SPARSE24_OBJECT_CACHE"


def tell(line: str) -> None:
    if os.environ.get(PROGRESS_ENV, "1") == "0":
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(line + "\n")
    except OSError:  # no controlling terminal
        pass


def _arg_after(cmd: list[str], flag: str) -> str | None:
    for a, b in zip(cmd, cmd[1:]):
        if a == flag:
            return b
    return None


def depfile_paths(text: str) -> list[str]:
    """The prerequisites of a Make-syntax depfile (``out: src hdr1 \\\\n hdr2 ...``)."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    _, sep, rest = text.partition(": ")
    if not sep:
        return []
    out, cur, i = [], "", 0
    while i < len(rest):
        c = rest[i]
        if c == "\\" and i + 1 < len(rest) and rest[i + 1] == " ":
            cur += " "
            i += 2
            continue
        if c.isspace():
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        out.append(cur)
    return out


def _digest(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _key(cmd: list[str]) -> str:
    exe = shutil.which(cmd[0]) or cmd[0]
    try:
        st = os.stat(exe)
        ident = [os.path.realpath(exe), st.st_size, st.st_mtime_ns]
    except OSError:
        ident = [exe]
    return hashlib.sha256(json.dumps([cmd, ident, os.getcwd()]).encode()).hexdigest()


def _replace(src: str, dst: str) -> None:
    tmp = f"{dst}.sp24tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def reuse(entry: str, out: str, dep: str) -> bool:
    """Copy the cached object and depfile to ``out`` / ``dep`` if every input is unchanged."""
    try:
        with open(os.path.join(entry, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    if not manifest.get("inputs") or any(_digest(p) != d for p, d in manifest["inputs"].items()):
        return False
    try:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        _replace(os.path.join(entry, "object"), out)
        _replace(os.path.join(entry, "depfile"), dep)
    except OSError:
        return False
    return True


def store(entry: str, out: str, dep: str) -> None:
    try:
        with open(dep) as f:
            inputs = depfile_paths(f.read())
        digests = {p: _digest(p) for p in inputs}
        if not inputs or None in digests.values():
            return
        tmp = f"{entry}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        shutil.copyfile(out, os.path.join(tmp, "object"))
        shutil.copyfile(dep, os.path.join(tmp, "depfile"))
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump({"inputs": digests}, f)
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except OSError:
        pass  # a cache that cannot be written only costs a compile next time


def _count(state: str, name: str) -> int:
    try:
        os.makedirs(state, exist_ok=True)
        with open(os.path.join(state, "done"), "a") as f:  # one short line per file: atomic appends
            f.write(name + "\n")
        with open(os.path.join(state, "done")) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def compile_one(state: str, total: int, cmd: list[str]) -> int:
    src = _arg_after(cmd, "-c")
    name = os.path.basename(src) if src else (os.path.basename(cmd[-1]) if cmd else "?")
    out, dep = _arg_after(cmd, "-o"), _arg_after(cmd, "-MF")
    entry = None
    if out and dep and src and os.environ.get(CACHE_ENV, "1") != "0":
        key = _key(cmd)
        entry = os.path.join(state, "objects", key[:2], key)
        if reuse(entry, out, dep):
            if total:
                tell(f"jax_sparse24: [{_count(state, name)}/{total}] {name} unchanged, reused from the build directory")
            return 0
    t0 = time.monotonic()
    if total:
        tell(f"jax_sparse24: nvcc {name} ...")
    rc = subprocess.call(cmd)
    if rc == 0 and entry is not None:
        store(entry, out, dep)
    if total:
        status = "done" if rc == 0 else f"FAILED (exit {rc})"
        tell(f"jax_sparse24: [{_count(state, name)}/{total}] {name} {status} in {time.monotonic() - t0:.0f} s")
    return rc


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--note":
        tell(" ".join(argv[1:]))
        return 0
    if len(argv) == 2 and argv[0] == "--reset":
        try:
            os.remove(os.path.join(argv[1], "done"))
        except FileNotFoundError:
            pass
        return 0
    if len(argv) < 3 or not argv[1].isdigit():
        print("usage: sp24_compile.py <state dir> <number of CUDA files> <compiler command ...>", file=sys.stderr)
        return 2
    return compile_one(argv[0], int(argv[1]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
