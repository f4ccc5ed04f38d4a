"""Build the bundled corpus ``realtext_small_{train,val}.txt.xz`` from the full realtext corpus.

Whole documents of ``realtext_train.txt`` / ``realtext_val.txt`` (public domain: 19th/early-20th
century British novels from ELTeC-eng and US State of the Union addresses; sources and licences in
``SOURCES.md`` beside this file), split by document as the full corpus is:

* train: the documents of ``realtext_train.txt`` in the file's order (already interleaved by
  ``sha256("order:" + id)``) until they hold >= ``TRAIN_BYTES``;
* val: every validation document of the full corpus except the longest novel (Craik's *Mistress and
  Maid*, 621 KB), so that val stays about 10% of train.

Documents are joined as in the full corpus (two blank lines between them, one ``\\n`` at the end)
and compressed with xz (preset 9e). The manifest of the documents taken (with their byte offsets in
the decompressed files) is ``realtext_small_manifest.tsv``. Deterministic::

    python examples/data/make_realtext_small.py --src /work/shared/data          # rewrite
    python examples/data/make_realtext_small.py --src /work/shared/data --check  # exit 1 if different
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import lzma
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_BYTES = 10_000_000
VAL_SKIP = ("ENG18630_Craik",)  # the longest validation novel: val ~10% of train without it
SEP = b"\n\n\n"


def build(src: Path) -> dict[str, bytes]:
    rows = list(csv.DictReader(open(src / "realtext_manifest.tsv", encoding="utf-8"), delimiter="\t"))
    full = {s: (src / f"realtext_{s}.txt").read_bytes() for s in ("train", "val")}
    taken = {"train": [], "val": []}
    size = 0
    for r in rows:
        if r["split"] == "train" and size < TRAIN_BYTES:
            taken["train"].append(r)
            size += int(r["nbytes"])
        elif r["split"] == "val" and r["id"] not in VAL_SKIP:
            taken["val"].append(r)
    out, manifest = {}, []
    for split, docs in taken.items():
        parts, off = [], 0
        for r in docs:
            o, n = int(r["offset"]), int(r["nbytes"])
            parts.append(full[split][o:o + n])
            manifest.append({**r, "offset": str(off), "nbytes": str(n)})
            off += n + len(SEP)
        out[f"realtext_small_{split}.txt"] = SEP.join(parts) + b"\n"
    fields = list(rows[0].keys())
    lines = ["\t".join(fields)] + ["\t".join(m[f] for f in fields) for m in manifest]
    out["realtext_small_manifest.tsv"] = ("\n".join(lines) + "\n").encode("utf-8")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("/work/shared/data"),
                    help="directory of realtext_{train,val}.txt and realtext_manifest.tsv")
    ap.add_argument("--check", action="store_true", help="compare with the files here instead of writing")
    a = ap.parse_args()
    bad = 0
    for name, data in build(a.src).items():
        path = HERE / (name + ".xz" if name.endswith(".txt") else name)
        if a.check:
            have = path.read_bytes() if path.exists() else b""
            have = lzma.decompress(have) if path.suffix == ".xz" and have else have
            ok = have == data
            bad += not ok
            print(f"{path.name}: {'ok' if ok else 'DIFFERS'}")
            continue
        blob = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME) if path.suffix == ".xz" else data
        path.write_bytes(blob)
        print(f"{path.name}: {len(data):,} bytes ({len(blob):,} written), sha256 {hashlib.sha256(data).hexdigest()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
