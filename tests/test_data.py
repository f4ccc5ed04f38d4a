"""Tests for examples/prepare_data.py and the token loader examples/gpt_tokens.py (CPU, small text)."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import gpt_data  # noqa: E402
import gpt_tokens  # noqa: E402
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


@pytest.mark.parametrize("case, message", [
    ("latin1", "is not UTF-8 text (byte 7"),
    ("empty", "the file is empty"),
    ("uint16", "does not fit --dtype uint16"),
    ("exists", "exists: pass --overwrite"),
    ("missing", "no such file"),
])
def test_prepare_data_bad_input(tmp_path, capsys, case, message):
    f = tmp_path / "t.txt"
    f.write_bytes({"latin1": "abc\ncaf\xe9\n".encode("latin1"), "empty": b""}.get(case, b"hello world\n" * 50))
    out = tmp_path / "out"
    args = ["--data", f if case != "missing" else tmp_path / "nope.txt", "--out", out, "--quiet"]
    if case == "uint16":
        args += ["--vocab-size", 70000, "--dtype", "uint16"]
    if case == "exists":
        out.mkdir()
        (out / "keep").write_text("x")
    assert prepare_data.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out", "t.txt"] if case == "exists" else ["t.txt"])


def test_loader_is_a_function_of_seed_and_step_and_process_rows(corpus):
    out = corpus["out"]
    a = gpt_tokens.TokenData(out, 32, 8, 3, 2, process_index=0, process_count=1)
    b = gpt_tokens.TokenData(out, 32, 8, 3, 2, process_index=0, process_count=1, prefetch=0)
    seq = [a.batch(t) for t in range(6)]  # prefetched stream
    assert all(np.array_equal(seq[t], b.batch(t)) for t in range(6))
    assert np.array_equal(a.batch(2), seq[2]) and np.array_equal(a.batch(3), seq[3])  # a jump back (resume)
    assert seq[0].shape == (8, 33) and seq[0].dtype == np.int32 and not np.array_equal(seq[0], seq[1])
    assert not np.array_equal(seq[0], gpt_tokens.TokenData(out, 32, 8, 4, 2, 0, 1, prefetch=0).batch(0))
    train = np.memmap(out / "train.bin", dtype=np.uint16, mode="r")
    s = a.starts(4)
    assert np.array_equal(seq[4][5], train[s[5]:s[5] + 33])
    # two processes: each reads its rows; together they are the one-process batch (the other rows zero)
    parts = [gpt_tokens.TokenData(out, 32, 8, 3, 2, process_index=p, process_count=2) for p in (0, 1)]
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

    d = gpt_tokens.TokenData(corpus["out"], 32, 8, 0, 1, process_index=0, process_count=1)
    whole = d.batch(7)
    d.use_sharding(Fake())
    got = d.batch(7)
    assert np.array_equal(got[[2, 3, 6, 7]], whole[[2, 3, 6, 7]]) and not got[[0, 1, 4, 5]].any()
    d.use_sharding(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    assert np.array_equal(d.batch(7), whole)
    d.close()


def test_load_data_errors(tmp_path, corpus):
    with pytest.raises(gpt_data.CLIError, match="without index.json: make a data directory with"):
        gpt_data.load_data(tmp_path, 32, 8, 0, 1)
    with pytest.raises(gpt_data.CLIError, match="its own validation split"):
        gpt_data.load_data(corpus["out"], 32, 8, 0, 1, val_path=corpus["dir"] / "a.txt")
    with pytest.raises(gpt_data.CLIError, match="too few for --seq-len"):
        gpt_data.load_data(corpus["out"], 100000, 8, 0, 1)


def test_default_corpus_is_the_bundled_real_text():
    d = gpt_data.load_data(gpt_data.DEFAULT_DATA, 64, 4, 0, 1)
    assert d.val_path == gpt_data.DEFAULT_VAL_DATA and len(d.train) > 10_000_000 and len(d.val) > 1_000_000
    assert d.sha256 == hashlib.sha256((  # of both decompressed texts' sha256 (examples/data/SOURCES.md)
        "5b406262391f4baa106c30bbae8ea0e812e207e28f670ef34c6d9f42bb5f370b:"
        "6ca48436ae88735e3dc037b004ba88970ddb4722804502f82209785d677cb134").encode()).hexdigest()
    assert (gpt_data.DATA_DIR / "SOURCES.md").stat().st_size > 1000


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
    # another tokenizer (the byte text of the same corpus) -> one clear line, exit 2
    other = tmp_path / "other"
    assert prepare_data.main(["--data", corpus["dir"] / "a.txt", "--out", other, "--vocab-size", 280, "--quiet"]) == 0
    assert run("--data", other, "--steps", 6, "--out", b, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained on the tokenizer with sha256" in err, err
    assert run("--data", corpus["dir"] / "a.txt", "--steps", 6, "--out", b, "--resume") == 2
    err = capsys.readouterr().err
    assert "but --data" in err and "gives bytes of a text file (vocabulary 256)" in err, err
    # a directory without index.json
    assert run("--data", tmp_path, "--out", tmp_path / "c") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "without index.json" in err and "prepare_data.py" in err, err
