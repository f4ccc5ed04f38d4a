"""Logging of ``train_gpt.py``: the progress line, ``metrics.jsonl`` and the ``--compare`` table."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


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


def _fmt(v, spec=".3f"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def _read_jsonl(path: Path) -> list[dict]:
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


def _nan_to_none(x):
    x = float(x)
    return None if math.isnan(x) else x


def _write_compare(out: Path, summaries: list[dict], compare_speed: bool = True) -> None:
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
        lines.append(f"| {s['recipe']} | {_fmt(vl, '.4f')} | {rel_l} | {_fmt(tps, '.0f')} | {rel_t} | "
                     f"{_fmt(s['final_train_loss'], '.4f')} |")
    if not compare_speed:
        lines += ["", "no GPU kernels: speed not compared (every 2:4 layer ran the dense reference, so tokens/s "
                      "differences between recipes are noise)"]
    lines.append("")
    (out / "compare.md").write_text("\n".join(lines))
    (out / "compare.json").write_text(json.dumps([{k: v for k, v in s.items() if k != "history"}
                                                  for s in summaries], indent=2) + "\n")
    print("\n".join(lines))
