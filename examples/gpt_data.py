"""Data of ``train_gpt.py``: byte-level tokens of a text corpus (:class:`ByteData`), or the token
shards of a ``prepare_data.py`` directory (``gpt_tokens.TokenData``); :func:`load_data` picks one.

The default corpus is real public-domain English prose bundled in ``examples/data/``
(``realtext_small_train.txt.xz``, 20.4 MB: 33 novels and 124 State of the Union addresses;
``realtext_small_val.txt.xz``, 1.8 MB: 3 other novels and 13 other addresses; whole documents,
split by document; sources and licences in ``examples/data/SOURCES.md``).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import lzma
from pathlib import Path
from typing import Optional

import numpy as np

from gpt_errors import CLIError

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_DATA = DATA_DIR / "realtext_small_train.txt.xz"
#: the validation text of :data:`DEFAULT_DATA` (used when ``--data`` is the default and ``--val-data`` is not given)
DEFAULT_VAL_DATA = DATA_DIR / "realtext_small_val.txt.xz"
VAL_FRACTION = 0.1


def _read(path: Path, flag: str) -> bytes:
    """The bytes of the text file ``path`` (``.xz`` / ``.gz``: decompressed, in memory)."""
    if path.is_dir():
        from gpt_tokens import INDEX

        raise CLIError(f"{flag} {path} is a directory: give one text file (its bytes are the tokens)" +
                       ("" if flag != "--data" else f", or a data directory with {INDEX} made by "
                        f"`python examples/prepare_data.py --data FILE ... --out DIR`"))
    if not path.is_file():
        raise CLIError(f"{flag} {path}: no such file")
    if path.suffix in (".xz", ".gz"):
        st = path.stat()
        raw = _decompressed(path.resolve(), st.st_mtime_ns, st.st_size, flag)
    else:
        raw = path.read_bytes()
    if not raw:
        raise CLIError(f"{flag} {path}: the corpus is empty")
    return raw


@functools.lru_cache(maxsize=2)
def _decompressed(path: Path, mtime_ns: int, size: int, flag: str) -> bytes:
    """The decompressed bytes of ``path`` (cached: the default corpus takes ~0.5 s to decompress, and a
    process such as the test suite or ``--compare`` reads it again for every run)."""
    try:
        return (lzma.decompress if path.suffix == ".xz" else gzip.decompress)(path.read_bytes())
    except (lzma.LZMAError, OSError, EOFError) as e:
        raise CLIError(f"{flag} {path}: cannot be decompressed ({e})") from None


def load_data(path: Path, seq_len: int, batch_size: int, seed: int, eval_batches: int,
              val_path: Optional[Path] = None):
    """``--data``: a ``prepare_data.py`` directory (it holds ``index.json``) -> ``gpt_tokens.TokenData``
    (its tokenizer's vocabulary); a text file -> :class:`ByteData` (vocabulary 256)."""
    path = Path(path)
    if path.is_dir():
        from gpt_tokens import TokenData, is_token_dir, read_index

        if not is_token_dir(path):
            read_index(path)  # the error: a directory without index.json
        if val_path is not None:
            raise CLIError(f"--val-data: --data {path} is a token directory with its own validation split "
                           "(prepare_data.py --val)")
        return TokenData(path, seq_len, batch_size, seed, eval_batches)
    return ByteData(path, seq_len, batch_size, seed, eval_batches, val_path=val_path)


class ByteData:
    """Byte-level tokens of a text file (``.xz`` / ``.gz`` decompressed into memory), split 90/10 into
    train/val — or, with ``val_path``, all of ``path`` for training and all of ``val_path`` for
    validation (``--val-data``). :data:`DEFAULT_DATA` without ``val_path`` validates on
    :data:`DEFAULT_VAL_DATA` (its documents are not in the training text).

    The training batch of step ``t`` is a pure function of ``(seed, t)``: random windows drawn
    with ``numpy.random.default_rng([seed, t])``, so resuming at step ``t`` resumes the data
    stream exactly. Validation uses fixed, evenly spaced windows.

    ``sha256`` fingerprints the data of a run (checked on ``--resume``): the (decompressed) text's
    hash without ``val_path`` (as before), else the hash of both texts' hashes.
    """

    unit = "bytes"
    vocab_size = None  # the model's default: 256
    tokenizer_sha256 = None

    def __init__(self, path: Path, seq_len: int, batch_size: int, seed: int, eval_batches: int,
                 val_path: Optional[Path] = None):
        path = Path(path)
        if val_path is None and path.resolve() == DEFAULT_DATA:
            val_path = DEFAULT_VAL_DATA
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
