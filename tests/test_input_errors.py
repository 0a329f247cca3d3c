"""Command-line flags, CVQA and IGLUE inputs, images (issues #34, #35): a bad input ends with exit code 2 and one
stderr line naming the flag / file / field / row, no traceback, before any model loads; an image that cannot be
decoded is scored without the image and listed (iglue-hf, as cvqa score). Each test is one cause, from the
command line (`volta_ml.cli.main`, the `volta-ml` console command, in this process). docs/errors.md lists them."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from volta_ml import cli

# Numeric flags left as VOLTA / the launchers define them: set by torch.distributed launchers, read by nothing
# (accepted so IGLUE's scripts run unchanged), or VOLTA's own "any integer" meaning (--max_val_batches <= 0: all).
UNBOUNDED = {"--local_rank", "--local-rank", "--use_chunk", "--caps_per_image", "--cache", "--max_val_batches",
             "--objective",                      # pretraining: checked against VOLTA's objectives, one line
             ("volta-ml eval", "--num_workers"), ("volta-ml eval-retrieval", "--num_workers"),
             ("volta-ml eval-retrieval", "--num_val_workers"), ("volta-ml eval-retrieval", "--batch_size")}


def _numeric_flags(parser, name="volta-ml"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _numeric_flags(subparser, f"{name} {sub}")
        elif action.type in (int, float):
            yield name, action.option_strings


def test_every_numeric_flag_has_a_bound():
    """No subcommand takes a bare `type=int` / `type=float` (0, -1, nan, inf for a size, a count, a rate)."""
    bare = [(name, flags) for name, flags in _numeric_flags(cli.build_parser())
            if not any(f in UNBOUNDED or (name, f) in UNBOUNDED for f in flags)]
    assert bare == []


def _one_line(capsys, prog: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err[-2000:]
    assert lines and lines[-1].startswith(f"{prog}: error: "), err[-2000:]
    return lines[-1]


CVQA = ["cvqa", "score", "--data", "/nowhere", "--output_dir", "/nowhere/out"]
IGLUE = ["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", "/nowhere", "--lang", "en", "--images",
         "/nowhere", "--output_dir", "/nowhere/out"]
TRAIN = ["train", "--hf_model", "/nowhere", "--task", "xvnli"]
BAD_FLAGS = {  # argv -> the flag and what the line says
    "cvqa --limit 0": (CVQA + ["--limit", "0"], "--limit: must be an integer >= 1, got 0"),
    "cvqa --limit -1": (CVQA + ["--limit", "-1"], "--limit: must be an integer >= 1, got -1"),
    "cvqa --chunk-size 0": (CVQA + ["--chunk-size", "0"], "--chunk-size: must be an integer >= 1"),
    "iglue-hf --chunk_size 0": (IGLUE + ["--chunk_size", "0"], "--chunk_size: must be an integer >= 1, got 0"),
    "iglue-hf --chunk_size -1": (IGLUE + ["--chunk_size", "-1"], "--chunk_size: must be an integer >= 1, got -1"),
    "iglue-hf --max_new_tokens 0": (IGLUE + ["--max_new_tokens", "0"], "--max_new_tokens: must be an integer >= 1"),
    "iglue-hf --max_new_tokens -1": (IGLUE + ["--max_new_tokens", "-1"], "--max_new_tokens: must be an integer"),
    "iglue-hf --batch_size 0": (IGLUE + ["--batch_size", "0"], "--batch_size: must be an integer >= 1"),
    "iglue-hf --extra max_images": (IGLUE + ["--extra", '{"max_images": "lots"}'],
                                    "--extra: 'max_images' must be an integer >= 1 (images per prompt), got 'lots'"),
    "train --hf_extra enable_thinking": (TRAIN + ["--hf_extra", '{"enable_thinking": "no"}'],
                                         "--hf_extra: 'enable_thinking' must be true or false, got 'no'"),
    "train --lora_dropout 1.5": (TRAIN + ["--lora_dropout", "1.5"], "--lora_dropout: must be a number in [0, 1), got"),
    "train --lora_r 0": (TRAIN + ["--lora_r", "0"], "--lora_r: must be an integer >= 1, got 0"),
    "train --lr nan": (TRAIN + ["--lr", "nan"], "--lr: must be a finite number, got nan"),
    "train --seed -1": (TRAIN + ["--seed", "-1"], "--seed: must be an integer in 0..4294967295, got -1"),
    "eval-retrieval --num_subiters 0": (["eval-retrieval", "--num_subiters", "0"], "--num_subiters: must be an"),
    "features extract --limit 0": (["features", "extract", "--preset", "volta-butd36", "--images", "/n", "--out",
                                    "/n", "--limit", "0"], "--limit: must be an integer >= 1"),
    "sweep --max_cells 0": (["sweep", "g.yml", "--max_cells", "0"], "--max_cells: must be an integer >= 1"),
    "demo --threads 0": (["demo", "--threads", "0", "--out", "/dev/null/demo"], "--threads: must be an integer >= 1"),
    "pretrain --warmup_proportion 2": (["pretrain", "--warmup_proportion", "2"], "--warmup_proportion: must be a "
                                                                                   "number in [0, 1], got 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_out_of_range_flags_are_usage_errors_before_anything_runs(case, capsys):
    argv, expected = BAD_FLAGS[case]
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, lines      # no usage block either (options.OneLineParser)
    assert lines[0].startswith("volta-ml ") and f": error: argument {expected}" in lines[0], lines


# --- IGLUE-HF inputs ---------------------------------------------------------------------------------------------
def _xvnli(root: Path, ids=("1000", "1001", "1002", "1003")) -> tuple[Path, Path]:
    """(annotation file, image folder) of a 4-row XVNLI test file with a distinct small photo per row."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, image_id in enumerate(ids):
        pixels = np.random.default_rng(k).integers(0, 255, (12 + k, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{image_id}.jpg")
        rows.append({"Flikr30kID": image_id, "sentence2": f"a photo number {k}",
                     "gold_label": ["entailment", "neutral", "contradiction"][k % 3]})
    annotations = root / "test.jsonl"
    annotations.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return annotations, images


def _iglue(annotations, images, out, *extra) -> list[str]:
    return ["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", "/models/nowhere", "--lang", "en",
            "--annotations", str(annotations), "--images", str(images), "--output_dir", str(out), "--no_progress",
            *extra]


def test_a_malformed_image_template_names_the_flag(tmp_path, capsys):
    annotations, images = _xvnli(tmp_path)
    assert cli.main(_iglue(annotations, images, tmp_path / "out", "--image_template", "{id")) == 2
    line = _one_line(capsys, "volta-ml iglue-hf")
    assert "--image_template '{id': not a path template" in line


def test_an_empty_annotation_file_names_the_file(tmp_path, capsys):
    _, images = _xvnli(tmp_path)
    for content, says in (("", "is empty"), ("\n\n", "is empty"), ("{}", None)):
        empty = tmp_path / "empty.json" if content == "{}" else tmp_path / "empty.jsonl"
        empty.write_text(content, encoding="utf-8")
        argv = _iglue(empty, images, tmp_path / "out")
        if content == "{}":        # xGQA's question dict with no question
            argv[argv.index("xvnli")] = "xgqa"
            says = "no xgqa example in this annotation file"
        assert cli.main(argv) == 2
        line = _one_line(capsys, "volta-ml iglue-hf")
        assert f"{empty}: " in line and says in line, line


def test_files_that_are_not_utf8_name_the_file_and_byte(tmp_path, capsys):
    """An annotation file (iglue-hf) and a prediction file (cvqa score --backend import) saved as Latin-1."""
    from helpers_cvqa import write_release

    annotations, images = _xvnli(tmp_path)
    latin = tmp_path / "latin1.jsonl"
    good = annotations.read_bytes()
    latin.write_bytes(good + json.dumps({"Flikr30kID": "1000", "sentence2": "été", "gold_label": "neutral"},
                                        ensure_ascii=False).encode("latin-1") + b"\n")
    offset = len(good) + len(b'{"Flikr30kID": "1000", "sentence2": "')       # the first byte of "été"
    assert cli.main(_iglue(latin, images, tmp_path / "out")) == 2
    line = _one_line(capsys, "volta-ml iglue-hf")
    assert f"{latin}: the annotation file is not UTF-8 text (byte offset {offset}, line 5" in line, line

    predictions = tmp_path / "gpt.csv"
    predictions.write_bytes("ID,Prediction\n1001_0,1\n# café\n".encode("latin-1"))
    assert cli.main(["cvqa", "score", "--backend", "import", "--data", str(write_release(tmp_path / "cvqa")),
                     "--conditions", "en-aware", "--predictions", str(predictions), "--no-text-only",
                     "--output_dir", str(tmp_path / "cvqa_out"), "--device", "cpu"]) == 2
    line = _one_line(capsys, "volta-ml cvqa")
    assert f"{predictions}: the prediction file is not UTF-8 text (byte offset 28, line 3" in line, line


# --- CVQA shards -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("column, cells, row, says", [
    ("Label", lambda n: [2.5 if i == 2 else -1.0 for i in range(n)], 2,
     "Label must be an integer 0-3 or -1 (hidden), got float 2.5"),
    ("Label", lambda n: ["2"] * n, 0, "Label must be an integer 0-3 or -1 (hidden), got str '2'"),
    ("image", lambda n: [f"{i}.jpg" for i in range(n)], 0, "column image holds str '0.jpg', not the encoded photo"),
])
def test_a_cvqa_cell_of_the_wrong_type_names_shard_row_and_column(tmp_path, capsys, column, cells, row, says):
    """A fractional Label (2.5 was read as 2), a string Label, an image column of file names."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers_cvqa import write_release

    data = write_release(tmp_path, "hidden")
    shard = data / "test-00000-of-00001.parquet"
    table = pq.read_table(shard)
    values = cells(table.num_rows)
    arrow_type = pa.float64() if isinstance(values[0], float) else pa.string()
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, pa.field(column, arrow_type), pa.array(values, type=arrow_type)), shard)
    weights = tmp_path / "detector.pth"
    weights.write_bytes(b"never read")
    code = cli.main(["cvqa", "extract", "--data", str(data), "--preset", "volta-butd36", "--weights", str(weights),
                     "--out", str(tmp_path / "features")])
    line = _one_line(capsys, "volta-ml cvqa")
    assert code == 2 and line.startswith(f"volta-ml cvqa: error: {shard} row {row}") and says in line, line


# --- images that cannot be decoded -------------------------------------------------------------------------------
def _damage(images: Path) -> dict[str, str]:
    """An empty, a truncated and a non-image file among the photos; {path: what the decoder says}."""
    (images / "1001.jpg").write_bytes(b"")
    whole = (images / "1002.jpg").read_bytes()
    (images / "1002.jpg").write_bytes(whole[: len(whole) // 2])
    (images / "1003.jpg").write_bytes(b"<html>404 Not Found</html>")
    return {str(images / f"{i}.jpg"): kind for i, kind in (("1001", "UnidentifiedImageError"),
                                                           ("1002", "OSError"), ("1003", "UnidentifiedImageError"))}


def test_images_that_cannot_be_decoded_are_scored_without_the_image_and_listed(tmp_path, capsys, monkeypatch):
    """iglue-hf as cvqa score: the run goes on, each such example is scored as with no photo (what the backend
    makes of None), one stderr line, `failed_images` in the results; a resumed run lists them too."""
    from helpers_fake_backends import FakeGenerative, install

    from volta_ml.iglue_hf.data import read_task
    from volta_ml.iglue_hf.prompts import OPTIONS, letter_choices, user_turn

    install(monkeypatch)
    annotations, images = _xvnli(tmp_path)
    damaged = _damage(images)
    out = tmp_path / "out"
    for run in ("first", "resumed"):
        assert cli.main(_iglue(annotations, images, out, "--keep_chunks", "--chunk_size", "2")) == 0
        err = capsys.readouterr().err
        assert "Traceback" not in err
        warning = [line for line in err.splitlines() if "failed to decode" in line]
        assert len(warning) == 1 and warning[0].startswith("iglue-hf: 3 photo(s) failed to decode (first: "), err
        results = json.loads((out / "iglue_hf_results.json").read_text())
        assert sorted(results["failed_images"]) == sorted(damaged), run
        for path, kind in damaged.items():
            assert results["failed_images"][path].startswith(kind), results["failed_images"]
    # the reference, one example at a time: the damaged photos are None
    fake = FakeGenerative()
    expected = []
    for example in read_task("xvnli", str(annotations), "en"):
        photo = images / f"{example.images[0].id}.jpg"
        image = None if str(photo) in damaged else Image.open(photo).convert("RGB")
        logits = fake.choice_logits([[image]], [user_turn("xvnli", "letter", example)], letter_choices("xvnli"))
        expected.append(OPTIONS["xvnli"][int(logits.argmax())])
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [row["prediction"] for row in rows] == expected
