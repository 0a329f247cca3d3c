"""`volta-ml cvqa score --backend clip|mclip|mllm|import` with stand-in backends (tests/helpers_fake_backends.py):
scores equal a direct computation, photos embedded once, chunked resume, refused mismatches, import errors."""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers_cvqa import REVISION, ROWS, image_png, write_release
from helpers_fake_backends import LOADED, FakeDual, FakeGenerative, install

from volta_ml.cli import main
from volta_ml.cvqa.data import load_cvqa
from volta_ml.cvqa.prompts import LETTERS, full_texts, generative_prompt, open_answers

ALL = ["en-aware", "en-agnostic", "loc-aware", "loc-agnostic"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("cvqa_backends"), "latest")


@pytest.fixture
def fakes(monkeypatch):
    install(monkeypatch)
    return LOADED


def score(release, out, *extra) -> int:
    return main(["cvqa", "score", "--data", str(release), "--output_dir", str(out), "--device", "cpu",
                 "--no-progress", *extra])


def saved_scores(out: Path, name: str) -> dict:
    parts = sorted((out / "chunks" / name).glob("*.npz"))
    loaded = [dict(np.load(p)) for p in parts]
    return {k: np.concatenate([p[k] for p in loaded]) for k in loaded[0]}


def photo(image_id):
    from PIL import Image

    return Image.open(io.BytesIO(image_png(image_id))).convert("RGB")


def test_clip_scores_are_cosines_and_each_photo_is_embedded_once_per_batch(release, tmp_path, fakes):
    out = tmp_path / "clip"
    assert score(release, out, "--backend", "clip", "--model", "fake/clip", "--model-revision", "abc123",
                 "--batch-size", "3", "--chunk-size", "5") == 0
    questions = load_cvqa(release).questions
    encoder = FakeDual()
    for condition in ALL:
        got = saved_scores(out, condition)["score"]
        for q, row in zip(questions, got):
            image = encoder.embed_images([photo(q.image_id)])[0]
            want = (encoder.embed_texts(full_texts(q, condition, "plain")) @ image).numpy()
            np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-6)
        blind = saved_scores(out, f"{condition}.blind")["score"]
        blank = encoder.embed_images([None])[0]
        np.testing.assert_allclose(blind[0], (encoder.embed_texts(full_texts(questions[0], condition, "plain"))
                                              @ blank).numpy(), rtol=1e-5, atol=1e-6)
    # chunks [0:5] [5:7] in batches of 3 questions: photos 1001,1002 | blank (once) | 2001,2002 || 3001
    assert fakes[0].image_calls == [2, 1, 2, 1]
    results = json.loads((out / "cvqa_results.json").read_text())
    assert (results["backend"], results["model"], results["model_revision"], results["revision"]) == (
        "clip", "fake/clip", "abc123", REVISION)
    assert results["rendered_prompts"]["en-aware"] == "\n".join(full_texts(questions[0], "en-aware", "plain"))
    assert results["template"] == "plain" and set(results["text_only"]) == set(ALL)
    with open(out / "predictions_en-aware.csv", newline="", encoding="utf-8") as f:
        preds = [int(r["Prediction"]) for r in csv.DictReader(f)]
    assert preds == saved_scores(out, "en-aware")["score"].argmax(1).tolist()


@pytest.mark.parametrize("rule", ["letter", "open"])
def test_mllm_rules_match_a_direct_computation(release, tmp_path, fakes, rule):
    out = tmp_path / rule
    assert score(release, out, "--backend", "mllm", "--model", "fake/llava", "--rule", rule, "--dtype", "bf16",
                 "--device-map", "auto", "--model-revision", "f00d", "--conditions", "en-aware", "loc-agnostic",
                 "--batch-size", "4", "--no-text-only") == 0
    spec = fakes[0].spec
    assert (spec.model, spec.revision, spec.dtype, spec.device_map) == ("fake/llava", "f00d", "bf16", "auto")
    questions = load_cvqa(release).questions
    model = FakeGenerative(type("Spec", (), {"model": "fake/llava"})())
    for condition in ("en-aware", "loc-agnostic"):
        got = saved_scores(out, condition)
        for q, k in zip(questions, range(len(questions))):
            prompt = [generative_prompt(q, condition, rule)]
            if rule == "letter":
                want = model.choice_logits([[photo(q.image_id)]], prompt, LETTERS)[0].numpy()
                np.testing.assert_allclose(got["score"][k], want, rtol=1e-5, atol=1e-6)
            else:
                sums, counts = model.continuation_logprobs([[photo(q.image_id)]], prompt,
                                                           [open_answers(q, condition)])
                np.testing.assert_allclose(got["score"][k], sums[0].numpy(), rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(got["length_normalised"][k], (sums[0] / counts[0]).numpy(), rtol=1e-5, atol=1e-6)
    assert fakes[0].calls == 2 * 2   # one call per batch of 4 questions, per condition
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["rule"] == rule and results["prompts_version"] == "cvqa-mllm-prompts-v2"
    assert (results["model"], results["model_revision"], results["dtype"]) == ("fake/llava", "f00d", "bf16")
    assert results["rendered_prompts"]["en-aware"] == model.render(generative_prompt(questions[0], "en-aware",
                                                                                     rule), 1)
    assert ("length_normalised" in results["variants"]) == (rule == "open")
    if rule == "letter":     # the paper's text: the lettered options on one line
        assert "Options: A. dosa B. idli C. vada D. upma Short Answer:" in results["rendered_prompts"]["en-aware"]
        assert results["template"] == "letter" and results["letter_spellings"] == "natural"


def test_letter_layout_lines_is_a_named_variant(release, tmp_path, fakes):
    out = tmp_path / "lines"
    assert score(release, out, "--backend", "mllm", "--model", "fake/llava", "--conditions", "en-aware",
                 "--letter_layout", "lines", "--no-text-only") == 0
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["template"] == "letter-lines"
    assert "Options:\nA. dosa\nB. idli\nC. vada\nD. upma\nShort Answer:" in results["rendered_prompts"]["en-aware"]


def test_generate_rule_parses_answers_and_reports_the_parse_failure_rate(release, tmp_path, fakes, monkeypatch):
    questions = load_cvqa(release).questions
    answers = {0: "B", 1: "(C) because", 2: "the answer is unclear"}      # the rest: an option's text

    index = {generative_prompt(q, "en-aware", "generate"): k for k, q in enumerate(questions)}
    assert len(index) == len(questions)

    def generate(self, images, prompts, max_new_tokens):
        return [answers.get(index[p], questions[index[p]].options_en[3]) for p in prompts]
    monkeypatch.setattr(FakeGenerative, "generate", generate)
    out = tmp_path / "gen"
    assert score(release, out, "--backend", "mllm", "--model", "fake/llava", "--rule", "generate",
                 "--conditions", "en-aware", "--no-text-only") == 0
    got = saved_scores(out, "en-aware")
    assert got["score"].argmax(1).tolist()[:2] == [1, 2] and not got["score"][2].any()
    assert (got["score"][3:].argmax(1) == 3).all()
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["rule"] == "generate" and "parse_failed" not in results["variants"]
    assert results["parse_failure_rate"]["en-aware"] == round(100.0 / len(questions), 3)
    # accuracy the obvious way: the parsed option against the label, an unparsed answer is wrong (never "A")
    parsed = {0: 1, 1: 2, 2: None}
    labelled = [q for q in questions if q.label >= 0]
    right = sum(parsed.get(k, 3) == q.label for k, q in enumerate(questions) if q.label >= 0)
    assert results["runs"]["en-aware"]["micro"] == pytest.approx(100.0 * right / len(labelled), abs=1e-6)
    rows = list(csv.DictReader(open(out / "predictions_en-aware.csv", encoding="utf-8")))
    assert rows[2]["Prediction"] == "-1"
    submitted = list(csv.DictReader(open(out / "submission_en-aware.csv", encoding="utf-8")))
    assert submitted[2]["Prediction"] == "0"    # EvalAI needs an option for every question
    # (#44) plain-string answers do not say whether they were cut: "unknown", never 0
    assert results["truncated_rate"]["en-aware"] is None and results["truncated"]["en-aware"] == "unknown"
    assert "truncated" not in results["variants"]


def test_generate_rule_records_the_answers_cut_at_max_new_tokens(release, tmp_path, fakes, monkeypatch, capsys):
    """(#44) CVQA's generate rule: truncated_rate and the truncated questions in the results, one warning line
    above 5%, per question in the predictions file, the report's `truncated` table with its interval."""
    from volta_ml.cli import main
    from volta_ml.hf.base import Answer

    questions = load_cvqa(release).questions
    index = {generative_prompt(q, "en-aware", "generate"): k for k, q in enumerate(questions)}

    def generate(self, images, prompts, max_new_tokens):
        return [Answer(questions[index[p]].options_en[3], truncated=index[p] in (0, 1)) for p in prompts]
    monkeypatch.setattr(FakeGenerative, "generate", generate)
    out = tmp_path / "gen"
    assert score(release, out, "--backend", "mllm", "--model", "fake/llava", "--rule", "generate",
                 "--conditions", "en-aware", "--no-text-only") == 0
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["truncated"]["en-aware"] == [questions[0].id, questions[1].id]
    assert results["truncated_rate"]["en-aware"] == pytest.approx(200.0 / len(questions))
    warnings = [l for l in capsys.readouterr().err.splitlines() if "stopped at max_new_tokens" in l]
    assert len(warnings) == 1 and f"2 of {len(questions)} answers" in warnings[0]
    rows = list(csv.DictReader(open(out / "predictions_en-aware.csv", encoding="utf-8")))
    assert [float(r["truncated_0"]) for r in rows] == [100.0 if k < 2 else 0.0 for k in range(len(rows))]
    assert main(["cvqa", "report", str(out), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    table = list(csv.DictReader(open(tmp_path / "r" / "truncated.csv", encoding="utf-8")))
    assert len(table) == 1 and float(table[0]["truncated"]) == pytest.approx(200.0 / len(questions), abs=1e-4)
    assert table[0]["truncated ci_low"] != ""
    assert main(["compare", str(out), str(out), "--out", str(tmp_path / "c")]) == 0
    compared = list(csv.DictReader(open(tmp_path / "c" / "cvqa_compare.csv", encoding="utf-8")))
    assert {(r["A_truncated_rate"], r["B_truncated_rate"]) for r in compared} == {(repr(200.0 / len(questions)),) * 2}


def test_batch_size_and_chunking_do_not_change_scores(release, tmp_path, fakes):
    runs = {}
    for label, extra in {"one": ["--batch-size", "1", "--chunk-size", "1"],
                         "big": ["--batch-size", "7", "--chunk-size", "64"]}.items():
        assert score(release, tmp_path / label, "--backend", "mllm", "--model", "fake/m", "--conditions",
                     "loc-aware", *extra) == 0
        runs[label] = saved_scores(tmp_path / label, "loc-aware")["score"]
    np.testing.assert_array_equal(runs["one"], runs["big"])


def test_killed_run_resumes_where_it_stopped_and_a_changed_revision_is_refused(release, tmp_path, fakes,
                                                                              monkeypatch, capsys):
    args = ["--backend", "mllm", "--model", "fake/m", "--model-revision", "r1", "--chunk-size", "2",
            "--batch-size", "2", "--conditions", "en-aware", "loc-aware"]
    assert score(release, tmp_path / "whole", *args) == 0
    original = FakeGenerative.choice_logits
    calls = {"n": 0}

    def dies_on_the_fifth_call(self, *a):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt   # what a kill leaves: the chunks saved so far
        return original(self, *a)

    monkeypatch.setattr(FakeGenerative, "choice_logits", dies_on_the_fifth_call)
    assert score(release, tmp_path / "killed", *args) == 130   # `volta-ml`: Ctrl-C is exit code 130, one line
    assert capsys.readouterr().err.strip().endswith("volta-ml cvqa: error: interrupted")
    assert not (tmp_path / "killed" / "cvqa_results.json").exists()
    monkeypatch.setattr(FakeGenerative, "choice_logits", original)
    LOADED.clear()
    assert score(release, tmp_path / "killed", *args) == 0
    # 4 chunks x 2 passes x 2 (text-only) = 16 batch calls in all; 4 were saved before the kill
    assert LOADED[0].calls == 16 - 4
    for name in ("en-aware", "loc-aware", "en-aware.blind"):
        np.testing.assert_array_equal(saved_scores(tmp_path / "whole", name)["score"],
                                      saved_scores(tmp_path / "killed", name)["score"])
    whole = json.loads((tmp_path / "whole" / "cvqa_results.json").read_text())
    resumed = json.loads((tmp_path / "killed" / "cvqa_results.json").read_text())
    assert whole["runs"] == resumed["runs"] and whole["text_only"] == resumed["text_only"]
    capsys.readouterr()
    changed = [a if a != "r1" else "r2" for a in args]
    assert score(release, tmp_path / "killed", *changed) == 2
    err = capsys.readouterr().err
    assert "model_revision 'r1' but this run has 'r2'; refusing to mix them" in err and err.count("\n") == 1


def test_letter_that_is_not_one_token_suggests_the_open_rule(release, tmp_path, fakes, monkeypatch, capsys):
    monkeypatch.setattr(FakeGenerative, "letters_ok", ("A", "B", "D"))
    assert score(release, tmp_path / "x", "--backend", "mllm", "--model", "fake/odd", "--conditions",
                 "en-aware") == 2
    err = capsys.readouterr().err
    assert "fake/odd: 'C' is not one token" in err and "--rule open" in err and err.count("\n") == 1


def test_photos_that_fail_to_decode_are_listed_and_scored_as_missing(tmp_path, fakes):
    import pyarrow.parquet as pq

    data = write_release(tmp_path, "latest")
    shard = data / "test-00001-of-00002.parquet"
    table = pq.read_table(shard).to_pylist()
    for row in table:
        if row["ID"].startswith("3001"):
            row["image"] = {"bytes": b"not an image at all", "path": "x.png"}
    pq.write_table(pq.read_table(shard).from_pylist(table, schema=pq.read_schema(shard)), shard)
    out = tmp_path / "out"
    assert score(data, out, "--backend", "clip", "--model", "fake/clip", "--conditions", "en-aware") == 0
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["missing_images"] == ["3001"] and "UnidentifiedImageError" in results["failed_images"]["3001"]
    got, blind = saved_scores(out, "en-aware")["score"], saved_scores(out, "en-aware.blind")["score"]
    np.testing.assert_array_equal(got[-2:], blind[-2:])          # the broken photo's questions = text-only
    assert not np.allclose(got[:-2], blind[:-2])


def _csv(path: Path, rows) -> str:
    path.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n", encoding="utf-8")
    return str(path)


def test_import_scores_predictions_made_elsewhere(release, tmp_path, capsys):
    good = _csv(tmp_path / "gpt4o.csv", [("ID", "Prediction")] + [(r[0], r[6]) for r in ROWS])
    wrong = _csv(tmp_path / "zeros.csv", [("ID", "Prediction")] + [(r[0], 0) for r in ROWS])
    out = tmp_path / "imported"
    assert score(release, out, "--backend", "import", "--conditions", "en-aware", "loc-aware",
                 "--predictions", f"en-aware={good}", f"loc-aware={wrong}") == 0
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["runs"]["en-aware"]["micro"] == 100.0
    assert results["runs"]["loc-aware"]["micro"] == pytest.approx(100 * sum(r[6] == 0 for r in ROWS) / len(ROWS))
    assert results["backend"] == "import" and results["model_revision"].startswith("sha1:")
    assert results["text_only"] == {}


def test_import_counts_an_empty_prediction_wrong_and_says_so(release, tmp_path, capsys):
    """An empty Prediction (`ID,` or `ID` alone) is what the other harness produced, an answer naming no option:
    counted wrong (Prediction -1, as an unparsed generated answer; option 0 in the EvalAI submission), the rate in
    parse_failure_rate, the count in empty_predictions and one stderr line; a condition without one is unchanged."""
    blank = {0: "", 3: None}                                       # "1001_0," and "2001_0" alone
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("ID,Prediction\n" + "".join(f"{r[0]}\n" if blank.get(k, 1) is None else
                                                 f"{r[0]},{blank.get(k, r[6])}\n" for k, r in enumerate(ROWS)),
                     encoding="utf-8")
    good = _csv(tmp_path / "good.csv", [("ID", "Prediction")] + [(r[0], r[6]) for r in ROWS])
    out = tmp_path / "imported"
    capsys.readouterr()
    assert score(release, out, "--backend", "import", "--conditions", "en-aware", "loc-aware",
                 "--predictions", f"en-aware={mixed}", f"loc-aware={good}") == 0
    err = capsys.readouterr().err
    results = json.loads((out / "cvqa_results.json").read_text())
    # one question at a time: an empty prediction is wrong whatever the label, the others are right (the labels)
    correct = [k not in blank for k in range(len(ROWS))]
    assert results["runs"]["en-aware"]["micro"] == pytest.approx(100 * sum(correct) / len(ROWS))
    assert results["runs"]["loc-aware"]["micro"] == 100.0
    assert results["empty_predictions"] == {"en-aware": 2, "loc-aware": 0}
    assert results["parse_failure_rate"] == {"en-aware": round(100 * 2 / len(ROWS), 3)}        # rounded as written
    with open(out / "predictions_en-aware.csv", encoding="utf-8") as f:
        predicted = [int(row["Prediction"]) for row in csv.DictReader(f)]
    assert predicted == [-1 if k in blank else r[6] for k, r in enumerate(ROWS)]
    with open(out / "submission_en-aware.csv", encoding="utf-8") as f:
        assert [int(row["Prediction"]) for row in csv.DictReader(f)] == [max(p, 0) for p in predicted]
    assert [line for line in err.splitlines() if "imported predictions are empty" in line] == [
        f"CVQA: 2 of {len(ROWS)} imported predictions are empty in {mixed} (first ID {ROWS[0][0]!r}); counted wrong, "
        f"as answers that named no option (Prediction -1, parse_failure_rate), and in {out / 'cvqa_results.json'} "
        f"(empty_predictions)"]


@pytest.mark.parametrize("rows, message", [
    ([("ID", "Prediction"), ("1001_0", 1), ("9999_0", 2)], "bad.csv line 3: unknown ID '9999_0'"),
    ([("ID", "Prediction"), ("1001_0", 4)], "bad.csv line 2: Prediction '4' for ID '1001_0' is not an option"),
    ([("ID", "Prediction"), ("1001_0", 1), ("1001_0", 1)], "bad.csv line 3: ID '1001_0' appears twice"),
    ([("id", "pred")], "bad.csv line 1: expected the header ID,Prediction"),
    ([("ID", "Prediction"), ("1001_0", 1)], "bad.csv: no prediction for 6 question(s), first ID '1001_1'"),
])
def test_import_errors_name_the_line(release, tmp_path, capsys, rows, message):
    bad = _csv(tmp_path / "bad.csv", rows)
    assert score(release, tmp_path / "o", "--backend", "import", "--conditions", "en-aware", "--predictions",
                 bad) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_backend_lists_the_supported_ones(release, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        score(release, tmp_path, "--backend", "gpt5")
    assert exit_.value.code == 2
    from volta_ml.cvqa.backends import BACKENDS
    assert {"zoo", "clip", "mclip", "mllm", "openai", "import"} <= set(BACKENDS)
    assert f"invalid choice: 'gpt5' (choose from {', '.join(map(repr, BACKENDS))})" in capsys.readouterr().err


def test_zoo_backend_still_needs_its_files(release, tmp_path, capsys):
    assert score(release, tmp_path, "--features", "f") == 2
    assert "--backend zoo needs --config, --checkpoint, --bert_model" in capsys.readouterr().err


def test_two_gloo_ranks_give_the_same_files_as_one_process(release, tmp_path, fakes):
    import os
    import socket
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    script = str(repo / "tests" / "helpers_fake_backends.py")
    args = ["cvqa", "score", "--data", str(release), "--backend", "mllm", "--model", "fake/m", "--rule", "open",
            "--conditions", "en-aware", "loc-agnostic", "--chunk-size", "2", "--batch-size", "2", "--device",
            "cpu", "--no-progress"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    done = subprocess.run(torchrun + [script] + args + ["--output_dir", str(tmp_path / "two")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(args + ["--output_dir", str(tmp_path / "one")]) == 0
    for name in ("en-aware", "loc-agnostic", "en-aware.blind"):
        one, two = saved_scores(tmp_path / "one", name), saved_scores(tmp_path / "two", name)
        for key in one:
            np.testing.assert_array_equal(one[key], two[key])
    for name in ("predictions_en-aware.csv", "submission_loc-agnostic.csv", "cvqa_pair.csv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    a, b = (json.loads((tmp_path / k / "cvqa_results.json").read_text()) for k in ("one", "two"))
    assert a["runs"] == b["runs"] and a["variants"] == b["variants"] and a["text_only"] == b["text_only"]
    assert a["timing"]["en-aware"]["questions_scored"] == b["timing"]["en-aware"]["questions_scored"] == len(ROWS)


def test_backend_result_folders_feed_the_paper_report(release, tmp_path, fakes):
    labels = _csv(tmp_path / "gpt4o.csv", [("ID", "Prediction")] + [(r[0], r[6]) for r in ROWS])
    assert score(release, tmp_path / "runs" / "gpt4o", "--backend", "import", "--conditions", "en-aware",
                 "--predictions", labels) == 0
    assert score(release, tmp_path / "runs" / "open", "--backend", "mllm", "--model", "fake/llava", "--rule",
                 "open", "--conditions", "en-aware") == 0
    assert main(["cvqa", "report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--no-plots"]) == 0
    report = (tmp_path / "report" / "cvqa_paper_report.md").read_text()
    opened = json.loads((tmp_path / "runs" / "open" / "cvqa_results.json").read_text())
    assert "| gpt4o | import | - | - | 100.00 ± 0.00 |" in report       # the cell with its 95% interval
    micro = f"{opened['runs']['en-aware']['micro']:.2f}"
    assert re.search(rf"\| llava \(open\) \| mllm \| open \| - \| {re.escape(micro)} ± [0-9.]+ \|", report)
    normalised = f"{opened['variants']['length_normalised']['en-aware']['micro']:.2f}"
    blind = f"{opened['text_only']['en-aware']['micro']:.2f}"
    # the variant and the blind control from their per-question scores: with intervals, equal to the summaries
    assert re.search(rf"\| llava \(open\) length_normalised \| mllm \| open \| - \| {re.escape(normalised)} ± [0-9.]+ \|",
                     report), report
    assert re.search(rf"\| llava \(open\) text-only \| blind \| open \| - \| {re.escape(blind)} ± [0-9.]+ \|", report), report


def test_predictions_csv_holds_every_per_question_score(release, tmp_path, fakes):
    """Issue 23: the open rule's length-normalised scores and the text-only control's scores, per question and
    option, are in predictions_<condition>.csv (not only in chunks/*.npz, which a finished run may delete)."""
    assert score(release, tmp_path, "--backend", "mllm", "--model", "fake/m", "--rule", "open", "--conditions",
                 "loc-aware") == 0
    with open(tmp_path / "predictions_loc-aware.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    columns = {name: np.array([[float(r[f"{name}_{k}"]) for k in range(4)] for r in rows])
               for name in ("score", "length_normalised", "text_only", "text_only_length_normalised")}
    sighted, blind = saved_scores(tmp_path, "loc-aware"), saved_scores(tmp_path, "loc-aware.blind")
    np.testing.assert_array_equal(columns["score"], sighted["score"])
    np.testing.assert_array_equal(columns["length_normalised"], sighted["length_normalised"])
    np.testing.assert_array_equal(columns["text_only"], blind["score"])
    np.testing.assert_array_equal(columns["text_only_length_normalised"], blind["length_normalised"])
    assert not np.array_equal(columns["score"], columns["length_normalised"])
