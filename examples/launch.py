#!/usr/bin/env python
"""Start one process per GPU (or per CPU device) on this host for a JAX multi-process run.

    python examples/launch.py --nproc 4 -- examples/train.py --distributed --mesh fsdp=4 ...

Process ``i`` of ``N`` gets ``JAX_COORDINATOR_ADDRESS`` (``127.0.0.1:<free port>`` unless
``--coordinator``), ``JAX_NUM_PROCESSES=N``, ``JAX_PROCESS_ID=i`` (what ``train.py --distributed``
reads, the same variables as on a cluster) and, on GPUs, ``CUDA_VISIBLE_DEVICES``
= its own GPU (``--gpus 0,1,2,3`` picks them; default ``0..N-1``). With ``--cpu`` each process
gets one CPU device instead (``JAX_PLATFORMS=cpu``, gloo collectives): how CI tests the multi-process
path.

Process 0 prints to this terminal (through the launcher); the others write ``<log-dir>/proc<i>.log``
(default: a temporary directory, named when it starts) and their last lines are printed if they fail.
When a process exits with an error or is killed, the launcher names it, its pid and its exit code or
signal, terminates the others (SIGTERM to each process, then SIGKILL to its process group after
``--grace`` seconds) and exits with that process's code (128 + the signal), so a crashed rank never leaves
the rest waiting in a collective. What the others print after that -- the errors of a collective or a
compilation cut short, not the cause -- goes to their logs only (process 0's to ``proc0.log``).
Ctrl-C is forwarded to every process (SIGINT: ``train.py`` checkpoints and exits); a second Ctrl-C kills
them.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROG = "launch.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(i: int, n: int, coordinator: str, gpus: list[str] | None, cpu: bool, base=None) -> dict:
    """The environment of process ``i`` of ``n``."""
    env = dict(os.environ if base is None else base)
    env.update(JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=str(n), JAX_PROCESS_ID=str(i))
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
    else:
        env["CUDA_VISIBLE_DEVICES"] = gpus[i] if gpus else str(i)
    return env


def describe_exit(code: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL (signal 9)`` for a ``Popen.returncode``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "an unknown signal"
    return f"was killed by {name} (signal {-code})"


class Forward:
    """Copies a pipe of process 0 to the launcher's stream until ``another_failed()`` (checked before each
    write: the other process died before process 0 could notice), then only to ``log``."""

    def __init__(self, pipe, stream, log: Path, another_failed):
        self.pipe, self.stream, self.log, self.another_failed = pipe, stream, log, another_failed
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        with open(self.log, "ab") as log:
            for chunk in iter(lambda: os.read(self.pipe.fileno(), 65536), b""):
                if not self.another_failed():
                    self.stream.write(chunk)
                    self.stream.flush()
                else:
                    log.write(chunk)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, required=True, help="number of processes (one per GPU)")
    ap.add_argument("--gpus", default=None, help="comma-separated GPU ids, one per process (default: 0..N-1)")
    ap.add_argument("--cpu", action="store_true", help="one CPU device per process (no GPUs; gloo collectives)")
    ap.add_argument("--coordinator", default=None, help="host:port of process 0 (default: 127.0.0.1:<free port>)")
    ap.add_argument("--log-dir", type=Path, default=None, help="where processes 1..N-1 write proc<i>.log")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL of the others")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- script.py ARGS (run with this Python)")
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("give the command after --, e.g. -- examples/train.py --distributed --mesh fsdp=4")
    if a.nproc < 1:
        ap.error("--nproc must be >= 1")
    gpus = None
    if a.gpus is not None:
        gpus = [g.strip() for g in a.gpus.split(",") if g.strip()]
        if len(gpus) != a.nproc:
            ap.error(f"--gpus lists {len(gpus)} GPUs for --nproc {a.nproc}")
    coordinator = a.coordinator or f"127.0.0.1:{free_port()}"
    log_dir = a.log_dir or Path(tempfile.mkdtemp(prefix="launch_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if cmd[0].endswith(".py"):
        cmd = [sys.executable] + cmd

    procs: list[subprocess.Popen] = []
    logs: list[Path] = [log_dir / f"proc{i}.log" for i in range(a.nproc)]
    interrupts = 0
    forwards = []

    def another_failed() -> bool:
        """Whether a process other than 0 failed (not after a Ctrl-C, where every process stops on its own)."""
        return interrupts == 0 and any(p.poll() not in (None, 0) for p in procs[1:])

    for i in range(a.nproc):
        env = process_env(i, a.nproc, coordinator, gpus, a.cpu)
        env.setdefault("PYTHONUNBUFFERED", "1")  # process 0's lines through the pipe as they are printed
        if i == 0:
            out = err = subprocess.PIPE
        else:
            out, err = open(logs[i], "w"), subprocess.STDOUT
        # own process group: a Ctrl-C in the terminal reaches the launcher only, which forwards it once
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=err, start_new_session=True))
        if i == 0:
            forwards = [Forward(procs[0].stdout, sys.stdout.buffer, logs[0], another_failed),
                        Forward(procs[0].stderr, sys.stderr.buffer, logs[0], another_failed)]
    if a.nproc > 1:
        print(f"{PROG}: {a.nproc} processes, coordinator {coordinator}; logs of processes 1..{a.nproc - 1} in "
              f"{log_dir}", file=sys.stderr)

    def signal_running(sig) -> None:
        """``sig`` to the process group of every process still running."""
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def on_sigint(signum, frame):
        nonlocal interrupts
        interrupts += 1
        signal_running(signal.SIGINT if interrupts == 1 else signal.SIGKILL)

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigint)

    def stop_others(grace: float) -> None:
        for p in procs:  # the process itself: its compiler's processes are not killed under a compilation
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        signal_running(signal.SIGKILL)
        for p in procs:
            p.wait()

    failed = None
    while True:
        codes = [p.poll() for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad and failed is None:
            failed = min(bad, key=lambda b: (b[1] > 0, b[0]))  # one killed by a signal, else the first
            if interrupts == 0:  # after Ctrl-C every process is saving and stopping by itself: let them
                i, c = failed
                print(f"{PROG}: process {i} (pid {procs[i].pid}) {describe_exit(c)}; stopping the other processes "
                      f"(their output from now on: {log_dir})", file=sys.stderr)
                stop_others(a.grace)
        if all(c is not None for c in [p.poll() for p in procs]):
            break
        time.sleep(0.1)
    for f in forwards:
        f.thread.join()
    if failed is not None:
        i, c = failed
        if i != 0 and interrupts == 0:
            print(f"{PROG}: last lines of process {i} ({logs[i]}):\n{_tail(logs[i])}", file=sys.stderr)
        return c if c > 0 else 128 - c  # killed by signal s: 128 + s, as a shell reports it
    return 0


if __name__ == "__main__":
    sys.exit(main())
