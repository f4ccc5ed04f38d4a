"""The data of ``examples/train.py`` (and of the benchmarks' harness): tokens and the batch of each step.

``--data`` is a text file whose bytes are the tokens (:class:`ByteData`, vocabulary 256; ``.xz`` / ``.gz``
decompressed in memory), or a directory written by ``examples/prepare_data.py`` (:class:`TokenData`: a
subword tokenizer's token shards, read as memmaps); :func:`load_data` picks one. Either way the training
batch of step ``t`` is a pure function of ``(seed, t)``, so a resumed run continues the data stream exactly,
and a run's data has a fingerprint (``sha256``) that its checkpoints store.

The default corpus is real public-domain English prose bundled in ``examples/data/``
(``realtext_small_train.txt.xz``, 20.4 MB: 33 novels and 124 State of the Union addresses;
``realtext_small_val.txt.xz``, 1.8 MB: 3 other novels and 13 other addresses; whole documents,
split by document; sources and licences in ``examples/data/SOURCES.md``).

A token directory holds ``index.json`` (dtype, token counts, vocabulary size, the tokenizer's sha256,
the source files and their sha256), ``tokenizer.json`` (Hugging Face ``tokenizers``; absent for
``--tokenizer bytes``) and the tokens as flat numpy memmaps ``train.bin`` / ``val.bin``
(``uint16`` when the vocabulary fits, else ``uint32``).

:class:`TokenData` reads training windows straight from the memmap: nothing of the corpus is
loaded, so corpora larger than RAM train (the page cache holds what is read).

* The batch of step ``t`` is a pure function of ``(seed, t)``: the ``batch_size`` window starts
  are drawn with ``numpy.random.default_rng([seed, t])`` for the whole global batch, and row ``i``
  is ``train[start_i : start_i + seq_len + 1]``. ``--resume`` at step ``t`` therefore continues the
  stream exactly, on any number of processes.
* Every process reads only its rows of the global batch: by default the contiguous block
  ``process_index`` of ``process_count`` equal blocks, or, after :meth:`TokenData.use_sharding`,
  the rows the process's devices hold in the runtime's batch sharding. :meth:`TokenData.batch`
  returns the global-shaped ``(batch_size, seq_len + 1)`` int32 array (the interface of
  :class:`ByteData`) with the other processes' rows left zero, never read (each process transfers only its
  rows to its devices). :meth:`TokenData.local_batch` gives just the local rows.
* A background thread prefetches the next ``prefetch`` batches (a small queue), so the train loop
  does not wait on reads; a request for another step than the next one (a resume, a jump) restarts
  it from there.
* Validation: fixed windows spread evenly over ``val.bin`` (read once, every row on every
  process: they are few).

Why not Grain: the sampler here is ~20 lines with exactly the (seed, step) determinism the
checkpoints rely on; Grain would add a dependency and a record/sampler layer (its ``MapDataset``
shuffles records, not random token windows of one flat array), and its worker processes buy nothing
when a batch is ``batch_size`` contiguous slices of a memmap: reading a GPT-2 batch (16 x 1025
tokens, random windows of the page-cached corpus) takes well under a millisecond of one CPU core, and
it happens in the prefetch thread while the step runs. ``python examples/data.py DIR`` measures
both: the read, and the train loop's wait for a prefetched batch after a step of ``--step-ms``;
``benchmarks/bench_loader.py`` times the example's train step fed by this loader against the same step on
a fixed batch (on a GPU: ``bash scripts/gpu_check.sh loader``).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import lzma
import queue
import sys
import threading
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


class CLIError(Exception):
    """A bad input (a flag's value, a file): printed as one line, exit code 2, nothing written."""


DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_DATA = DATA_DIR / "realtext_small_train.txt.xz"
#: the validation text of :data:`DEFAULT_DATA` (used when ``--data`` is the default and ``--val-data`` is not given)
DEFAULT_VAL_DATA = DATA_DIR / "realtext_small_val.txt.xz"
VAL_FRACTION = 0.1


def _read(path: Path, flag: str) -> bytes:
    """The bytes of the text file ``path`` (``.xz`` / ``.gz``: decompressed, in memory)."""
    if path.is_dir():
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
    """``--data``: a ``prepare_data.py`` directory (it holds ``index.json``) -> :class:`TokenData`
    (its tokenizer's vocabulary); a text file -> :class:`ByteData` (vocabulary 256)."""
    path = Path(path)
    if path.is_dir():
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


# ------------------------------------------------------------------------------------------------
# Token directories of prepare_data.py
# ------------------------------------------------------------------------------------------------

INDEX = "index.json"
TOKENIZER = "tokenizer.json"
FORMAT = 1
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def is_token_dir(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``prepare_data.py`` (it holds ``index.json``)."""
    return Path(path).is_dir() and (Path(path) / INDEX).is_file()


def read_index(path: Path, flag: str = "--data") -> dict:
    """``DIR/index.json``, checked: its shards exist with the sizes it states, the vocabulary fits
    their dtype and the tokenizer file is the one it names (sha256). :class:`CLIError` else. Reads
    no shard."""
    path = Path(path)
    if not path.is_dir():
        raise CLIError(f"{flag} {path}: no such directory")
    if not (path / INDEX).is_file():
        raise CLIError(f"{flag} {path} is a directory without {INDEX}: give one text file (its bytes are the tokens), "
                       "or a token directory made by `python examples/prepare_data.py --data FILE --out DIR`")
    try:
        index = json.loads((path / INDEX).read_text())
        dtype = np.dtype(DTYPES[index["dtype"]])
        for split in ("train", "val"):
            f, n = path / index[split]["file"], int(index[split]["tokens"])
            if not f.is_file() or f.stat().st_size != n * dtype.itemsize:
                raise CLIError(f"{flag} {path}: {f.name} is missing or not {n} {index['dtype']} tokens as "
                               f"{INDEX} says; run prepare_data.py again")
        vocab = int(index["vocab_size"])
        if vocab > np.iinfo(dtype).max + 1:
            raise CLIError(f"{flag} {path}: a vocabulary of {vocab} tokens does not fit its {index['dtype']} shards "
                           f"(at most {np.iinfo(dtype).max + 1}); run prepare_data.py again with --dtype uint32")
        tok = index["tokenizer"]
        if tok["type"] != "bytes":
            f = path / tok["file"]
            if not f.is_file():
                raise CLIError(f"{flag} {path}: {tok['file']} is missing; run prepare_data.py again")
            if hashlib.sha256(f.read_bytes()).hexdigest() != tok["sha256"]:
                raise CLIError(f"{flag} {path}: {tok['file']} is not the tokenizer its shards were made with "
                               f"({INDEX} names sha256 {tok['sha256'][:12]}…); run prepare_data.py again")
    except CLIError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise CLIError(f"{flag} {path}/{INDEX} is not an index of prepare_data.py ({type(e).__name__}: {e}); "
                       f"run prepare_data.py again") from None
    return index


def block_rows(batch_size: int, process_index: int, process_count: int) -> np.ndarray:
    """The rows of process ``process_index``: its block of ``process_count`` equal contiguous blocks."""
    if batch_size % process_count:
        raise CLIError(f"--batch-size {batch_size} is not divisible by the number of processes ({process_count})")
    per = batch_size // process_count
    return np.arange(process_index * per, (process_index + 1) * per)


class _Prefetcher:
    """Computes ``fn(step)`` for ``step, step + 1, ...`` in a daemon thread, ``depth`` ahead."""

    def __init__(self, fn, depth: int):
        self.fn, self.depth = fn, depth
        self.next = None  # the step the queue's head holds
        self.q: Optional[queue.Queue] = None
        self.stop: Optional[threading.Event] = None
        self.thread: Optional[threading.Thread] = None

    def _run(self, start: int, q: queue.Queue, stop: threading.Event):
        step = start
        while not stop.is_set():
            try:
                item = (step, self.fn(step), None)
            except BaseException as e:  # re-raised by get()
                item = (step, None, e)
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[2] is not None:
                return
            step += 1

    def close(self):
        if self.stop is not None:
            self.stop.set()
            self.thread.join()
        self.q = self.stop = self.thread = self.next = None

    def get(self, step: int) -> np.ndarray:
        if self.next != step:  # first call, a resume or a jump: restart the stream here
            self.close()
            value = self.fn(step)  # this one synchronously, the following ones ahead
            self.q, self.stop = queue.Queue(self.depth), threading.Event()
            self.thread = threading.Thread(target=self._run, args=(step + 1, self.q, self.stop), daemon=True,
                                           name="TokenData-prefetch")
            self.thread.start()
            self.next = step + 1
            return value
        got, value, err = self.q.get()
        assert got == step, (got, step)
        if err is not None:
            self.close()
            raise err
        self.next = step + 1
        return value


class TokenData:
    """Training and validation windows of a ``prepare_data.py`` directory (see the module docstring).

    Same interface as :class:`ByteData`: ``batch(step)``, ``val_batches``,
    ``final_val_batches(tokens)``, ``train`` / ``val`` (the token memmaps), ``sha256`` (the data
    fingerprint of a run: of the tokenizer and of both shards, from the index), ``path``,
    ``val_path`` (None); plus ``vocab_size`` and ``tokenizer_sha256`` (the model's vocabulary and
    the tokenizer, part of a run's config).
    """

    unit = "tokens"

    def __init__(self, path: Path, seq_len: int, batch_size: int, seed: int, eval_batches: int,
                 process_index: Optional[int] = None, process_count: Optional[int] = None, prefetch: int = 4):
        path = Path(path)
        self.index = index = read_index(path)
        self.path, self.val_path = path, None
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.vocab_size = int(index["vocab_size"])
        self.tokenizer_sha256 = index["tokenizer"]["sha256"]
        dtype = DTYPES[index["dtype"]]
        self.train = np.memmap(path / index["train"]["file"], dtype=dtype, mode="r")
        self.val = np.memmap(path / index["val"]["file"], dtype=dtype, mode="r")
        for split, arr in (("train", self.train), ("val", self.val)):
            if len(arr) < seq_len + 1:
                raise CLIError(f"--data {path}: {split}.bin holds {len(arr)} tokens, too few for --seq-len "
                               f"{seq_len} (at least {seq_len + 1})")
        self.sha256 = hashlib.sha256(json.dumps(
            [self.tokenizer_sha256, index["train"]["sha256"], index["val"]["sha256"]]).encode()).hexdigest()
        if process_index is None or process_count is None:
            import jax

            process_index, process_count = jax.process_index(), jax.process_count()
        self.rows = block_rows(batch_size, process_index, process_count)
        self.val_batches = self._spread_val_batches(eval_batches)
        self._prefetch = _Prefetcher(self._read_batch, prefetch) if prefetch > 0 else None

    # -- training -------------------------------------------------------------------------------

    def use_sharding(self, sharding) -> None:
        """Read only the rows that this process's devices hold in ``sharding`` (the runtime's batch
        sharding of the ``(batch_size, seq_len + 1)`` token array)."""
        shape = (self.batch_size, self.seq_len + 1)
        rows = set()
        for idx in sharding.addressable_devices_indices_map(shape).values():
            rows.update(range(*idx[0].indices(self.batch_size)) if idx else range(self.batch_size))
        rows = np.array(sorted(rows), dtype=np.int64)
        if not np.array_equal(rows, self.rows):
            self.rows = rows
            if self._prefetch is not None:
                self._prefetch.close()

    def starts(self, step: int) -> np.ndarray:
        """The window starts of every row of the global batch of ``step`` (a function of ``(seed, step)``)."""
        rng = np.random.default_rng([self.seed, int(step)])
        return rng.integers(0, len(self.train) - self.seq_len, size=self.batch_size)

    def _read(self, arr, starts: Sequence[int]) -> np.ndarray:
        out = np.empty((len(starts), self.seq_len + 1), dtype=np.int32)
        for i, s in enumerate(starts):
            out[i] = arr[s:s + self.seq_len + 1]
        return out

    def _read_batch(self, step: int) -> np.ndarray:
        out = np.zeros((self.batch_size, self.seq_len + 1), dtype=np.int32)
        out[self.rows] = self._read(self.train, self.starts(step)[self.rows])
        return out

    def batch(self, step: int) -> np.ndarray:
        """``(batch_size, seq_len + 1)`` int32 tokens of training step ``step`` (inputs + targets): this
        process's rows filled, the others zero (prefetched in the background for the steps after)."""
        if self._prefetch is None:
            return self._read_batch(step)
        return self._prefetch.get(int(step))

    def local_batch(self, step: int) -> np.ndarray:
        """Only this process's rows (``self.rows``) of :meth:`batch`."""
        return self.batch(step)[self.rows]

    def close(self) -> None:
        """Stops the prefetch thread (it is a daemon: exiting without this is fine)."""
        if self._prefetch is not None:
            self._prefetch.close()

    # -- validation -----------------------------------------------------------------------------

    def _spread_val_batches(self, n_batches: int) -> list[np.ndarray]:
        """``n_batches`` batches of validation windows spread evenly over the validation tokens."""
        offsets = np.linspace(0, len(self.val) - self.seq_len - 1, n_batches * self.batch_size).astype(np.int64)
        return [self._read(self.val, offsets[i * self.batch_size:(i + 1) * self.batch_size]) for i in range(n_batches)]

    def final_val_batches(self, tokens: int) -> list[np.ndarray]:
        """Batches of validation windows for a final evaluation over about ``tokens`` predicted tokens
        (non-overlapping windows over the whole validation split at most; at least one batch)."""
        per_batch = self.batch_size * self.seq_len
        whole = max(1, len(self.val) // ((self.seq_len + 1) * self.batch_size))
        return self._spread_val_batches(max(1, min(whole, -(-int(tokens) // per_batch))))


def check_tokenizer(saved_config: dict, data, where) -> None:
    """``--resume``: a clear error when the checkpoint's run used another tokenizer (or vocabulary)
    than ``data`` (a :class:`TokenData` or ``ByteData``: no tokenizer, 256 bytes)."""
    now_tok = getattr(data, "tokenizer_sha256", None)
    was_tok = saved_config.get("tokenizer_sha256")
    if now_tok == was_tok:
        return
    name = lambda t: "bytes of a text file (vocabulary 256)" if t is None else (
        "the byte tokenizer (vocabulary 256)" if t == "bytes" else f"the tokenizer with sha256 {t[:12]}…")
    raise CLIError(f"--resume: the checkpoint in {where} was trained on {name(was_tok)}, but --data {data.path} "
                   f"gives {name(now_tok)}: resume with the data it was trained on, or start a fresh run in "
                   f"another --out")


def main(argv=None) -> int:  # python examples/data.py DIR: the loader's read time and wait
    import argparse
    import time

    ap = argparse.ArgumentParser(description="time TokenData's batch read (no prefetch), and the train loop's wait "
                                             "for a prefetched batch while a step of --step-ms runs")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--step-ms", type=float, default=5.0, help="the simulated step (the thread reads meanwhile)")
    a = ap.parse_args(argv)
    try:
        d = TokenData(a.dir, a.seq_len, a.batch_size, 0, 1, 0, 1, prefetch=0)
    except CLIError as e:
        print(f"data.py: error: {e}", file=sys.stderr)
        return 2
    for s in range(20):
        d.batch(s)
    t = time.perf_counter()
    n = 500
    for s in range(n):
        d.batch(1000 + s)
    dt = (time.perf_counter() - t) / n
    print(f"{a.dir}: {len(d.train):,} train tokens; batch {a.batch_size} x {a.seq_len + 1}: {dt * 1e3:.3f} ms per batch "
          "read")
    p = TokenData(a.dir, a.seq_len, a.batch_size, 0, 1, 0, 1)
    p.batch(0)  # starts the prefetch thread
    waits = []
    for s in range(1, 101):
        time.sleep(a.step_ms / 1e3)  # the step (the GIL is free, as while XLA runs)
        t = time.perf_counter()
        p.batch(s)
        waits.append(time.perf_counter() - t)
    p.close()
    print(f"prefetched, after a {a.step_ms:g} ms step: wait for the next batch median {np.median(waits) * 1e3:.3f} ms, "
          f"max {max(waits) * 1e3:.3f} ms (100 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
