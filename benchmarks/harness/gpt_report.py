"""Logging of ``train_gpt.py``: the run's history and tokens/s (:class:`TrainLog`), the progress line,
``metrics.jsonl`` and the ``--compare`` table."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import jax


class Progress:
    """tqdm when installed, else one carriage-return line (a plain line per update off a tty)."""

    def __init__(self, total: int, initial: int, desc: str, quiet: bool = False):
        self.total, self.quiet, self.desc = total, quiet, desc
        self._bar = None
        self._tty = sys.stderr.isatty()
        if quiet:
            return
        try:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
        except ImportError:
            pass
        self.n = initial

    def update(self, n: int, **fields) -> None:
        if self.quiet:
            return
        self.n = n
        text = "  ".join(f"{k} {v}" for k, v in fields.items())
        if self._bar is not None:
            self._bar.update(n - self._bar.n)
            self._bar.set_postfix_str(text, refresh=True)
            return
        width = 24
        done = int(width * n / max(self.total, 1))
        line = f"{self.desc} [{'#' * done}{'.' * (width - done)}] {n}/{self.total}  {text}"
        if self._tty:
            sys.stderr.write("\r" + line + "\033[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


class TrainLog:
    """The history of a run (the rows of ``metrics.jsonl``) and its training time and tokens.

    The train step's metrics stay on the device until :meth:`flush` fetches all of them at once (one
    sync per logged step, not per step). Only timed intervals count towards tokens/s: an interval
    starts at a flush, an eval or a checkpoint (:meth:`restart_timer`), and :meth:`untimed` leaves the
    next step (one that compiles a program) out.
    """

    def __init__(self, history: list[dict], train_time: float, train_tokens: int):
        self.history, self.train_time, self.train_tokens = history, train_time, train_tokens
        #: what the progress line shows: latest train loss, val loss, mask flip rate, tokens/s
        self.last = {"loss": None, "val": history[-1].get("val_loss") if history else None, "flip": None,
                     "tok_s": None}
        for r in reversed(history):
            if r.get("flip") is not None:
                self.last["flip"] = r["flip"]
                break
        #: the first history row whose loss or gradient norm is not finite (None: none so far); the
        #: rows of the steps after it are dropped (they only carry the NaN on)
        self.bad = None
        self._pending: list[tuple[int, dict]] = []
        self._t_mark = None  # start of the timed interval (None: the next step includes compilation)
        self._tokens = 0

    def step(self, step: int, metrics: dict, tokens: int) -> None:
        """Record the (device) metrics of the update that made ``step``, over ``tokens`` tokens."""
        self._pending.append((step, metrics))
        if self._t_mark is not None:
            self._tokens += tokens

    def untimed(self) -> None:
        """The next step compiles: flush, and keep that step out of tokens/s."""
        self.flush()
        self._t_mark = None

    def restart_timer(self) -> None:
        self._t_mark = time.perf_counter()

    def val(self, step: int, loss: float) -> None:
        self.last["val"] = loss
        self.history.append({"step": step, "val_loss": loss})

    def flush(self) -> None:
        """Fetch the pending metrics into the history; ends the timed interval. Every step's loss and
        gradient norm is checked here: the first non-finite one is :attr:`bad`."""
        if not self._pending:
            return
        got = jax.device_get([m for _, m in self._pending])
        now = time.perf_counter()
        if self._t_mark is not None and self._tokens:
            dt = now - self._t_mark
            self.train_time += dt
            self.train_tokens += self._tokens
            self.last["tok_s"] = self._tokens / dt
        for (s, _), m in zip(self._pending, got):
            row = {"step": s, "loss": float(m["loss"]), "flip": nan_to_none(m["flip"]),
                   "grad_norm": float(m["grad_norm"]), "sparse": bool(m["sparse"])}
            if "step_z" in m:
                row["step_z"] = float(m["step_z"])
            if "kd" in m:
                row["kd"] = float(m["kd"])
            if self.bad is not None:
                break
            self.history.append(row)
            if not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
                self.bad = row
                break
            self.last["loss"] = row["loss"]
            if row["flip"] is not None:
                self.last["flip"] = row["flip"]
        self._pending.clear()
        self._tokens = 0
        self._t_mark = time.perf_counter()

    def fields(self) -> dict:
        """The progress line's fields."""
        last = self.last
        return {"loss": fmt(last["loss"]), "val": fmt(last["val"]), "tok/s": fmt(last["tok_s"], ".0f"),
                "flip": fmt(last["flip"], ".2e")}


def fmt(v, spec=".3f"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def nan_to_none(x):
    x = float(x)
    return None if math.isnan(x) else x


def write_compare(out: Path, summaries: list[dict], compare_speed: bool = True) -> None:
    """``compare.md`` / ``compare.json``. ``compare_speed=False`` (no GPU kernels: every 2:4 layer
    ran the dense reference) leaves out the tokens/s ratios, which would only measure noise."""
    dense = next((s for s in summaries if s["recipe"] == "dense"), None)
    lines = [
        f"# {summaries[0]['size']}: {', '.join(s['recipe'] for s in summaries)} "
        f"({summaries[0]['steps_done']} steps, {summaries[0]['backend']}: {summaries[0]['device']})",
        "",
        "| recipe | final val loss | vs dense | tokens/s | vs dense | final train loss |",
        "|---|---|---|---|---|---|",
    ]
    for s in summaries:
        vl, tps = s["final_val_loss"], s["tokens_per_s"]
        rel_l = rel_t = "-"
        if dense and vl is not None and dense["final_val_loss"]:
            rel_l = f"{100 * (vl / dense['final_val_loss'] - 1):+.1f}%"
        if compare_speed and dense and tps and dense["tokens_per_s"]:
            rel_t = f"{tps / dense['tokens_per_s']:.2f}x"
        lines.append(f"| {s['recipe']} | {fmt(vl, '.4f')} | {rel_l} | {fmt(tps, '.0f')} | {rel_t} | "
                     f"{fmt(s['final_train_loss'], '.4f')} |")
    if not compare_speed:
        lines += ["", "no GPU kernels: speed not compared (every 2:4 layer ran the dense reference, so tokens/s "
                      "differences between recipes are noise)"]
    lines.append("")
    (out / "compare.md").write_text("\n".join(lines))
    (out / "compare.json").write_text(json.dumps([{k: v for k, v in s.items() if k != "history"}
                                                  for s in summaries], indent=2) + "\n")
    print("\n".join(lines))
