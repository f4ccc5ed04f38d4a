"""Plots of ``train_gpt.py``: ``loss.png`` of a run (:func:`plot_run`) and ``compare.png``
(:func:`plot_compare`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import numpy as np

from gpt_errors import PROG


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        print(f"{PROG}: matplotlib is not installed; skipping the plot "
              "(pip install 'jax_sparse24[examples]')", file=sys.stderr)
        return None


def _series(history: list[dict], key: str):
    xs, ys = [], []
    for r in history:
        if r.get(key) is not None:
            xs.append(r["step"])
            ys.append(r[key])
    return np.asarray(xs), np.asarray(ys, dtype=float)


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    if len(y) < 2 * k or k <= 1:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = (c[k:] - c[:-k]) / k
    return np.concatenate([y[: k - 1], out])


def plot_run(history: list[dict], path: Path, title: str, phase_step: Optional[int] = None,
             phase_label: str = "", flip_label: str = "mask flip rate") -> None:
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs, ys = _series(history, "loss")
    if len(xs):
        ax1.plot(xs, ys, color="tab:blue", alpha=0.25, lw=0.8)
        ax1.plot(xs, _smooth(ys, max(1, len(ys) // 50)), color="tab:blue", lw=1.5, label="train")
    vx, vy = _series(history, "val_loss")
    if len(vx):
        ax1.plot(vx, vy, "o-", color="tab:orange", ms=3, lw=1.5, label="val")
    if phase_step is not None:
        for ax in (ax1, ax2):
            ax.axvline(phase_step, color="gray", ls="--", lw=1)
        ax1.text(phase_step, ax1.get_ylim()[1], f" {phase_label}", va="top", fontsize=8, color="gray")
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy (nats per token)")
    ax1.set_title(f"{title}: loss")
    ax1.grid(alpha=0.3)
    ax1.legend()
    fx, fy = _series(history, "flip")
    if len(fx):
        ax2.plot(fx, fy, ".-" if len(fx) < 60 else "-", color="tab:green", lw=1, ms=4)
        if (fy > 0).any():
            ax2.set_yscale("log")
    else:
        ax2.text(0.5, 0.5, "no 2:4 masks (dense)", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("step")
    ax2.set_ylabel(flip_label)
    ax2.set_title(f"{title}: flip rate")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_compare(runs: dict[str, list[dict]], path: Path, title: str) -> None:
    plt = _pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, history) in enumerate(runs.items()):
        color = f"C{i}"
        xs, ys = _series(history, "loss")
        if len(xs):
            ax1.plot(xs, _smooth(ys, max(1, len(ys) // 50)), color=color, alpha=0.35, lw=1)
        vx, vy = _series(history, "val_loss")
        if len(vx):
            ax1.plot(vx, vy, "o-", color=color, ms=3, lw=1.5, label=f"{name} (val)")
        fx, fy = _series(history, "flip")
        if len(fx):
            ax2.plot(fx, fy, "-", color=color, lw=1, label=name)
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy (nats per token)")
    ax1.set_title(f"{title}: train (faint) / val loss")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("step")
    ax2.set_ylabel("mask flip rate")
    ax2.set_title("mask flip rate\n(srste: per mask refresh; others: per update, on logging steps)", fontsize=10)
    if ax2.lines:
        ax2.set_yscale("log")
        ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
