"""Damaged CVQA shards end in one error line that names the broken shard (a user of the multi-shard release
must know which file to download again), never in pyarrow's traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers_cvqa import write_release

from volta_ml.cvqa.data import CVQAFormatError, load_cvqa

REPO = Path(__file__).resolve().parents[1]


def shards(data: Path) -> list[Path]:
    return sorted(data.glob("*.parquet"))


def damage_pages(shard: Path, column: str) -> None:
    """Overwrite one column chunk (page headers and pages) and keep the footer valid."""
    chunk = next(c for rg in [pq.ParquetFile(shard).metadata.row_group(0)]
                 for c in (rg.column(i) for i in range(rg.num_columns)) if c.path_in_schema == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    raw = bytearray(shard.read_bytes())
    raw[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    shard.write_bytes(bytes(raw))
    assert pq.ParquetFile(shard).metadata.num_rows > 0        # the footer still reads: only the pages are bad


@pytest.mark.parametrize("column", ["ID", "Translated Options.list.element", "image.bytes"])
def test_damaged_data_pages_behind_a_valid_footer_name_the_shard(tmp_path, column):
    data = write_release(tmp_path)
    broken = shards(data)[1]
    damage_pages(broken, column)
    with pytest.raises(CVQAFormatError) as err:
        load_cvqa(data)
    message = str(err.value)
    assert message.startswith(f"{broken}: damaged parquet shard (OSError") and "\n" not in message
    assert shards(data)[0].name not in message


@pytest.mark.parametrize("damage", ["truncated", "footer", "not parquet"])
def test_other_corrupt_shards_name_the_shard(tmp_path, damage):
    data = write_release(tmp_path)
    broken = shards(data)[0]
    raw = broken.read_bytes()
    broken.write_bytes({"truncated": raw[: len(raw) // 2], "not parquet": b"<html>503</html>" * 4,
                        "footer": raw[:-300] + b"\x00" * 292 + raw[-8:]}[damage])
    with pytest.raises(CVQAFormatError, match=rf"^{broken}: damaged parquet shard \(Arrow"):
        load_cvqa(data)


def test_a_shard_damaged_after_loading_is_named_while_streaming_images(tmp_path):
    data = write_release(tmp_path)
    dataset = load_cvqa(data)
    damage_pages(shards(data)[0], "image.bytes")
    with pytest.raises(CVQAFormatError, match=rf"^{shards(data)[0]}: damaged parquet shard"):
        list(dataset.iter_images())


def test_the_command_prints_one_line_and_exits_2(tmp_path):
    data = write_release(tmp_path)
    damage_pages(shards(data)[1], "Question")
    weights = tmp_path / "detector.pth"
    weights.write_bytes(b"unused")
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", "extract", "--data", str(data),
                           "--preset", "volta-butd36", "--weights", str(weights), "--out", str(tmp_path / "f")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"volta-ml cvqa: error: {shards(data)[1]}: damaged parquet")
