"""Build the bundled corpus ``realtext_small_{train,val}.txt.xz`` from the full realtext corpus.

Whole documents of ``realtext_train.txt`` / ``realtext_val.txt`` (public domain: 19th/early-20th
century British novels from ELTeC-eng and US State of the Union addresses; sources and licences in
``SOURCES.md`` beside this file), split by document as the full corpus is:

* train: the documents of ``realtext_train.txt`` in the file's order (already interleaved by
  ``sha256("order:" + id)``) until they hold >= ``TRAIN_BYTES``;
* val: every validation document of the full corpus (``realtext_val.txt`` as it is: about 9% of
  train).

Documents are joined as in the full corpus (two blank lines between them, one ``\\n`` at the end)
and compressed with xz (preset 9e). The manifest of the documents taken (with their byte offsets in
the decompressed files) is ``realtext_small_manifest.tsv``; the parts of ``SOURCES.md`` between its
``<!-- make_realtext_small.py: ... -->`` markers (the files' sizes and sha256, the documents) are
written from it. Deterministic::

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
TRAIN_BYTES = 20_000_000
SEP = b"\n\n\n"
SOURCES = "SOURCES.md"


def build(src: Path) -> dict[str, bytes]:
    rows = list(csv.DictReader(open(src / "realtext_manifest.tsv", encoding="utf-8"), delimiter="\t"))
    full = {s: (src / f"realtext_{s}.txt").read_bytes() for s in ("train", "val")}
    taken = {"train": [], "val": []}
    size = 0
    for r in rows:
        if r["split"] == "train" and size < TRAIN_BYTES:
            taken["train"].append(r)
            size += int(r["nbytes"])
        elif r["split"] == "val":
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
    out[SOURCES] = sources_md((HERE / SOURCES).read_text(encoding="utf-8"), out, taken).encode("utf-8")
    return out


def _between(text: str, name: str, body: str) -> str:
    """``text`` with the lines between ``<!-- make_realtext_small.py: NAME -->`` and
    ``<!-- make_realtext_small.py: end NAME -->`` replaced by ``body``."""
    begin, end = f"<!-- make_realtext_small.py: {name} -->\n", f"<!-- make_realtext_small.py: end {name} -->"
    i, j = text.index(begin) + len(begin), text.index(end)
    return text[:i] + body + text[j:]


def sources_md(text: str, out: dict[str, bytes], taken: dict[str, list[dict]]) -> str:
    """``SOURCES.md`` (its current ``text``) with the generated parts written from ``out`` / ``taken``."""
    rows = []
    for split, docs in taken.items():
        data = out[f"realtext_small_{split}.txt"]
        novels = sum(r["source"] != "SOTU" for r in docs)
        rows.append(f"| `realtext_small_{split}.txt.xz` | {len(data):,} | {len(docs)} ({novels} novels + "
                    f"{len(docs) - novels} addresses) | `{hashlib.sha256(data).hexdigest()}` |\n")
    text = _between(text, "files", "| file | bytes (decompressed) | documents | sha256 (decompressed) |\n"
                    "|---|---:|---:|---|\n" + "".join(rows))
    parts = []
    for split, name in (("train", "Train"), ("val", "Validation")):
        parts += [f"{name} novels (ELTeC-eng):\n\n", "| id | author | title | first published | author died |\n",
                  "|---|---|---|---:|---:|\n"]
        parts += [f"| {r['id']} | {r['author']} | {r['title']} | {r['year']} | {r['author_death']} |\n"
                  for r in taken[split] if r["source"] != "SOTU"]
        parts.append("\n")
    for split, name in (("train", "Train addresses (SOTU, year and president)"), ("val", "Validation addresses (SOTU)")):
        parts.append(f"{name}: " + "; ".join(f"{r['year']} ({r['author']})" for r in taken[split]
                                              if r["source"] == "SOTU") + ".\n\n")
    return _between(text, "documents", "".join(parts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("/work/shared/data"),
                    help="directory of realtext_{train,val}.txt and realtext_manifest.tsv")
    ap.add_argument("--check", action="store_true", help="compare with the files here instead of writing")
    a = ap.parse_args()
    bad = 0
    built = build(a.src)
    for name, data in built.items():
        path = HERE / (name + ".xz" if name.endswith(".txt") else name)
        if not a.check and name == SOURCES:  # after the files it describes
            continue
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
    if not a.check:
        (HERE / SOURCES).write_bytes(built[SOURCES])
        print(f"{SOURCES}: its generated parts written")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
