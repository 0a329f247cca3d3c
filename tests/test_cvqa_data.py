"""Reading CVQA parquet shards of every revision shape."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from helpers_cvqa import REVISION, ROWS, image_png, write_release

from volta_ml.cvqa.data import (CVQAFormatError, image_key, load_cvqa, parse_options, parse_subset,
                                      revision_from_path)


def test_latest_revision_fields_and_revision_from_snapshot_path(tmp_path):
    data = load_cvqa(write_release(tmp_path, "latest"))
    assert data.revision == REVISION and [s.name for s in data.shards] == [
        "test-00000-of-00002.parquet", "test-00001-of-00002.parquet"]
    assert [q.id for q in data.questions] == [r[0] for r in ROWS]
    first = data.questions[0]
    assert (first.language, first.country, first.pair) == ("Telugu", "India", "India-Telugu")
    assert first.options_en == ("dosa", "idli", "vada", "upma") and first.label == 1
    assert data.questions[1].options[0] == "ఉదయం"        # stray leading space removed
    assert data.questions[3].pair == "Egypt-Egyptian_Arabic" and data.questions[3].image_type == "Self"
    assert not data.hidden_labels


def test_questions_on_one_photo_share_an_image_id_and_bytes_stream_once(tmp_path):
    data = load_cvqa(write_release(tmp_path, "latest"))
    assert data.image_ids == ["1001", "1002", "2001", "2002", "3001"]
    assert data.questions[0].image_id == data.questions[1].image_id == "1001"
    streamed = dict(data.iter_images())
    assert sorted(streamed) == data.image_ids
    assert streamed["3001"] == image_png("3001")          # the row lives in the second shard
    assert dict(data.iter_images(["2002"])) == {"2002": image_png("2002")}


def test_string_options_revision_without_image_type(tmp_path):
    data = load_cvqa(write_release(tmp_path, "strings"), revision="27dfc59")
    assert data.revision == "27dfc59"
    assert data.questions[5].options == ("Día de Muertos", "Navidad", "Carnaval", "Pascua")
    assert data.questions[5].options_en[0] == "day of the dead"
    assert {q.image_type for q in data.questions} == {"unknown"}


def test_hidden_labels_are_detected(tmp_path):
    data = load_cvqa(write_release(tmp_path, "hidden"))
    assert data.hidden_labels and data.revision == "unknown"


def test_subset_is_parsed_as_a_literal_never_evaluated():
    assert parse_subset("('Egyptian_Arabic', 'Egypt')", "x") == ("Egyptian_Arabic", "Egypt")
    with pytest.raises(CVQAFormatError, match="not a tuple literal"):
        parse_subset("__import__('os').system('echo pwned')", "shard.parquet row 3")
    with pytest.raises(CVQAFormatError, match="row 3.*pair of strings"):
        parse_subset("('Telugu', 'India', 'extra')", "shard.parquet row 3")


def test_options_errors_name_the_place():
    assert parse_options("['a', ' b', 'c', 'd']", "w", "Options") == ("a", "b", "c", "d")
    with pytest.raises(CVQAFormatError, match="f.parquet row 2: Options must hold 4 strings"):
        parse_options(["a", "b", "c"], "f.parquet row 2", "Options")
    with pytest.raises(CVQAFormatError, match="not a list literal"):
        parse_options("a / b / c / d", "f.parquet row 2", "Options")


def test_bad_label_and_missing_column_are_reported_with_file_and_row(tmp_path):
    folder = write_release(tmp_path, "hidden")
    table = pq.read_table(folder / "test-00000-of-00001.parquet")
    labels = table.column("Label").to_pylist()
    labels[2] = 7
    pq.write_table(table.set_column(table.schema.get_field_index("Label"), "Label", [labels]),
                   folder / "test-00000-of-00001.parquet")
    with pytest.raises(CVQAFormatError, match=r"test-00000-of-00001.parquet row 2 \(ID '1002_0'\): Label"):
        load_cvqa(folder)
    pq.write_table(table.drop(["Subset"]), folder / "test-00000-of-00001.parquet")
    with pytest.raises(CVQAFormatError, match=r"missing column\(s\) \['Subset'\]"):
        load_cvqa(folder)
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        load_cvqa(tmp_path / "nope")


def test_image_keys_and_conflicting_photos(tmp_path):
    assert image_key("5920942824275514756_0") == "5920942824275514756"
    assert image_key("weird-id") == "weird-id" and image_key("a_b") == "a_b"
    assert revision_from_path(tmp_path) is None
    # Two rows claiming the same photo id but carrying different pictures keep separate keys.
    folder = write_release(tmp_path, "hidden")
    path = folder / "test-00000-of-00001.parquet"
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    images[1] = {"bytes": image_png("1001", seed=1), "path": "other.png"}
    import pyarrow as pa
    column = pa.array(images, type=table.schema.field("image").type)
    pq.write_table(table.set_column(0, table.schema.field("image"), column), path)
    data = load_cvqa(folder)
    assert data.questions[0].image_id == "1001" and data.questions[1].image_id == "1001_1"
    assert dict(data.iter_images(["1001_1"]))["1001_1"] == image_png("1001", seed=1)


def test_empty_shards_are_an_error(tmp_path):
    from helpers_cvqa import _table

    (tmp_path / "empty").mkdir()
    pq.write_table(_table([]), tmp_path / "empty" / "test.parquet")
    with pytest.raises(CVQAFormatError, match="hold no questions"):
        load_cvqa(tmp_path / "empty")


def _hub_cache(tmp_path):
    """A Hugging Face cache (HF_HUB_CACHE) holding afaji/cvqa at REVISION, with refs/main pointing at it."""
    cache = tmp_path / "hub"
    repo = cache / "datasets--afaji--cvqa"
    write_release(repo, "latest")                    # repo/snapshots/<REVISION>/data/*.parquet
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return cache


def test_hub_id_is_read_from_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path)))
    folder = load_cvqa(write_release(tmp_path / "folder", "latest"))
    for revision in (REVISION, None):                # pinned, or the cached main
        data = load_cvqa("afaji/cvqa", revision=revision)
        assert data.revision == REVISION and data.questions == folder.questions
        assert dict(data.iter_images()) == dict(folder.iter_images())
    with pytest.raises(FileNotFoundError) as err:
        load_cvqa("afaji/cvqa", revision="0" * 40)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"CVQA data afaji/cvqa: no such folder, and no snapshot of "
                                                      f"revision {'0' * 40} of the hub dataset afaji/cvqa in the "
                                                      "local Hugging Face cache")
    assert "nothing is downloaded" in message and "hf download afaji/cvqa --repo-type dataset" in message
    with pytest.raises(FileNotFoundError, match="no snapshot of the hub dataset someone/other in the local Hugging Face cache"):
        load_cvqa("someone/other")


def test_the_command_reads_a_cached_hub_id(tmp_path):
    """`volta-ml cvqa score --data afaji/cvqa --revision <sha>` with HF_HUB_CACHE set, offline."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    predictions = tmp_path / "p.csv"
    predictions.write_text("ID,Prediction\n" + "".join(f"{r[0]},{r[6]}\n" for r in ROWS))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_CACHE": str(_hub_cache(tmp_path)), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", "score", "--data", "afaji/cvqa",
                           "--revision", REVISION, "--backend", "import", "--conditions", "en-aware", "--predictions",
                           str(predictions), "--output_dir", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "cvqa_results.json").read_text())
    assert results["revision"] == REVISION and results["runs"]["en-aware"]["micro"] == 100.0
