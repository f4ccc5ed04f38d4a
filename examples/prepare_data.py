#!/usr/bin/env python
"""Turn text files into token shards for ``train.py --data DIR`` (as nanoGPT's ``prepare.py``).

::

    pip install -e ".[data]"   # Hugging Face tokenizers
    python examples/prepare_data.py --data examples/data/realtext_small_train.txt.xz \\
        --val examples/data/realtext_small_val.txt.xz --out data/realtext_small --vocab-size 32000
    python examples/train.py --data data/realtext_small --size gpt2 --compare dense,srste

Writes into ``--out`` (nothing at all if anything is wrong: it is built in a temporary directory
beside ``--out`` and renamed at the end):

* ``tokenizer.json`` — a byte-level BPE tokenizer (Hugging Face ``tokenizers``, GPT-2's
  pre-tokenizer, ``<|endoftext|>`` = id 0, appended after every input file) trained on the training
  text, with ``--vocab-size`` entries (fewer if the text has too few merges). ``--tokenizer
  bytes`` skips it: the tokens are the UTF-8 bytes (vocabulary 256, the byte path of
  ``train.py``, as shards).
* ``train.bin`` / ``val.bin`` — the tokens as flat numpy memmaps, ``uint16`` when the vocabulary
  fits (<= 65536 entries), else ``uint32`` (``--dtype``).
* ``index.json`` — dtype, token counts and sha256 of both shards, vocabulary size, the tokenizer's
  sha256, the source files (bytes, sha256) and how validation was split.

Validation: ``--val FILE ...`` (all of ``--data`` trains), or the last ``--val-fraction`` (default
0.1) of the concatenated ``--data`` text, cut at a paragraph start.

Everything streams: the text is read in chunks of about ``--chunk-mb`` MB (``.xz`` / ``.gz``
inputs decompressed on the fly), cut where a line follows a newline, so text larger than RAM
works (the tokenizer's trainer keeps only word counts). The tokens do not depend on the chunk size:
each chunk is encoded as paragraph pieces (split before every line that follows a ``\\n``).
Three passes over the input: check (UTF-8, sizes, sha256), train the tokenizer, encode.

Bad input (a file that is missing, empty, not UTF-8 or not decompressible, an ``--out`` that exists
without ``--overwrite``, a vocabulary too large for ``--dtype uint16``, a split left without tokens)
-> one line, exit code 2, nothing written (not even ``--out``'s parent directories).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
from data import FORMAT, INDEX, TOKENIZER, CLIError  # noqa: E402

PROG = "prepare_data.py"
EOT = "<|endoftext|>"
_PIECE = re.compile(r"(?<=\n)(?=[^\n])")  # before every line that follows a newline
_CUT = re.compile(rb"\n[^\n]")


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


def _open(path: Path):
    """``(raw file, decompressed binary stream)`` of ``path`` (``.xz`` / ``.gz`` decompressed)."""
    raw = open(path, "rb")
    if path.suffix == ".xz":
        return raw, lzma.LZMAFile(raw)
    if path.suffix == ".gz":
        return raw, gzip.GzipFile(fileobj=raw)
    return raw, raw


def _chunks(path: Path, chunk_bytes: int, progress=None) -> Iterator[bytes]:
    """The bytes of ``path`` in chunks of about ``chunk_bytes``, each ending just after a newline
    that a non-newline follows (the last one ends where the file does)."""
    raw, f = _open(path)
    with raw, f:
        carry = b""
        last = raw.tell()
        while True:
            try:
                block = f.read(chunk_bytes)
            except (OSError, EOFError, lzma.LZMAError) as e:
                raise CLIError(f"{path}: cannot be read ({e})") from None
            if progress is not None:
                progress.advance(raw.tell() - last)
                last = raw.tell()
            if not block:
                if carry:
                    yield carry
                return
            buf = carry + block
            cut = None
            for m in _CUT.finditer(buf, max(0, len(buf) - len(block) - 1)):
                cut = m.start() + 1
            if cut is None:  # one long paragraph: read on
                carry = buf
                continue
            carry = buf[cut:]
            yield buf[:cut]


def _decode(chunk: bytes, path: Path, offset: int) -> str:
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"{path} is not UTF-8 text (byte {offset + e.start}: {e.reason}); convert it first, e.g. "
                       f"`iconv -f latin1 -t utf-8`") from None


class Progress:
    """A one-line progress bar on stderr (tqdm when installed), by bytes of input files read."""

    #: the bars on the screen now (an error clears them first: :meth:`clear_all`)
    shown: set = set()

    def __init__(self, total: int, desc: str, quiet: bool):
        self.total, self.desc, self.quiet, self.done, self.t0, self._last = total, desc, quiet, 0, time.time(), 0.0
        self._bar = None
        if not quiet:
            Progress.shown.add(self)
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr, leave=True)
            except ImportError:
                pass

    def advance(self, n: int):
        self.done += n
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.time()
        if now - self._last > 0.5 or self.done >= self.total:
            self._last = now
            frac = self.done / max(1, self.total)
            bar = "#" * int(30 * frac)
            print(f"\r{self.desc}: [{bar:<30s}] {frac:6.1%} {self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB "
                  f"{now - self.t0:.0f}s", end="", file=sys.stderr, flush=True)

    @classmethod
    def clear_all(cls):
        """Remove the unfinished bars from the terminal, so that what is printed next has its own line."""
        for bar in list(cls.shown):
            if bar._bar is not None:
                bar._bar.leave = False
                bar._bar.close()
            else:
                print("\r" + " " * 100 + "\r", end="", file=sys.stderr, flush=True)
            cls.shown.discard(bar)

    def close(self, note: str = ""):
        if self.quiet:
            return
        Progress.shown.discard(self)
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note)
            self._bar.close()
        else:
            print(f"\r{self.desc}: done in {time.time() - self.t0:.1f}s{' ' + note if note else ''}" + " " * 40,
                  file=sys.stderr)


# ------------------------------------------------------------------------------------------------
# The three passes
# ------------------------------------------------------------------------------------------------


def scan(paths: list[Path], chunk_bytes: int, quiet: bool) -> list[dict]:
    """Pass 1: every file exists, is not empty and is UTF-8; its decompressed size and sha256."""
    for p in paths:
        if p.is_dir():
            raise CLIError(f"{p} is a directory: give text files")
        if not p.is_file():
            raise CLIError(f"{p}: no such file")
    bar = Progress(sum(p.stat().st_size for p in paths), "check", quiet)
    out = []
    for p in paths:
        h, n = hashlib.sha256(), 0
        for c in _chunks(p, chunk_bytes, bar):
            _decode(c, p, n)
            h.update(c)
            n += len(c)
        if n == 0:
            raise CLIError(f"{p}: the file is empty")
        out.append({"path": str(p), "bytes": n, "sha256": h.hexdigest()})
    bar.close()
    return out


def split_pieces(paths: list[Path], chunk_bytes: int, val_from: Optional[int], want: str, bar) -> Iterator[list[str]]:
    """Lists of text pieces (paragraphs) of ``paths``, each file followed by ``EOT``: all of them
    (``want`` "all"), or those before / from the byte offset ``val_from`` of the concatenated text
    (cut at the first piece that starts there or later): "train" / "val"."""
    pos = 0
    in_val = False
    for p in paths:
        for c in _chunks(p, chunk_bytes, bar):
            text = c.decode("utf-8")
            pieces = _PIECE.split(text)
            if val_from is None or want == "all":
                yield pieces
                pos += len(c)
                continue
            keep = []
            for piece in pieces:
                if not in_val and pos >= val_from:
                    in_val = True
                if in_val == (want == "val"):
                    keep.append(piece)
                pos += len(piece.encode("utf-8"))
            if keep:
                yield keep
            if in_val and want == "train":  # the rest is validation text
                return
        if val_from is None or want == "all" or in_val == (want == "val"):
            yield [EOT]


def train_tokenizer(pieces: Iterator[list[str]], vocab_size: int):
    """Pass 2: a byte-level BPE tokenizer (GPT-2's pre-tokenizer) trained on ``pieces``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((piece for chunk in pieces for piece in chunk), trainer)
    return tok


def encode_to(path: Path, pieces: Iterator[list[str]], encode, dtype) -> dict:
    """Pass 3: the tokens of ``pieces`` appended to ``path``; ``{"file", "tokens", "sha256"}``."""
    h, n = hashlib.sha256(), 0
    with open(path, "wb") as f:
        for chunk in pieces:
            ids = encode(chunk)
            buf = np.asarray(ids, dtype=dtype).tobytes()
            f.write(buf)
            h.update(buf)
            n += len(ids)
    return {"file": path.name, "tokens": n, "sha256": h.hexdigest()}


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+", required=True,
                    help="training text files (UTF-8; .xz / .gz are decompressed on the fly)")
    ap.add_argument("--out", type=Path, required=True, help="the data directory to write")
    ap.add_argument("--tokenizer", choices=("bpe", "bytes"), default="bpe",
                    help="bpe: train a byte-level BPE tokenizer; bytes: the UTF-8 bytes are the tokens (vocabulary 256)")
    ap.add_argument("--vocab-size", type=int, default=None, help="bpe vocabulary size (default 32000, LLaMA's)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--val", type=Path, nargs="+", default=None, help="validation text files (all of --data trains)")
    g.add_argument("--val-fraction", type=float, default=None,
                   help="without --val: the last fraction of the --data text validates (default 0.1)")
    ap.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                    help="token dtype of the shards (auto: uint16 when the vocabulary fits)")
    ap.add_argument("--chunk-mb", type=float, default=4.0, help="text read per chunk (MB)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def prepare(a) -> dict:
    """Writes ``a.out`` from the parsed flags ``a``; returns its index."""
    if a.tokenizer == "bytes":
        if a.vocab_size is not None:
            raise CLIError("--vocab-size is for --tokenizer bpe (the byte tokenizer has 256 tokens)")
        vocab = 256
    else:
        vocab = 32000 if a.vocab_size is None else a.vocab_size
        if vocab < 257:
            raise CLIError(f"--vocab-size {vocab}: a byte-level BPE needs at least 257 (256 bytes + {EOT})")
    if a.dtype == "uint16" and vocab > 65536:
        raise CLIError(f"--vocab-size {vocab} does not fit --dtype uint16 (at most 65536 tokens): use uint32 or auto")
    dtype = np.uint16 if a.dtype == "uint16" or (a.dtype == "auto" and vocab <= 65536) else np.uint32
    frac = None
    if a.val is None:
        frac = 0.1 if a.val_fraction is None else a.val_fraction
        if not 0 < frac < 1:
            raise CLIError(f"--val-fraction must be in (0, 1), got {frac}")
    out = a.out
    if out.exists() and not a.overwrite:
        raise CLIError(f"--out {out} exists: pass --overwrite to replace it, or choose another --out")
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} is not a directory")
    if a.tokenizer == "bpe":
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            raise CLIError("--tokenizer bpe needs Hugging Face tokenizers: pip install tokenizers "
                           "(or pip install -e \".[data]\")") from None
    chunk = max(1 << 16, int(a.chunk_mb * 1e6))
    t0 = time.time()

    train_files = list(a.data)
    val_files = list(a.val or [])
    src = scan(train_files + val_files, chunk, a.quiet)
    src_train, src_val = src[:len(train_files)], src[len(train_files):]
    val_from = None
    if frac is not None:
        val_from = int(sum(s["bytes"] for s in src_train) * (1 - frac))
    total = sum(p.stat().st_size for p in train_files)

    def train_pieces(desc):
        bar = Progress(total, desc, a.quiet)
        yield from split_pieces(train_files, chunk, val_from, "train", bar)
        bar.close()

    def val_pieces(desc):
        if val_files:
            bar = Progress(sum(p.stat().st_size for p in val_files), desc, a.quiet)
            yield from split_pieces(val_files, chunk, None, "all", bar)
        else:
            bar = Progress(total, desc, a.quiet)
            yield from split_pieces(train_files, chunk, val_from, "val", bar)
        bar.close()

    created = out.parent  # the outermost directory that mkdir creates: removed again on failure
    while not created.parent.exists():
        created = created.parent
    created = None if created.exists() else created
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    done = False
    try:
        if a.tokenizer == "bpe":
            tok = train_tokenizer(train_pieces("tokenizer (BPE)"), vocab)
            tok.save(str(tmp / TOKENIZER))
            tok_info = {"type": "bpe", "file": TOKENIZER, "sha256": hashlib.sha256((tmp / TOKENIZER).read_bytes()).hexdigest(),
                        "eot_id": tok.token_to_id(EOT), "requested_vocab_size": vocab}
            vocab = tok.get_vocab_size()

            def encode(pieces):
                return [i for e in tok.encode_batch(pieces, add_special_tokens=False) for i in e.ids]
        else:
            tok_info = {"type": "bytes", "file": None, "sha256": "bytes", "eot_id": None}

            def encode(pieces):
                return np.frombuffer("".join(p for p in pieces if p != EOT).encode("utf-8"), dtype=np.uint8)

        shards = {"train": encode_to(tmp / "train.bin", train_pieces("encode train"), encode, dtype),
                  "val": encode_to(tmp / "val.bin", val_pieces("encode val"), encode, dtype)}
        for split in ("train", "val"):
            if shards[split]["tokens"] < 2:
                raise CLIError(f"the {split} split holds {shards[split]['tokens']} tokens: give more text"
                               + (" or a larger --val-fraction" if split == "val" and frac is not None else ""))
        index = {
            "format": FORMAT, "dtype": np.dtype(dtype).name, "vocab_size": int(vocab), "tokenizer": tok_info,
            "train": shards["train"], "val": shards["val"],
            "sources": {"train": src_train, "val": src_val if val_files else src_train},
            "val_split": ({"files": [str(p) for p in val_files]} if val_files else
                          {"fraction": frac, "from_byte": val_from}),
            "created_by": "examples/prepare_data.py",
        }
        (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        done = True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        if not done and created is not None and created.exists():
            shutil.rmtree(created)
    if not a.quiet:
        print(f"{PROG}: {shards['train']['tokens']:,} train / {shards['val']['tokens']:,} val tokens "
              f"({index['dtype']}, vocabulary {vocab}) in {time.time() - t0:.1f}s -> {out}", file=sys.stderr)
    return index


def main(argv=None) -> int:
    a = build_parser().parse_args(None if argv is None else [str(x) for x in argv])
    try:
        prepare(a)
    except CLIError as e:
        Progress.clear_all()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
