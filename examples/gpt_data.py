"""Data of ``train_gpt.py``: byte-level tokens of a text corpus (:class:`ByteData`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from gpt_errors import CLIError

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "corpus.txt"
VAL_FRACTION = 0.1


class ByteData:
    """Byte-level tokens of a text file, split 90/10 into train/val.

    The training batch of step ``t`` is a pure function of ``(seed, t)``: random windows drawn
    with ``numpy.random.default_rng([seed, t])``, so resuming at step ``t`` resumes the data
    stream exactly. Validation uses fixed, evenly spaced windows.
    """

    def __init__(self, path: Path, seq_len: int, batch_size: int, seed: int, eval_batches: int):
        path = Path(path)
        if not path.is_file():
            raise CLIError(f"--data {path}: no such file")
        raw = path.read_bytes()
        need = 10 * (seq_len + 1)
        if not raw:
            raise CLIError(f"--data {path}: the corpus is empty")
        tokens = np.frombuffer(raw, dtype=np.uint8)
        split = int(len(tokens) * (1 - VAL_FRACTION))
        self.train, self.val = tokens[:split], tokens[split:]
        if len(self.val) < seq_len + 1 or len(self.train) < seq_len + 1:
            raise CLIError(
                f"--data {path}: the corpus is too short ({len(raw)} bytes) for --seq-len {seq_len}: "
                f"the 10% validation split needs at least {seq_len + 1} bytes, i.e. a corpus of at "
                f"least {need} bytes"
            )
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.path, self.seq_len, self.batch_size, self.seed = path, seq_len, batch_size, seed
        self._train_win = np.lib.stride_tricks.sliding_window_view(self.train, seq_len + 1)
        val_win = np.lib.stride_tricks.sliding_window_view(self.val, seq_len + 1)
        n = eval_batches * batch_size
        offsets = np.linspace(0, len(val_win) - 1, n).astype(np.int64)
        self.val_batches = [
            val_win[offsets[i * batch_size:(i + 1) * batch_size]].astype(np.int32)
            for i in range(eval_batches)
        ]

    def batch(self, step: int) -> np.ndarray:
        """``(batch, seq_len + 1)`` int32 tokens of training step ``step`` (inputs + targets)."""
        rng = np.random.default_rng([self.seed, int(step)])
        idx = rng.integers(0, len(self._train_win), size=self.batch_size)
        return self._train_win[idx].astype(np.int32)
