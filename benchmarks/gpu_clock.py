"""The GPU's SM clock and power draw while a benchmark times something.

A power-capped card (the H200 at ~690 W while a GPT-2 step trains) moves its SM clock with its
temperature and with the kernels it runs (1650-1900 MHz within one 1500-step GPT-2 run of the
example), so two variants a few percent
apart may differ by their clocks as much as by their programs. :class:`ClockSampler` reads
``nvidia-smi``'s samples in a background thread, stamps each with the host's clock, and gives the
mean clock and power over the time windows a variant was timed in.

    with ClockSampler() as clk:
        t0 = time.perf_counter(); run(); clk.window("dense", t0, time.perf_counter())
    clk.summary()  # {"dense": {"sm_mhz": ..., "power_w": ..., "samples": ...}}

Without ``nvidia-smi`` (a CPU machine) it records nothing and ``summary()`` is empty.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from typing import Optional, Sequence

#: one line per sample: "<SM clock MHz>, <power W>"
NVIDIA_SMI = ("nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms")


def parse_sample(line: str) -> Optional[tuple[float, float]]:
    """``(MHz, W)`` of one line of :data:`NVIDIA_SMI`'s output, or None ("[N/A]", a header, a partial line)."""
    try:
        mhz, watts = (float(v) for v in line.split(",")[:2])
    except ValueError:
        return None
    return mhz, watts


class ClockSampler:
    """Samples ``command`` (default: ``nvidia-smi`` every ``period_ms`` on GPU 0, the one a
    single-device benchmark runs on) between ``__enter__``
    and ``__exit__``; :meth:`window` labels a time span (``time.perf_counter()`` values),
    :meth:`summary` averages the samples inside each label's spans."""

    def __init__(self, period_ms: int = 200, command: Optional[Sequence[str]] = None):
        if command is None:
            command = (*NVIDIA_SMI, str(int(period_ms))) if shutil.which("nvidia-smi") else None
        self.command = command
        self.samples: list[tuple[float, float, float]] = []  # (host time, MHz, W)
        self.windows: dict[str, list[tuple[float, float]]] = {}
        self._proc = None
        self._thread = None

    def __enter__(self) -> "ClockSampler":
        if self.command:
            try:
                self._proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                              text=True, bufsize=1)
            except OSError:
                self._proc = None
            if self._proc is not None:
                self._thread = threading.Thread(target=self._read, daemon=True)
                self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append((time.perf_counter(), *sample))

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._thread.join(timeout=5)

    def window(self, label: str, t0: float, t1: float) -> None:
        self.windows.setdefault(label, []).append((t0, t1))

    def summary(self) -> dict:
        """Per label with samples inside its windows: mean SM clock (MHz), mean power (W), sample count."""
        out = {}
        for label, spans in self.windows.items():
            inside = [(m, w) for t, m, w in self.samples if any(a <= t <= b for a, b in spans)]
            if inside:
                out[label] = {"sm_mhz": statistics.fmean(m for m, _ in inside),
                              "power_w": statistics.fmean(w for _, w in inside), "samples": len(inside)}
        return out
