"""benchmarks/bench_model.py: the phase split, the per-tensor reference AdamW row and the matmul floor, on a
tiny dual-stream model (the real base configs are measured by hand, never in the suite)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_model  # noqa: E402
import bench_retrieval  # noqa: E402


def test_the_table_has_every_phase_and_a_floor_below_the_step(tmp_path, capsys):
    config = tmp_path / "tiny_lxmert.json"
    config.write_text(json.dumps({**bench_retrieval.make_config("ctrl_lxmert", "tiny").to_dict(), "vocab_size": 500}))
    rows = bench_model.main(["--configs", str(config), "--precisions", "fp32", "--device", "cpu", "--batch", "2",
                             "--steps", "1", "--warmup", "0", "--threads", "1", "--json", str(tmp_path / "rows.json")])
    (row,) = rows
    assert all(row[k] > 0 for k in ("forward_s", "backward_s", "optimizer_s", "reference_optimizer_s"))
    assert row["step_s"] == row["forward_s"] + row["backward_s"] + row["optimizer_s"]
    # the floor: forward + backward matmul FLOPs of the batch at this CPU's GEMM rate, below the whole step
    assert row["matmul_gflop_per_step"] == bench_model.flops_per_sample(str(config)) * 2 / 1e9 > 0
    assert 0 < row["matmul_floor_s"] < row["step_s"]
    out = capsys.readouterr().out
    assert "ref AdamW" in out and "floor s" in out and "GFLOP/s" in out
    assert json.loads((tmp_path / "rows.json").read_text())[0]["matmul_floor_s"] == row["matmul_floor_s"]
