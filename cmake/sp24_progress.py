"""Progress of the CUDA build on the terminal.

pip shows a build's output only with ``pip install -v``; without it a ~10 minute nvcc build looks
like a hang. CMake runs every CUDA compile through this launcher (``CUDA_COMPILER_LAUNCHER``), which
runs the compiler unchanged and writes one line per file when it starts and when it ends to the
controlling terminal (``/dev/tty``; nothing when there is none, e.g. in CI, whose log has ninja's own
lines). ``JAX_SPARSE24_BUILD_PROGRESS=0`` silences it.

  python sp24_progress.py <state dir> <number of CUDA files> <compiler command ...>
  python sp24_progress.py --note <text>      (one line on the terminal; used at configure time)
  python sp24_progress.py --reset <state dir>
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ENV = "JAX_SPARSE24_BUILD_PROGRESS"


def tell(line: str) -> None:
    if os.environ.get(ENV, "1") == "0":
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(line + "\n")
    except OSError:  # no controlling terminal
        pass


def source_of(cmd: list[str]) -> str:
    for flag, arg in zip(cmd, cmd[1:]):
        if flag == "-c":
            return os.path.basename(arg)
    return os.path.basename(cmd[-1]) if cmd else "?"


def compile_one(state: str, total: str, cmd: list[str]) -> int:
    name = source_of(cmd)
    t0 = time.monotonic()
    tell(f"jax_sparse24: nvcc {name} ...")
    rc = subprocess.call(cmd)
    done = 0
    try:
        os.makedirs(state, exist_ok=True)
        with open(os.path.join(state, "done"), "a") as f:  # one short line per file: atomic appends
            f.write(name + "\n")
        with open(os.path.join(state, "done")) as f:
            done = sum(1 for _ in f)
    except OSError:
        pass
    status = "done" if rc == 0 else f"FAILED (exit {rc})"
    tell(f"jax_sparse24: [{done}/{total}] {name} {status} in {time.monotonic() - t0:.0f} s")
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
    if len(argv) < 3:
        print("usage: sp24_progress.py <state dir> <number of CUDA files> <compiler command ...>", file=sys.stderr)
        return 2
    return compile_one(argv[0], argv[1], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
