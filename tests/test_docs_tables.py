"""The tables of the README and docs/ are what benchmarks/make_docs_tables.py makes from the result JSONs."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import make_docs_tables as mdt  # noqa: E402


@pytest.mark.parametrize("doc", mdt.DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_doc_tables_match_their_json(doc):
    text = doc.read_text()
    assert mdt.render(text) == text, (
        f"{doc.relative_to(ROOT)}: a table differs from its result JSON; run python benchmarks/make_docs_tables.py")


def test_every_table_is_used_and_filled():
    used = {m.group(2) for doc in mdt.DOCS for m in mdt.MARKER.finditer(doc.read_text())}
    assert used == set(mdt.TABLES), set(mdt.TABLES) ^ used
    for doc in mdt.DOCS:
        for m in mdt.MARKER.finditer(doc.read_text()):
            assert m.group(3).count("\n|") >= 2, f"{doc.name}: table {m.group(2)} is empty"


def test_check_fails_when_a_json_changes(tmp_path, monkeypatch):
    """A changed result moves the generated table: --check reports the doc, a rewrite fixes it."""
    results = tmp_path / "results"
    shutil.copytree(mdt.RESULTS, results, ignore=shutil.ignore_patterns("*.png", "quality_*"))
    for name in (*mdt.QUALITY, mdt.FP8_QUALITY, mdt.QUALITY_BPE):  # the quality files the tables read
        shutil.copy(mdt.RESULTS / name, results / name)
    data = json.loads((results / "spmm.json").read_text())
    data["records"][0]["best_speedup"] = 9.99
    (results / "spmm.json").write_text(json.dumps(data))
    doc = tmp_path / "performance.md"
    doc.write_text((ROOT / "docs" / "performance.md").read_text())
    monkeypatch.setattr(mdt, "RESULTS", results)
    monkeypatch.setattr(mdt, "DOCS", [doc])
    assert mdt.main(["--check"]) == 1
    assert "9.99×" not in doc.read_text()
    assert mdt.main([]) == 0 and "9.99×" in doc.read_text()
    assert mdt.main(["--check"]) == 0


def test_unknown_table_is_an_error():
    with pytest.raises(KeyError, match="unknown table 'nope'"):
        mdt.render("<!-- table:nope -->\n<!-- /table -->")


def test_headline_commands_drop_only_output_flags():
    cmd = mdt.command(mdt.NODE_7B)
    assert cmd.startswith("python benchmarks/bench_train_gpt.py ") and "--size llama-7b" in cmd
    assert "--out" not in cmd and "--tag" not in cmd and "--compile-workers" not in cmd


def test_a_flag_given_twice_keeps_its_last_value(monkeypatch):
    """gpu_check.sh passes its defaults, then the caller's flags: argparse reads the last, so does the table."""
    monkeypatch.setattr(mdt, "load", lambda name: {"command": "python b.py --iters 5 --out o --remat full --iters 4 --quiet"})
    assert mdt.command("x.json") == "python b.py --remat full --iters 4 --quiet"


@pytest.mark.parametrize("name", sorted({f for _, f, _ in mdt.HEADLINE} | set(mdt.NODE)))
def test_reproduce_commands_are_the_recorded_ones(name):
    """The README's command of a result is the one in its JSON, flag for flag (e.g. ``--park``, ``--remat``),
    less only the output flags of ``_DROP``."""
    def flags(cmd: str) -> dict[str, str]:
        words = shlex.split(cmd)
        return {w: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "")
                for i, w in enumerate(words) if w.startswith("--")}

    recorded = {k: v for k, v in flags(mdt.load(name)["command"]).items() if k not in mdt._DROP}
    assert flags(mdt.command(name)) == recorded
    if name in {f for _, f, _ in mdt.HEADLINE}:
        assert f"`{mdt.command(name)}`" in (ROOT / "README.md").read_text()


def test_headline_row_of_the_same_run_refers_to_the_row_above():
    lines = mdt.table_headline().splitlines()[2:]
    for (_, f, _), (_, prev, _), line in zip(mdt.HEADLINE[1:], mdt.HEADLINE, lines[1:]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        if f == prev:
            assert cells[2:] == ["same run", "same run"], line
        else:
            assert cells[2] == f"`{mdt.command(f)}`" and f[:-5] in cells[3], line


def test_node_table_has_every_variant_with_its_compile_time():
    text = mdt.table_node()
    for name in mdt.NODE:
        for r in mdt._throughput(name)["rows"]:
            assert f"| {r['variant']} | {r['tokens_per_s']:,.0f} |" in text
            assert f"| {r['compile_s']:.1f} |" in text
