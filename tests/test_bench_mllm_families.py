"""benchmarks/bench_mllm_families.py --quick: the table runs (tiny test widths; real widths are measured by hand)
and the real-width table widens a config to a model that loads."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_mllm_families  # noqa: E402


def test_quick_table_runs(capsys):
    rows = bench_mllm_families.main(["--quick", "--families", "internvl", "--questions", "2", "--repeats", "1"])
    assert [r["family"] for r in rows] == ["internvl"] and rows[0]["batch1"] > 0 and rows[0]["batch8"] > 0
    assert "| internvl | tiny (" in capsys.readouterr().out


def test_bench_hf_families_rows(capsys):
    """`bench_hf.py --families NAME`: the per-family rows, other flags passed on; no names = every family."""
    import bench_hf
    assert bench_hf.main(["--families", "internvl", "--device", "cpu", "--repeats", "1", "--quick",
                          "--questions", "2"]) == 0
    out = capsys.readouterr().out
    assert "| internvl | tiny (" in out and "questions=2 repeats=1" in out


def test_every_family_has_real_widths():
    from helpers_vlm_families import FAMILIES
    assert set(bench_mllm_families.REAL) == set(FAMILIES)
