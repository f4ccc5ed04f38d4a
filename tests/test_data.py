"""Tests for examples/prepare_data.py and the token loader examples/data.py (CPU, small text)."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "examples")]

import data  # noqa: E402
import prepare_data  # noqa: E402

pytest.importorskip("tokenizers")

# the example tests' model, small enough to compile and train in a few seconds on two CPU cores (the
# compiled programs are shared through the session's compilation cache, tests/conftest.py)
from test_train_gpt import TINY  # noqa: E402


def _text(n_docs: int = 60, seed: int = 0) -> str:
    """Documents of pseudo-English (a few distinct words, so the BPE has merges to learn)."""
    rng = np.random.default_rng(seed)
    words = ("the quick brown fox jumps over lazy dog and then some more words appear in a story about "
             "sparse training of transformers with masks café naïve — “quoted” text").split()
    docs = []
    for _ in range(n_docs):
        paras = [" ".join(rng.choice(words, size=rng.integers(20, 60))).capitalize() + "."
                 for _ in range(rng.integers(2, 5))]
        docs.append("\n\n".join(paras))
    return "\n\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """A small text (plain, gzipped) and a BPE data directory made from it (vocab 300)."""
    d = tmp_path_factory.mktemp("corpus")
    text = _text()
    (d / "a.txt").write_text(text, encoding="utf-8")
    (d / "b.txt.gz").write_bytes(gzip.compress(_text(20, seed=1).encode("utf-8")))
    out = d / "bpe"
    assert prepare_data.main(["--data", d / "a.txt", d / "b.txt.gz", "--out", out, "--vocab-size", 300,
                              "--val-fraction", 0.2, "--quiet"]) == 0
    return {"dir": d, "out": out, "text": text}


def test_prepare_data_writes_index_tokenizer_and_shards(corpus):
    from tokenizers import Tokenizer

    out, d = corpus["out"], corpus["dir"]
    index = json.loads((out / "index.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "tokenizer.json", "train.bin", "val.bin"]
    assert index["dtype"] == "uint16" and index["vocab_size"] == 300
    tok_bytes = (out / "tokenizer.json").read_bytes()
    assert index["tokenizer"]["sha256"] == hashlib.sha256(tok_bytes).hexdigest()
    assert [s["sha256"] for s in index["sources"]["train"]] == [
        hashlib.sha256((d / "a.txt").read_bytes()).hexdigest(),
        hashlib.sha256(gzip.decompress((d / "b.txt.gz").read_bytes())).hexdigest()]
    train = np.memmap(out / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(out / "val.bin", dtype=np.uint16, mode="r")
    assert (len(train), len(val)) == (index["train"]["tokens"], index["val"]["tokens"])
    assert index["train"]["sha256"] == hashlib.sha256(train.tobytes()).hexdigest()
    assert 0.1 < len(val) / (len(train) + len(val)) < 0.3 and train.max() < 300
    # the shards decode back to the text: train = the start of a.txt, val = the end of b.txt
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eot = index["tokenizer"]["eot_id"]
    first = tok.decode([int(t) for t in train[:2000]]).split("<|endoftext|>")[0]
    assert corpus["text"].startswith(first[:1000]) and len(first) > 1000
    assert eot in train and (tok.decode([int(t) for t in val[-300:]], skip_special_tokens=True)
                             in gzip.decompress((d / "b.txt.gz").read_bytes()).decode())
    # tokens do not depend on the chunk size
    small = d / "bpe_small_chunks"
    assert prepare_data.main(["--data", d / "a.txt", d / "b.txt.gz", "--out", small, "--vocab-size", 300,
                              "--val-fraction", 0.2, "--quiet", "--chunk-mb", 0.001]) == 0
    assert (small / "train.bin").read_bytes() == (out / "train.bin").read_bytes()
    assert (small / "val.bin").read_bytes() == (out / "val.bin").read_bytes()


def test_prepare_data_bytes_and_val_files(tmp_path, corpus):
    d = corpus["dir"]
    out = tmp_path / "bytes"
    assert prepare_data.main(["--data", d / "a.txt", "--val", d / "b.txt.gz", "--out", out, "--tokenizer", "bytes",
                              "--dtype", "uint32", "--quiet"]) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["dtype"] == "uint32" and index["vocab_size"] == 256 and not (out / "tokenizer.json").exists()
    assert np.fromfile(out / "train.bin", np.uint32).astype(np.uint8).tobytes() == (d / "a.txt").read_bytes()
    assert np.fromfile(out / "val.bin", np.uint32).astype(np.uint8).tobytes() == gzip.decompress(
        (d / "b.txt.gz").read_bytes())


def test_prepare_data_error_is_on_a_line_of_its_own(tmp_path, capsys):
    """With the progress bar shown (no --quiet), a UTF-8 error clears the unfinished bar: the error line is
    the last line of stderr and holds nothing of the bar."""
    f = tmp_path / "t.txt"
    f.write_bytes(("hello world\n" * 5000).encode() + "caf\xe9\n".encode("latin1"))
    assert prepare_data.main(["--data", f, "--out", tmp_path / "out", "--chunk-mb", "0.01"]) == 2
    last = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert last.split("\r")[-1].startswith("prepare_data.py: error: ") and "is not UTF-8 text" in last, repr(last)
    assert "check" not in last.split("\r")[-1] and "%" not in last.split("\r")[-1], repr(last)


@pytest.mark.parametrize("case, message", [
    ("latin1", "is not UTF-8 text (byte 7"),
    ("latin1-val", "v.txt is not UTF-8 text (byte 3"),
    ("empty", "the file is empty"),
    ("empty-xz", "the file is empty"),
    ("corrupt-xz", "cannot be read"),
    ("uint16", "does not fit --dtype uint16"),
    ("exists", "exists: pass --overwrite"),
    ("missing", "no such file"),
    ("no-val", "the val split holds 0 tokens"),  # after the tokenizer was trained: nothing is left either
])
def test_prepare_data_bad_input(tmp_path, capsys, case, message):
    import lzma

    f = tmp_path / ("t.txt.xz" if case.endswith("-xz") else "t.txt")
    f.write_bytes({"latin1": "abc\ncaf\xe9\n".encode("latin1"), "empty": b"", "empty-xz": lzma.compress(b""),
                   "corrupt-xz": lzma.compress(b"hello world\n" * 500)[:-40],
                   "no-val": b"word " * 200}.get(case, b"hello world\n" * 50))
    out = tmp_path / "out" if case != "no-val" else tmp_path / "new" / "dirs" / "out"
    args = ["--data", f if case != "missing" else tmp_path / "nope.txt", "--out", out, "--quiet"]
    if case == "uint16":
        args += ["--vocab-size", 70000, "--dtype", "uint16"]
    if case == "latin1-val":
        (tmp_path / "v.txt").write_bytes("caf\xe9".encode("latin1"))
        args += ["--val", tmp_path / "v.txt"]
    if case == "exists":
        out.mkdir()
        (out / "keep").write_text("x")
    assert prepare_data.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f.name] + (["out"] if case == "exists" else []) + (["v.txt"] if case == "latin1-val" else []))


def test_loader_is_a_function_of_seed_and_step_and_process_rows(corpus):
    out = corpus["out"]
    a = data.TokenData(out, 32, 8, 3, 2, process_index=0, process_count=1)
    b = data.TokenData(out, 32, 8, 3, 2, process_index=0, process_count=1, prefetch=0)
    seq = [a.batch(t) for t in range(6)]  # prefetched stream
    assert all(np.array_equal(seq[t], b.batch(t)) for t in range(6))
    assert np.array_equal(a.batch(2), seq[2]) and np.array_equal(a.batch(3), seq[3])  # a jump back (resume)
    assert seq[0].shape == (8, 33) and seq[0].dtype == np.int32 and not np.array_equal(seq[0], seq[1])
    assert not np.array_equal(seq[0], data.TokenData(out, 32, 8, 4, 2, 0, 1, prefetch=0).batch(0))
    train = np.memmap(out / "train.bin", dtype=np.uint16, mode="r")
    s = a.starts(4)
    assert np.array_equal(seq[4][5], train[s[5]:s[5] + 33])
    # two processes: each reads its rows; together they are the one-process batch (the other rows zero)
    parts = [data.TokenData(out, 32, 8, 3, 2, process_index=p, process_count=2) for p in (0, 1)]
    for t in (0, 5, 1):
        full = [p.batch(t) for p in parts]
        assert not full[0][4:].any() and not full[1][:4].any()
        assert np.array_equal(np.concatenate([p.local_batch(t) for p in parts]), seq[t])
    assert all(np.array_equal(p.val_batches[0], a.val_batches[0]) for p in parts)
    for d in (a, *parts):
        d.close()


def test_loader_rows_from_sharding(corpus):
    import jax

    class Fake:  # the rows of 2 of 4 devices: what make_array_from_callback asks this process for
        def addressable_devices_indices_map(self, shape):
            return {0: (slice(2, 4), slice(None)), 1: (slice(6, 8), slice(None))}

    d = data.TokenData(corpus["out"], 32, 8, 0, 1, process_index=0, process_count=1)
    whole = d.batch(7)
    d.use_sharding(Fake())
    got = d.batch(7)
    assert np.array_equal(got[[2, 3, 6, 7]], whole[[2, 3, 6, 7]]) and not got[[0, 1, 4, 5]].any()
    d.use_sharding(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    assert np.array_equal(d.batch(7), whole)
    d.close()


def test_load_data_errors(tmp_path, corpus):
    with pytest.raises(data.CLIError, match="without index.json: give one text file"):
        data.load_data(tmp_path, 32, 8, 0, 1)
    with pytest.raises(data.CLIError, match="its own validation split"):
        data.load_data(corpus["out"], 32, 8, 0, 1, val_path=corpus["dir"] / "a.txt")
    with pytest.raises(data.CLIError, match="too few for --seq-len"):
        data.load_data(corpus["out"], 100000, 8, 0, 1)


def test_default_corpus_is_the_bundled_real_text():
    d = data.load_data(data.DEFAULT_DATA, 64, 4, 0, 1)
    assert d.val_path == data.DEFAULT_VAL_DATA and len(d.train) == 20_420_899 and len(d.val) == 1_836_303
    train_sha, val_sha = ("b80a9a9a0f4e15b358ce7f36d47c946cd30031514d2edc2a371ffa10c904b8e4",
                          "4951876876cd0ce0119d295fd8175de1cf35af5cf885265dd2b50491524900e5")
    assert d.sha256 == hashlib.sha256(f"{train_sha}:{val_sha}".encode()).hexdigest()  # of both texts' sha256
    # SOURCES.md and the manifest describe exactly these files: sizes, sha256, every document
    sources = (data.DATA_DIR / "SOURCES.md").read_text(encoding="utf-8")
    assert f"| 20,420,899 | 157 (33 novels + 124 addresses) | `{train_sha}` |" in sources
    assert f"| 1,836,303 | 16 (3 novels + 13 addresses) | `{val_sha}` |" in sources
    rows = [line.split("\t") for line in
            (data.DATA_DIR / "realtext_small_manifest.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    for split, text in (("train", d.train), ("val", d.val)):
        docs = [r for r in rows if r[0] == split]
        assert int(docs[-1][1]) + int(docs[-1][2]) + 1 == len(text)  # the last document ends the file
        for r in docs:
            assert (f"| {r[4]} |" if r[3] != "SOTU" else f"{r[7]} ({r[5]})") in sources, r
        r = docs[len(docs) // 2]  # a document's bytes are where the manifest says
        assert bytes(text[int(r[1]):int(r[1]) + int(r[2])]).decode("utf-8").strip()
        assert text[int(r[1]) - 3:int(r[1])].tobytes() == b"\n\n\n"


def test_train_on_a_token_directory_resumes_and_refuses_another_tokenizer(tmp_path, corpus, capsys):
    import train_gpt

    run = lambda *a: train_gpt.main([*TINY, *map(str, a)])
    data = corpus["out"]
    flags = ["--data", data, "--steps", 4, "--eval-every", 2, "--ckpt-every", 2]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(*flags, "--out", a) == 0
    summary = json.loads((a / "summary.json").read_text())
    index = json.loads((data / "index.json").read_text())
    assert summary["config"]["tokenizer_sha256"] == index["tokenizer"]["sha256"]
    assert summary["config"]["vocab_size"] == 300 and np.isfinite(summary["final_val_loss"])
    assert run(*flags, "--out", b, "--stop-at", 2) == 0
    assert run(*flags, "--out", b, "--resume") == 0  # the data stream continues exactly
    hist = lambda o: [json.loads(line) for line in (o / "metrics.jsonl").read_text().splitlines()]
    assert hist(a) == hist(b)
    capsys.readouterr()
    # another tokenizer (the byte text of the same corpus) -> one clear line, exit 2, nothing written
    other = tmp_path / "other"
    assert prepare_data.main(["--data", corpus["dir"] / "a.txt", "--out", other, "--vocab-size", 280, "--quiet"]) == 0
    files = lambda o: {p: p.read_bytes() for p in sorted(o.rglob("*")) if p.is_file()}
    before = files(b)
    assert run("--data", other, "--steps", 6, "--out", b, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained on the tokenizer with sha256" in err, err
    assert run("--data", corpus["dir"] / "a.txt", "--steps", 6, "--out", b, "--resume") == 2
    err = capsys.readouterr().err
    assert "but --data" in err and "gives bytes of a text file (vocabulary 256)" in err, err
    assert files(b) == before
    # a directory without index.json
    assert run("--data", tmp_path, "--out", tmp_path / "c") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "without index.json" in err and "prepare_data.py" in err, err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("case, message", [
    ("vocab", "a vocabulary of 70000 tokens does not fit its uint16 shards (at most 65536)"),
    ("tokenizer", "tokenizer.json is not the tokenizer its shards were made with"),
    ("shard", "train.bin is missing or not"),
])
def test_token_dir_that_does_not_fit_its_index(tmp_path, corpus, capsys, case, message):
    """A data directory whose parts do not belong together (edited by hand, or files copied from
    another tokenizer's directory) -> one line, exit 2, nothing written."""
    import shutil

    import train_gpt

    d = tmp_path / "d"
    shutil.copytree(corpus["out"], d)
    index = json.loads((d / "index.json").read_text())
    if case == "vocab":
        index["vocab_size"] = 70000
        (d / "index.json").write_text(json.dumps(index))
    elif case == "tokenizer":  # another tokenizer's file, the index of these shards
        other = json.loads((d / "tokenizer.json").read_text())
        other["model"]["vocab"]["zzzz"] = 299
        (d / "tokenizer.json").write_text(json.dumps(other))
    else:
        with open(d / "train.bin", "ab") as f:
            f.write(b"\0\0")
    with pytest.raises(data.CLIError, match=re.escape(message)):
        data.load_data(d, 32, 8, 0, 1)
    assert train_gpt.main([*TINY, "--data", d, "--out", tmp_path / "run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_resume_on_another_process_count_continues_the_stream(corpus):
    """A run stopped at step 3 on one process and resumed on 2 or 4 (a fresh loader each, as after a
    restart) reads exactly the rows the one-process run would have read from step 3 on."""
    out = corpus["out"]
    one = data.TokenData(out, 32, 8, 5, 1, process_index=0, process_count=1, prefetch=0)
    want = [one.batch(t) for t in range(8)]
    for n in (2, 4):
        parts = [data.TokenData(out, 32, 8, 5, 1, process_index=p, process_count=n) for p in range(n)]
        for t in range(3, 8):
            assert np.array_equal(np.concatenate([p.local_batch(t) for p in parts]), want[t])
        for p in parts:
            p.close()


def test_prefetch_reads_ahead_while_the_step_runs(corpus):
    """The batches after the first are read by the prefetch thread, ahead of the train loop (while its
    step runs): batch ``t + depth`` is read before the loop asks for batch ``t + 1``."""
    import threading
    import time

    reads = []  # (step, the thread that read it), in order

    class Recorded(data.TokenData):
        def _read_batch(self, step):
            reads.append((step, threading.current_thread().name))
            return super()._read_batch(step)

    d = Recorded(corpus["out"], 32, 8, 0, 1, process_index=0, process_count=1, prefetch=3)
    ref = data.TokenData(corpus["out"], 32, 8, 0, 1, process_index=0, process_count=1, prefetch=0)
    main = threading.current_thread().name
    for step in range(6):
        got = d.batch(step)
        assert np.array_equal(got, ref.batch(step))
        deadline = time.time() + 10
        while max(s for s, _ in reads) < step + 4 and time.time() < deadline:  # the "step": the thread reads on
            time.sleep(0.01)
        ahead = max(s for s, _ in reads)
        assert ahead == step + 4, (step, reads)  # the queue of 3 and the one the thread holds, no further
    assert reads[0] == (0, main) and all(name == "TokenData-prefetch" for _, name in reads[1:]), reads
    assert [s for s, _ in reads] == list(range(len(reads)))  # each step read once, in order
    n = len(reads)
    d.batch(2)  # a jump back (a resume): read now, the thread restarts from there
    assert reads[n] == (2, main) and all(name == "TokenData-prefetch" for _, name in reads[n + 1:])
    thread = d._prefetch.thread
    d.close()
    assert not thread.is_alive()


_BEYOND_MEMORY = r"""
import resource, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
try:  # the limit holds: the process cannot allocate a shard's worth
    np.ones(limit // 8 + 1)
    print("RLIMIT_DATA has no effect here")
    sys.exit(3)
except MemoryError:
    pass
import data
d = data.TokenData(sys.argv[1], 1024, 16, 0, 2, process_index=0, process_count=1)
assert isinstance(d.train, np.memmap) and d.train.nbytes > 4 * limit
for t in range(40):
    b = d.batch(t)
    assert b.shape == (16, 1025)
starts = d.starts(39)
assert starts.max() > limit  # windows from beyond what could be held in memory
d.final_val_batches(10**6)
d.close()
print("ok", len(d.train))
"""


def test_shards_larger_than_memory(tmp_path, corpus):
    """Training reads windows of the memmap: a train shard 4x larger than the memory the process may
    allocate (RLIMIT_DATA; the shard is a sparse file, so the disk holds none of it) trains."""
    import shutil
    import subprocess

    d = tmp_path / "big"
    shutil.copytree(corpus["out"], d)
    limit = 512 << 20
    n_tokens = 4 * limit // 2 + 12345  # uint16
    with open(d / "train.bin", "r+b") as f:
        f.truncate(n_tokens * 2)
    if (d / "train.bin").stat().st_blocks * 512 > 64 << 20:
        pytest.skip("the file system does not keep sparse files")
    index = json.loads((d / "index.json").read_text())
    index["train"]["tokens"] = n_tokens
    (d / "index.json").write_text(json.dumps(index))
    r = subprocess.run([sys.executable, "-c", _BEYOND_MEMORY, str(d), str(ROOT / "examples"), str(limit)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.split() == ["ok", str(n_tokens)], r.stdout + r.stderr
