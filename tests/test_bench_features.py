"""benchmarks/bench_features.py: it runs end to end, and its "VOLTA reader*" returns what
RegionView returns (so the two sides of its comparison do the same work per sample)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_features as bench  # noqa: E402

from volta_ml.features import RegionView, open_store  # noqa: E402


@pytest.mark.parametrize("mode", ["first", "last"])
@pytest.mark.parametrize("num_locs", [5, 7])
def test_volta_scheme_reader_matches_region_view(tmp_path, mode, num_locs):
    for kind in ("native", "volta"):
        bench.build_store(kind, str(tmp_path / kind), 12, 6, 16)
    volta = bench.VoltaSchemeReader(str(tmp_path / "volta"), 16, num_locs, mode)
    view = RegionView(open_store(tmp_path / "native"), num_locs=num_locs, add_global_imgfeat=mode,
                      max_region_num=6)
    for i in range(12):
        image_id = str(1000000 + i)
        features, num_boxes, locations, _ = volta[image_id]
        sample = view[image_id]
        assert num_boxes == sample.num_boxes == 7
        np.testing.assert_allclose(sample.features.numpy(), features, rtol=1e-6)
        np.testing.assert_allclose(sample.image_loc.numpy(), locations, rtol=1e-6)


def test_benchmark_prints_every_reader_and_ratio(tmp_path, capsys):
    bench.main(["--images", "50", "--boxes", "4", "--dim", "16", "--reads", "20", "--passes", "1",
                "--repeat", "1", "--workers", "0", "--stores", "native", "volta", "volta64", "raw",
                "--workdir", str(tmp_path / "work")])
    out = capsys.readouterr().out
    for row in ("volta-ml native ", "volta-ml native + RegionView", "VOLTA reader* on VOLTA layout",
                "VOLTA reader* on VOLTA base64 layout", "raw limit", "raw floor",
                "native / VOLTA reader*", "native / raw limit", "every feature then summed"):
        assert row in out, row
    assert not (tmp_path / "work").exists()  # stores removed without --keep


def test_per_sample_benchmark_runs_every_path(tmp_path, capsys):
    import bench_samples
    table = bench_samples.main(["--images", "40", "--boxes", "4", "--dim", "16", "--repeat", "1",
                                "--workers", "0", "--batch-size", "8", "--workdir", str(tmp_path / "w")])
    assert set(table) == {"VOLTA reader* + padding", "RegionView[id]", "region_arrays (task datasets)",
                          "RegionView.read_into (reused buffer)",
                          "read_into batch slots (8)", "VOLTA reader* + padding + collate (8)",
                          "RegionView[id] + collate (8)"}
    assert all(row[0] > 0 for row in table.values())
    out = capsys.readouterr().out
    assert "read_into / VOLTA" in out and "region_arrays / VOLTA" in out
    assert not (tmp_path / "w").exists()


def test_volta_padding_of_the_per_sample_benchmark_matches_region_view(tmp_path):
    import bench_samples
    for kind in ("native", "volta"):
        bench.build_store(kind, str(tmp_path / kind), 6, 5, 16)
    volta = bench_samples.VoltaSamples(bench.VoltaSchemeReader(str(tmp_path / "volta"), 16, 7, "last"), 5, 7,
                                       "last", 16)
    view = RegionView(open_store(tmp_path / "native"), num_locs=7, add_global_imgfeat="last", max_region_num=5)
    for i in range(6):
        got, ref = view[str(1000000 + i)], volta[str(1000000 + i)]
        for a, b in zip(got[:3], ref):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
