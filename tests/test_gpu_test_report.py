"""The GPU suite in parts: tests/conftest.py's ``--shard I/N`` and scripts/gpu_test_report.py, which adds the
parts' JUnit files up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import parse_shard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_test_report  # noqa: E402


def _collected(*args: str) -> list[str]:
    """The node ids pytest collects from this file with ``args``."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          str(Path(__file__)), *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_parts_are_disjoint_and_add_up_to_the_whole():
    n = 3
    whole = _collected()
    parts = [_collected("--shard", f"{i}/{n}") for i in range(1, n + 1)]
    assert len(whole) >= 3  # this file has enough tests to split three ways
    assert sorted(sum(parts, [])) == sorted(whole)
    assert all(parts), parts  # round-robin: no part is empty while there are at least N tests


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_a_bad_shard_is_refused_with_the_constraint(text):
    with pytest.raises(ValueError, match="1 <= I <= N"):
        parse_shard(text)


def test_parse_shard():
    assert parse_shard("2/3") == (2, 3)


def _junit(path: Path, cases: list[tuple[str, str, str]]) -> Path:
    body = []
    for name, outcome, message in cases:
        inner = {"passed": "", "failed": f'<failure message="{message}"/>', "error": f'<error message="{message}"/>',
                 "skipped": f'<skipped message="{message}"/>'}[outcome]
        body.append(f'<testcase classname="tests.test_x" name="{name}" time="1.5">{inner}</testcase>')
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>')
    return path


def test_report_adds_the_parts_up(tmp_path):
    a = _junit(tmp_path / "gpu_tests_shard1of2.xml", [("t1", "passed", ""), ("t2", "skipped", "needs 2 GPUs")])
    b = _junit(tmp_path / "gpu_tests_shard2of2.xml", [("t3", "passed", ""), ("t4", "skipped", "needs 2 GPUs")])
    text, green = gpu_test_report.report([a, b])
    assert green
    assert "passed 2 · failed 0 · error 0 · skipped 2" in text
    assert "2 × needs 2 GPUs" in text


def test_report_is_red_on_a_failure_or_a_missing_part(tmp_path):
    a = _junit(tmp_path / "gpu_tests_shard1of3.xml", [("t1", "passed", "")])
    b = _junit(tmp_path / "gpu_tests_shard3of3.xml", [("t2", "failed", "mismatch at 3")])
    text, green = gpu_test_report.report([a, b])
    assert not green
    assert "Missing parts:** 2/3" in text
    assert "`tests.test_x::t2` (failed): mismatch at 3" in text
    assert gpu_test_report.main([str(a), str(b)]) == 1
    whole = _junit(tmp_path / "gpu_tests.xml", [("t1", "passed", "")])
    assert gpu_test_report.main([str(whole)]) == 0
