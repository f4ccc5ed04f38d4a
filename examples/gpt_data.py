"""Data of ``train_gpt.py``: byte-level tokens of a text corpus (:class:`ByteData`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import numpy as np

from gpt_errors import CLIError

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "corpus.txt"
VAL_FRACTION = 0.1


def _read(path: Path, flag: str) -> bytes:
    if path.is_dir():
        raise CLIError(f"{flag} {path} is a directory: give one text file, whose bytes are the tokens (e.g. "
                       f"{DEFAULT_DATA}; to train on several files, concatenate them into one)")
    if not path.is_file():
        raise CLIError(f"{flag} {path}: no such file")
    raw = path.read_bytes()
    if not raw:
        raise CLIError(f"{flag} {path}: the corpus is empty")
    return raw


class ByteData:
    """Byte-level tokens of a text file, split 90/10 into train/val — or, with ``val_path``, all of
    ``path`` for training and all of ``val_path`` for validation (``--val-data``).

    The training batch of step ``t`` is a pure function of ``(seed, t)``: random windows drawn
    with ``numpy.random.default_rng([seed, t])``, so resuming at step ``t`` resumes the data
    stream exactly. Validation uses fixed, evenly spaced windows.

    ``sha256`` fingerprints the data of a run (checked on ``--resume``): the file's hash without
    ``val_path`` (as before), else the hash of both files' hashes.
    """

    def __init__(self, path: Path, seq_len: int, batch_size: int, seed: int, eval_batches: int,
                 val_path: Optional[Path] = None):
        path = Path(path)
        raw = _read(path, "--data")
        need = 10 * (seq_len + 1)
        tokens = np.frombuffer(raw, dtype=np.uint8)
        if val_path is None:
            split = int(len(tokens) * (1 - VAL_FRACTION))
            self.train, self.val = tokens[:split], tokens[split:]
            if len(self.val) < seq_len + 1 or len(self.train) < seq_len + 1:
                raise CLIError(
                    f"--data {path}: the corpus is too short ({len(raw)} bytes) for --seq-len {seq_len}: "
                    f"the 10% validation split needs at least {seq_len + 1} bytes, i.e. a corpus of at "
                    f"least {need} bytes"
                )
            self.sha256 = hashlib.sha256(raw).hexdigest()
        else:
            val_path = Path(val_path)
            val_raw = _read(val_path, "--val-data")
            self.train, self.val = tokens, np.frombuffer(val_raw, dtype=np.uint8)
            for flag, p, arr in (("--data", path, self.train), ("--val-data", val_path, self.val)):
                if len(arr) < seq_len + 1:
                    raise CLIError(f"{flag} {p}: the corpus is too short ({len(arr)} bytes) for --seq-len "
                                   f"{seq_len}: it needs at least {seq_len + 1} bytes")
            self.sha256 = hashlib.sha256(
                (hashlib.sha256(raw).hexdigest() + ":" + hashlib.sha256(val_raw).hexdigest()).encode()).hexdigest()
        self.path, self.val_path = path, val_path
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self._train_win = np.lib.stride_tricks.sliding_window_view(self.train, seq_len + 1)
        self._val_win = np.lib.stride_tricks.sliding_window_view(self.val, seq_len + 1)
        self.val_batches = self._spread_val_batches(eval_batches)

    def _spread_val_batches(self, n_batches: int) -> list[np.ndarray]:
        """``n_batches`` batches of validation windows spread evenly over the validation text."""
        offsets = np.linspace(0, len(self._val_win) - 1, n_batches * self.batch_size).astype(np.int64)
        return [self._val_win[offsets[i * self.batch_size:(i + 1) * self.batch_size]].astype(np.int32)
                for i in range(n_batches)]

    def final_val_batches(self, tokens: int) -> list[np.ndarray]:
        """Batches of validation windows for a final evaluation over about ``tokens`` predicted tokens:
        non-overlapping windows spread over the whole validation text, at most as many as it holds
        (at least one batch)."""
        per_batch = self.batch_size * self.seq_len
        whole = max(1, len(self.val) // ((self.seq_len + 1) * self.batch_size))
        return self._spread_val_batches(max(1, min(whole, -(-int(tokens) // per_batch))))

    def batch(self, step: int) -> np.ndarray:
        """``(batch, seq_len + 1)`` int32 tokens of training step ``step`` (inputs + targets)."""
        rng = np.random.default_rng([self.seed, int(step)])
        idx = rng.integers(0, len(self._train_win), size=self.batch_size)
        return self._train_win[idx].astype(np.int32)
