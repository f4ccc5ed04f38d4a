"""One report of the GPU suite run in parts: adds up the JUnit files of `gpu_check.sh test` runs with
TEST_SHARD=I/N (logs/gpu_tests_shard<I>of<N>.xml, one device call each) or of one whole run (gpu_tests.xml).

    python scripts/gpu_test_report.py out1/logs/gpu_tests_shard1of3.xml out2/logs/... [--md report.md]

Prints totals (passed, failed, errors, skipped), every failure with its message, the skips grouped by reason,
and which parts are missing when the files are parts of an N-way split; exits 1 on a failure, an error or a
missing part.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PART = re.compile(r"shard(\d+)of(\d+)")


def read_cases(path: Path) -> list[dict]:
    """Every ``<testcase>`` of a JUnit file: ``{"id", "outcome", "message", "seconds"}``."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
                break
        cases.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "message": message,
                      "seconds": float(case.get("time") or 0.0)})
    return cases


def missing_parts(paths: list[Path]) -> list[str]:
    """The parts ``I/N`` of a split that no file covers (empty when the files are no split or a whole one)."""
    parts = [tuple(map(int, m.groups())) for p in paths if (m := PART.search(p.name))]
    if not parts:
        return []
    counts = {n for _, n in parts}
    if len(counts) > 1:
        return [f"files of different splits: {sorted(counts)} parts"]
    n = counts.pop()
    return [f"{i}/{n}" for i in range(1, n + 1) if (i, n) not in set(parts)]


def report(paths: list[Path]) -> tuple[str, bool]:
    """The report's markdown and whether the suite is green (no failure, no error, no missing part)."""
    cases = [c for p in paths for c in read_cases(p)]
    counts = collections.Counter(c["outcome"] for c in cases)
    seconds = sum(c["seconds"] for c in cases)
    gaps = missing_parts(paths)
    lines = [f"# GPU suite: {len(paths)} file(s), {len(cases)} tests, {seconds:.0f} s of test time", "",
             " · ".join(f"{k} {counts.get(k, 0)}" for k in ("passed", "failed", "error", "skipped")), ""]
    if gaps:
        lines += [f"**Missing parts:** {', '.join(gaps)}", ""]
    bad = [c for c in cases if c["outcome"] in ("failed", "error")]
    if bad:
        lines += ["## Failures", ""] + [f"- `{c['id']}` ({c['outcome']}): {c['message']}" for c in bad] + [""]
    skips = collections.Counter(c["message"] for c in cases if c["outcome"] == "skipped")
    if skips:
        lines += ["## Skips by reason", ""] + [f"- {n} × {reason or '(no reason)'}" for reason, n in skips.most_common()]
    return "\n".join(lines) + "\n", not bad and not gaps and bool(cases)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="JUnit XML files of gpu_check.sh test runs")
    ap.add_argument("--md", type=Path, default=None, help="also write the report here")
    a = ap.parse_args(argv)
    absent = [str(p) for p in a.files if not p.is_file()]
    if absent:
        ap.error(f"no such file: {', '.join(absent)}")
    text, green = report(a.files)
    print(text, end="")
    if a.md:
        a.md.write_text(text)
    return 0 if green else 1


if __name__ == "__main__":
    sys.exit(main())
