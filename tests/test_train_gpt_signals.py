"""Ctrl-C anywhere in benchmarks/harness/train_gpt.py: SIGINT at start-up, during the first compilation, during
training, during a checkpoint write and during an evaluation exits 130 with one line saying what was saved
(no traceback, no segfault, no interrupt swallowed), and ``--resume`` continues the run.

One test: the interrupted runs are subprocesses of the tiny model started together; each is interrupted at
its point, found from its stderr (the kernel-plan line, a progress line, or the ``TRAIN_GPT_TEST_PAUSE``
hook's line, where the run waits for the signal)."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "harness" / "train_gpt.py"
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

# The tiny model of tests/test_train_gpt.py, not --quiet (the plan line and a progress line per update).
TINY = ["--size", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--seq-len", "32",
        "--batch-size", "8", "--eval-batches", "1", "--lr", "3e-3", "--warmup", "3"]
FLAGS = [*TINY, "--recipe", "dense", "--steps", "6", "--eval-every", "3", "--ckpt-every", "2", "--log-every", "1"]

LINE = re.compile(r"^train_gpt\.py: interrupted .*$", re.M)
NOTICE = "train_gpt.py: Ctrl-C: stopping after"


class Run:
    """``train_gpt.py FLAGS --out out`` in a subprocess; stderr read line by line on a thread."""

    def __init__(self, out: Path, *extra: str, pause: str | None = None, cache: Path | None = None,
                 flags: list = FLAGS):
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
        env.pop("XLA_FLAGS", None)  # one CPU device (conftest asks for 8)
        env.pop("TRAIN_GPT_TEST_PAUSE", None)
        if pause:
            env["TRAIN_GPT_TEST_PAUSE"] = pause
        if cache is not None:  # the resumed runs reuse the interrupted runs' programs
            env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        self.out = out
        extra = [*extra] if "--out" in extra else [*extra, "--out", str(out)]
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT), *flags, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=str(ROOT))
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            self.err.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def interrupt_at(self, pattern: str, deadline: float) -> None:
        """SIGINT once a stderr line matches ``pattern``."""
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"{self.out.name}: ended before {pattern!r}:\n{''.join(self.err)}"
            if re.search(pattern, line):
                self.proc.send_signal(signal.SIGINT)
                return

    def wait(self, timeout: float) -> tuple[int, str]:
        self.proc.wait(timeout=timeout)
        time.sleep(0.05)
        self.proc.stdout.close()
        return self.proc.returncode, "".join(self.err)


def checkpoint_steps(out: Path) -> list[int]:
    d = out / "ckpt"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def the_line(name: str, rc: int, err: str) -> str:
    """The run's one line (exit 130, no traceback, at most the "still stopping" notice beside it)."""
    assert rc == 130, f"{name}: exit {rc}\n{err[-3000:]}"
    assert "Traceback" not in err and "Fatal Python error" not in err, f"{name}:\n{err[-3000:]}"
    lines = LINE.findall(err)
    assert len(lines) == 1, f"{name}: {lines}\n{err[-3000:]}"
    others = [ln for ln in err.splitlines()[err.splitlines().index(lines[0]) + 1:] if ln.strip()]
    assert others == [], f"{name}: lines after the message: {others}"
    return lines[0]


def test_ctrl_c_anywhere_exits_130_with_one_line_and_resumes(tmp_path):
    t0 = time.monotonic()
    deadline = t0 + 240
    cache = tmp_path / "jax_cache"  # written by the "train" run, read by the runs started after it
    # point -> (run, the stderr line to interrupt at)
    runs = {
        "startup": (Run(tmp_path / "startup", pause="startup"), r"test pause at startup"),
        # while the first train step compiles (no SIGSEGV: the compilation must not go on as Python exits)
        "compile": (Run(tmp_path / "compile", pause="compile"), r"test pause at compile"),
        # the progress line at step 3: "...] 3/6 " plain, "...| 3/6 [" with tqdm (installed with tokenizers)
        "train": (Run(tmp_path / "train", cache=cache), r"[\]|] 3/6 "),
    }
    for name in ("startup", "compile", "train"):
        runs[name][0].interrupt_at(runs[name][1], deadline)
    # every program of the run is in the cache now
    runs["save"] = (Run(tmp_path / "save", pause="save", cache=cache), r"test pause at save")
    runs["eval"] = (Run(tmp_path / "eval", pause="eval", cache=cache), r"test pause at eval")
    for name in ("save", "eval"):
        runs[name][0].interrupt_at(runs[name][1], deadline)
    res = {name: run.wait(timeout=max(1, deadline - time.monotonic())) for name, (run, _) in runs.items()}
    line = {name: the_line(name, *r) for name, r in res.items()}
    # the command the line gives resumes the run whose checkpoint write was interrupted
    command = shlex.split(line["save"].split("resume with: ")[1])
    assert command[:2] == ["python", "benchmarks/harness/train_gpt.py"] and command[-1] == "--resume", command
    resumed = Run(tmp_path / "save", *command[2:], cache=cache, flags=[])

    resume = f"resume with: python benchmarks/harness/train_gpt.py {' '.join(FLAGS)} --out "
    # start-up: nothing written
    assert line["startup"] == "train_gpt.py: interrupted during start-up: nothing was saved"
    assert not (tmp_path / "startup").exists()
    # the first step's compilation: it finishes, the step runs, then the run stops
    assert "interrupted at step 1: checkpoint step 1 saved in " in line["compile"], line["compile"]
    assert checkpoint_steps(tmp_path / "compile") == [1]
    # training: a checkpoint of the step it stopped at, and the command that resumes it
    k = int(re.search(r"interrupted at step (\d+): checkpoint step \1 saved in ", line["train"]).group(1))
    assert 3 <= k < 6 and checkpoint_steps(tmp_path / "train")[-1] == k, (line["train"], k)
    assert line["train"].endswith(resume + str(tmp_path / "train") + " --resume"), line["train"]
    summary = json.loads((tmp_path / "train" / "summary.json").read_text())
    assert summary["interrupted"] and summary["steps_done"] == k
    # a checkpoint write (of step 2): it finishes, then the run stops
    assert "interrupted at step 2: checkpoint step 2 saved in " in line["save"], line["save"]
    assert checkpoint_steps(tmp_path / "save") == [2]
    # an evaluation (of step 3): it finishes, then the run stops with a checkpoint of step 3
    assert "interrupted at step 3: checkpoint step 3 saved in " in line["eval"], line["eval"]
    rows = [json.loads(r) for r in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 3]

    # which continues to the end: every step once
    rc, err = resumed.wait(timeout=max(1, t0 + 300 - time.monotonic()))
    assert rc == 0 and "Traceback" not in err and "resumed dense from" in err, err[-3000:]
    rows = [json.loads(r) for r in (tmp_path / "save" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
    s = json.loads((tmp_path / "save" / "summary.json").read_text())
    assert s["steps_done"] == 6 and not s["interrupted"] and s["final_train_loss"] is not None
    print(f"signals test: {time.monotonic() - t0:.1f}s")


def test_second_ctrl_c_quits_at_once():
    """The first Ctrl-C sets the flag (no exception anywhere) and hands the next one to the default action."""
    from gpt_errors import HarnessStopFlag

    flag = HarnessStopFlag()
    prev = signal.getsignal(signal.SIGINT)
    try:
        with flag.handling():
            assert signal.getsignal(signal.SIGINT) == flag.on_sigint and not flag.requested
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here; nothing is raised
            assert flag.requested and signal.getsignal(signal.SIGINT) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) == prev
    finally:
        signal.signal(signal.SIGINT, prev)
