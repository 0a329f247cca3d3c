"""The multilingual suite end to end on tiny releases in each benchmark's own schema (tests/helpers_suite.py) with
the contract fakes as backends: the readers, every task's score equal to a one-item-at-a-time computation,
batches and ranks changing nothing, resume, bad input as one line (exit 2), a sweep over the suite into
`volta-ml report`'s tables."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from helpers_fake_backends import FailingAfter, FakeDual
from helpers_suite import EXAM_ANSWERS, FakeExamGenerative, build_suite, needs_java
from volta_ml import stats
from volta_ml.protocols.suite import SUITE
from volta_ml.suite.data import resolve
from volta_ml.suite.run import run_suite
from volta_ml.suite.table import TASKS

MAXM_ANSWERS = ("Red.", "Two", "The dogs", "红色", "米饭")
MTVQA_ANSWERS = ("株式会社ABCです", "さくら")
M3EXAM_ANSWERS = ("B", "(C) สาม", "A. หนึ่ง", "I do not know", "E")
MMMB_ANSWERS = ("The answer is B.", "A", "red", "I think C or D", "Sorry, I can't help with images of people yet.",
                "两只")
CAPTIONS = ("A red car in front of a house.", "红色的汽车", "รถยนต์สีแดง", "two dogs playing on the grass", "两只狗在玩")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return build_suite(tmp_path_factory.mktemp("suite"))


def data_of(suite, task: str) -> tuple[str, dict]:
    """--data and the task's extra options."""
    xm = suite["xm3600"]
    return {"maxm": (str(suite["maxm"]), {"images": str(xm["images"])}),
            "xm3600": (str(xm["captions"]), {}), "xm100": (str(xm["captions"]), {"subset": str(xm["subset"])}),
            "xm3600_retrieval": (str(xm["captions"]), {}), "mtvqa": (str(suite["mtvqa"]), {}),
            "xmmmu": (str(suite["xmmmu"]), {}), "m3exam": (str(suite["m3exam"]), {}),
            "kaleidoscope": (str(suite["kaleidoscope"]), {}),
            "kaleidoscope_multimodal": (str(suite["kaleidoscope"]), {}), "mmmb": (str(suite["mmmb"]), {}),
            "vlmevalkit_mcq": (str(Path(suite["mmmb"]) / "mmmb" / "mmmb_cn.tsv"), {})}[task]


def options(suite, task, lang, out, **extra):
    data, more = data_of(suite, task)
    return {"task": task, "lang": lang, "data": data, "backend": "clip" if task == "xm3600_retrieval" else "mllm",
            "model": "/models/fake-vlm", "output_dir": str(out), "progress": False, "batch_size": 3, "chunk_size": 2,
            **more, **extra}


def backend_for(task):
    if task == "xm3600_retrieval":
        return FakeDual()
    answers = {"xm3600": CAPTIONS, "xm100": CAPTIONS, "maxm": MAXM_ANSWERS, "mtvqa": MTVQA_ANSWERS,
               "m3exam": M3EXAM_ANSWERS, "mmmb": MMMB_ANSWERS, "vlmevalkit_mcq": MMMB_ANSWERS}
    return FakeExamGenerative(answers=answers.get(task, EXAM_ANSWERS))


def reference(task, lang, rule_name, opts, backend=None):
    """One item at a time, straight from the backend (a fresh fake by default), judged by the task's rule."""
    from volta_ml.suite.images import stack

    row = TASKS[task]
    data = row.reader(resolve(opts["data"]), lang, opts)
    rule, backend = row.rules[rule_name], backend or backend_for(task)
    scores, parsed = [], []
    answers, letters = [], []
    for item in data.items:
        images = [data.store.load(k) for k in item.images]
        images = [stack(images)] if backend.max_images is not None and len(images) > backend.max_images else images
        prompt = row.prompt(item, rule.kind, getattr(backend, "vqa_frame", None))
        if rule.kind == "letter" and item.options:
            logits = backend.choice_logits([images], [prompt], list("ABCDEFGHIJ"[:len(item.options)]))[0]
            letters.append(int(np.argmax(logits.numpy())))
            answers.append("")
        else:
            answers.append(backend.generate([images], [prompt], opts.get("max_new_tokens") or row.max_new_tokens)[0])
            letters.append(None)
    if task in ("xm3600", "xm100"):          # the captions prepared, tokenised in one batch, scored by Cider
        from pycocoevalcap.cider.cider import Cider
        from volta_ml.suite import ptb
        from volta_ml.suite.text import prepare, ptb_jar
        segment = rule_name != "cider-nosegment"
        captions = [prepare(c, lang, segment) for it in data.items for c in it.references] + \
            [prepare(a, lang, segment) for a in answers]
        tokens = [" ".join(ptb.tokens(c)) for c in captions] if rule_name == "cider-pyptb" else ptb_jar(captions)
        gts, at = {}, 0
        for i, item in enumerate(data.items):
            gts[i], at = tokens[at:at + len(item.references)], at + len(item.references)
        _, per_item = Cider().compute_score(gts, {i: [t] for i, t in enumerate(tokens[at:])})
        return 100 * float(np.mean(per_item)), None
    from volta_ml.suite.rules import gold_indices
    for item, answer, letter in zip(data.items, answers, letters):
        if letter is not None:
            scores.append(float(letter in gold_indices(item)))
            continue
        judged = rule.judge({"answers": np.array([answer]), "scores": np.zeros((1, 1))}, [item], {})[0]
        scores.append(judged.score)
        if judged.parsed is not None:
            parsed.append(judged.parsed)
    return 100 * float(np.mean(scores)), (100 * (1 - float(np.mean(parsed))) if parsed else None)


CASES = [("maxm", "en", "exact"), ("maxm", "zh", "relaxed"), pytest.param("xm3600", "zh", "cider", marks=needs_java),
         pytest.param("xm3600", "ja", "cider", marks=needs_java), ("xm3600", "th", "cider-pyptb"),
         pytest.param("xm100", "en", "cider", marks=needs_java), ("mtvqa", "ja", "mtvqa"),
         ("xmmmu", "ja", "generate"), ("xmmmu", "ja", "letter"), ("m3exam", "th", "generate"),
         ("m3exam", "th", "letter"), ("kaleidoscope", "uk", "generate"), ("kaleidoscope", "uk", "letter"),
         ("kaleidoscope_multimodal", "uk", "reference"), ("mmmb", "en", "vlmevalkit"), ("mmmb", "zh", "letter"),
         ("vlmevalkit_mcq", "cn", "vlmevalkit")]


@pytest.mark.parametrize("task,lang,rule", CASES)
def test_scores_equal_one_item_at_a_time(suite, tmp_path, task, lang, rule):
    opts = options(suite, task, lang, tmp_path, rule=rule)
    result = run_suite(opts, backend=backend_for(task))
    expected, format_errors = reference(task, lang, rule, opts)
    assert result["metrics"]["score"] == pytest.approx(expected)
    assert result["metrics"].get("format_error_rate") == (None if format_errors is None else
                                                          pytest.approx(format_errors))
    rows = [json.loads(l) for l in (tmp_path / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == result["n_items"] and {"id", "lang", "score", "parsed", "prediction", "prompt"} <= set(rows[0])
    assert 100 * np.mean([r["score"] for r in rows]) == pytest.approx(result["metrics"]["score"])
    assert result["first_prompt_rendered"].endswith(" ASSISTANT:") and result["prompts_version"]
    if rule.startswith("cider"):              # what tokenised the captions is recorded with the result
        tools = result["rule_tools"]
        assert tools["pycocoevalcap"] and ("java" in tools) == (rule != "cider-pyptb")
        assert {"ja": {"sudachipy", "sudachidict_core"}, "th": {"pythainlp"}}.get(lang, set()) <= set(tools)
    record = json.loads((tmp_path / "result.json").read_text())
    assert (record["task"], record["lang"], record["rule"], record["protocol"]) == (task, lang, rule, "zero_shot")


def test_readers_keep_the_hard_cases(suite):
    def read(task, lang, **extra):
        data, more = data_of(suite, task)
        return TASKS[task].reader(resolve(data), lang, {**more, **extra})

    maxm = read("maxm", "en")
    assert [i.references for i in maxm.items][0] == ("Red.", "red") and maxm.items[0].images == ("000411001ff7dd4f",)
    mtvqa = read("mtvqa", "ja")
    assert len(mtvqa.items) == 3 and mtvqa.skipped == {"empty answer": 1}     # the empty gold answer is left out
    xmmmu = {i.id: i for i in read("xmmmu", "ja").items}
    assert len(xmmmu["validation_Art_1"].options) == 5 and xmmmu["validation_Art_1"].answer == 1
    assert [k[2] for k in xmmmu["validation_Math_2"].images] == ["image_1", "image_2"]
    assert xmmmu["validation_Physics_3"].references == ("24",) and not xmmmu["validation_Physics_3"].options
    assert xmmmu["validation_Chemistry_4"].options == ("<image 2>", "<image 3>")
    m3 = read("m3exam", "th").items
    assert [(i.answer, len(i.options)) for i in m3] == [(1, 5), (2, 4), (0, 2)]        # "2", "ค", "1"
    assert m3[0].options[1] == "สุนัข" and m3[0].question.startswith("<image 1>")
    assert m3[1].meta["background"] == "ดูภาพ <image 1> แล้วตอบคำถาม" and m3[1].images == ("image-2.png",)
    assert m3[2].options == ("<image 1>", "<image 2>") and m3[2].images == ("image-3.png", "image-4.png")
    kaleidoscope = read("kaleidoscope", "uk").items
    assert [len(i.images) for i in kaleidoscope] == [1, 0, 3]                # a text-only question, image options
    assert kaleidoscope[2].options == ("<image 2>", "<image 3>")
    assert len(read("kaleidoscope_multimodal", "uk").items) == 2
    retrieval = read("xm3600_retrieval", "de").retrieval
    assert len(retrieval.captions) == 8 and retrieval.caption_image == [0, 0, 1, 1, 2, 2, 3, 3]


def test_xm3600_retrieval_equals_brute_force(suite, tmp_path):
    from test_iglue_hf import brute_force_recalls

    opts = options(suite, "xm3600_retrieval", "de", tmp_path)
    result = run_suite(opts, backend=FakeDual())
    data = TASKS["xm3600_retrieval"].reader(resolve(opts["data"]), "de", opts)
    texts = FakeDual().embed_texts(data.retrieval.captions).numpy()
    images = FakeDual().embed_images([data.store.source.load(r) for r in data.retrieval.images]).numpy()
    for key, value in brute_force_recalls(texts @ images.T, data.retrieval.caption_image).items():
        assert result["metrics"][key] == pytest.approx(value), key


@pytest.mark.parametrize("task,lang,rule", [("m3exam", "th", "letter"), ("xmmmu", "ja", "generate"),
                                            ("xm3600", "ja", "cider")])
def test_batch_size_changes_nothing(suite, tmp_path, task, lang, rule):
    for batch in (1, 4):
        run_suite(options(suite, task, lang, tmp_path / str(batch), rule=rule, batch_size=batch, chunk_size=3),
                  backend=backend_for(task))
    assert (tmp_path / "1/predictions.jsonl").read_text() == (tmp_path / "4/predictions.jsonl").read_text()


def test_resume_equals_uninterrupted(suite, tmp_path):
    task, lang = "kaleidoscope", "uk"
    whole = run_suite(options(suite, task, lang, tmp_path / "whole", batch_size=1, chunk_size=1),
                      backend=backend_for(task))
    with pytest.raises(RuntimeError, match="interrupted"):
        run_suite(options(suite, task, lang, tmp_path / "cut", batch_size=1, chunk_size=1),
                  backend=FailingAfter(backend_for(task), 2))
    again = backend_for(task)
    resumed = run_suite(options(suite, task, lang, tmp_path / "cut", batch_size=1, chunk_size=1), backend=again)
    assert resumed["metrics"] == whole["metrics"] and again.calls == 1
    assert (tmp_path / "whole/predictions.jsonl").read_text() == (tmp_path / "cut/predictions.jsonl").read_text()


def test_imported_answers_are_rescored_by_the_rule(suite, tmp_path, capsys):
    """`--backend import`: another run's generated answers, scored by the task's rules (here: every MaXM rule
    on the answers of one generation), equal to scoring them at generation time; a record without a prediction, or
    with one that is not text, is refused."""
    generated = run_suite(options(suite, "maxm", "en", tmp_path / "gen"), backend=backend_for("maxm"))
    rows = [json.loads(l) for l in (tmp_path / "gen/predictions.jsonl").read_text().splitlines()]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"id": r["id"], "prediction": r["generated"]}) + "\n" for r in rows))
    for rule in ("exact", "relaxed", "pangea-relaxed"):
        again = run_suite(options(suite, "maxm", "en", tmp_path / rule, rule=rule, backend="import",
                                  predictions=str(answers)))
        direct = run_suite(options(suite, "maxm", "en", tmp_path / f"{rule}-direct", rule=rule),
                           backend=backend_for("maxm"))
        assert without_truncation(again["metrics"]) == without_truncation(direct["metrics"]), rule
        # (#44) the other harness gives no truncation: "unknown", not 0
        assert again["metrics"]["truncated_rate"] is None and again["truncated"] == "unknown"
        assert direct["metrics"]["truncated_rate"] == 0.0 and direct["truncated"] == []
    imported = run_suite(options(suite, "maxm", "en", tmp_path / "exact2", backend="import", predictions=str(answers)))
    assert without_truncation(generated["metrics"]) == without_truncation(imported["metrics"])
    assert 0 < generated["metrics"]["score"] < 100
    data, more = data_of(suite, "maxm")
    item = repr(rows[1]["id"])
    for bad, message in (({}, f'item {item} has no "prediction"'),
                         ({"prediction": ["yes"]}, f"item {item}: the prediction is not text (['yes'])")):
        answers.write_text("".join(json.dumps({"id": r["id"], **(bad if k == 1 else {"prediction": r["generated"]})})
                                   + "\n" for k, r in enumerate(rows)))
        capsys.readouterr()
        code, err = _cli(["--task", "maxm", "--lang", "en", "--data", data, "--images", more["images"], "--backend",
                          "import", "--predictions", str(answers), "--model", "other-harness", "--output_dir",
                          str(tmp_path / "bad")], capsys)
        assert code == 2 and err == f"volta-ml suite: error: {answers}:2: {message}", err

class Replay(FakeExamGenerative):
    """Gives back the answers it is handed, one per `generate` call, in order (the one-at-a-time reference)."""

    def __init__(self, answers):
        super().__init__()
        self.replayed = iter(answers)

    def generate(self, images, prompts, max_new_tokens):
        return [next(self.replayed) for _ in prompts]


@pytest.mark.parametrize("task,lang,rule", [("maxm", "en", "exact"), ("xm3600", "th", "cider-pyptb"),
                                            ("mtvqa", "ja", "mtvqa"), ("xmmmu", "ja", "generate"),
                                            ("m3exam", "th", "generate"), ("kaleidoscope", "uk", "generate")])
def test_empty_imported_answers_are_scored_and_counted(suite, tmp_path, capsys, task, lang, rule):
    """An empty imported answer ("", only spaces, null) is what the other harness generated: scored by the rule as
    it is (0; a format error for multiple choice), equal to judging the same answers one item at a time, counted in
    suite_results.json (`empty_predictions`) and said in one stderr line."""
    run_suite(options(suite, task, lang, tmp_path / "gen", rule=rule), backend=backend_for(task))
    rows = [json.loads(l) for l in (tmp_path / "gen/predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    blanks = {0: "", 1: None, 2: "  \n"}
    answers = [blanks.get(k, r["generated"]) for k, r in enumerate(rows)]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "prediction": a}, ensure_ascii=False) + "\n"
                            for r, a in zip(rows, answers)), encoding="utf-8")
    data, more = data_of(suite, task)
    out = tmp_path / "imported"
    code, err = _cli(["--task", task, "--lang", lang, "--rule", rule, "--data", data,
                      *[f for k, v in more.items() for f in (f"--{k}", v)], "--backend", "import", "--predictions",
                      str(path), "--model", "other-harness", "--output_dir", str(out), "--no_progress"], capsys)
    empty = min(len(rows), len(blanks))
    assert code == 0, err
    lines = [line for line in err.splitlines() if "imported predictions are empty" in line]
    assert lines == [f"suite: {empty} of {len(rows)} imported predictions are empty (first: item {rows[0]['id']!r}) "
                     f"in {path}; scored as given (wrong; a format error for multiple choice), counted in "
                     f"{out / 'suite_results.json'} (empty_predictions)"], err
    results = json.loads((out / "suite_results.json").read_text(encoding="utf-8"))
    assert results["empty_predictions"] == empty
    expected, format_errors = reference(task, lang, rule, options(suite, task, lang, out, rule=rule),
                                        backend=Replay([a or "" for a in answers]))
    assert results["metrics"]["score"] == pytest.approx(expected)
    assert results["metrics"].get("format_error_rate") == (None if format_errors is None else
                                                           pytest.approx(format_errors))
    scored = [json.loads(l) for l in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    for row in scored[:empty]:      # a multiple-choice item's (a gold letter): a format error
        assert row["score"] == 0 and not row["generated"].strip(), row
        assert row["parsed"] is (False if isinstance(row["gold"], str) else None), row


def without_truncation(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "truncated_rate"}


def test_generation_rules_record_the_answers_cut_at_max_new_tokens(suite, tmp_path, capsys):
    """(#44) truncated_rate per cell beside the format errors, the truncated items listed in the results and the
    predictions, per item in the items file, one warning line above 5%."""
    cut = MAXM_ANSWERS[0]
    result = run_suite(options(suite, "maxm", "en", tmp_path / "cut"),
                       backend=FakeExamGenerative(answers=MAXM_ANSWERS, cut={cut}))
    rows = [json.loads(l) for l in (tmp_path / "cut/predictions.jsonl").read_text().splitlines()]
    expected = [r["id"] for r in rows if r["generated"] == cut]
    assert expected and result["truncated"] == expected and [r["truncated"] for r in rows] == \
        [r["generated"] == cut for r in rows]
    assert result["metrics"]["truncated_rate"] == pytest.approx(100.0 * len(expected) / len(rows))
    items = stats.read_items(tmp_path / "cut" / "test_en_items.jsonl")
    assert [v["truncated_rate"] for v in items.values()] == [100.0 * (r["generated"] == cut) for r in rows]
    opts = options(suite, "maxm", "en", tmp_path / "cut")
    data = TASKS["maxm"].reader(resolve(opts["data"]), "en", opts)        # (#44) each item names its image
    assert [v["cluster"] for v in items.values()] == ["+".join(map(str, item.images)) for item in data.items]
    warnings = [l for l in capsys.readouterr().err.splitlines() if "stopped at max_new_tokens" in l]
    assert len(warnings) == 1 and f"{len(expected)} of {len(rows)} answers" in warnings[0]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one(suite, tmp_path):
    task, lang = "xmmmu", "ja"
    one = run_suite(options(suite, task, lang, tmp_path / "one", chunk_size=1), backend=backend_for(task))
    data, more = data_of(suite, task)
    argv = ["--task", task, "--lang", lang, "--data", data, "--backend", "mllm", "--model", "/models/fake-vlm",
            "--output_dir", str(tmp_path / "two"), "--chunk_size", "1", "--batch_size", "3", "--no_progress"]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(_free_port()), str(REPO / "tests" / "helpers_suite_entry.py"), *argv],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = json.loads((tmp_path / "two" / "suite_results.json").read_text())
    assert two["world_size"] == 2 and two["metrics"] == one["metrics"]
    assert (tmp_path / "one/predictions.jsonl").read_text() == (tmp_path / "two/predictions.jsonl").read_text()


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from volta_ml.cli import main
    code = main(["suite", *argv])
    return code, capsys.readouterr().err.strip()


def _one_line_errors(cases, capsys) -> None:
    """Each (argv, pattern): exit 2 and one stderr line `volta-ml suite: error: ...` matching the pattern."""
    import re
    for args, pattern in cases:
        code, err = _cli(args, capsys)
        assert code == 2, (args, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("volta-ml suite: error: "), err
        assert re.search(pattern, lines[0]), (pattern, lines[0])


def _break(path: Path, fn) -> None:
    path.write_text(fn(path.read_text(encoding="utf-8")), encoding="utf-8")


def test_bad_inputs_are_one_line_exit_2(suite, tmp_path, capsys):
    """The schema, the language, the images, the rule: each a one-line error naming the file / field / item."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def argv(task, lang, data=None, **flags):
        d, more = data_of(suite, task)
        out = ["--task", task, "--lang", lang, "--data", data or d, "--backend", "mllm", "--model", "/m/none",
               "--output_dir", str(tmp_path / "out")]
        for key, value in {**more, **flags}.items():
            out += [f"--{key}", str(value)]
        return out

    maxm = tmp_path / "maxm"
    shutil.copytree(suite["maxm"], maxm)
    _break(maxm / "maxm_v1_en.json", lambda s: s.replace('"processed_answers"', '"processed"', 1))
    images = tmp_path / "images"
    shutil.copytree(suite["xm3600"]["images"], images)
    (images / "0004886b7d043cfd.jpg").unlink()
    mtvqa = tmp_path / "mtvqa.parquet"
    table = pq.read_table(next(Path(suite["mtvqa"]).rglob("*.parquet")))
    pq.write_table(table.drop_columns(["qa_pairs"]), mtvqa)
    kal = tmp_path / "kal" / "train-00000-of-00001.parquet"
    kal.parent.mkdir()
    rows = pq.read_table(next(Path(suite["kaleidoscope"]).rglob("*.parquet"))).to_pylist()
    rows[0]["answer"] = 7
    pq.write_table(pa.Table.from_pylist(rows), kal)
    shutil.copy(Path(suite["kaleidoscope"]) / "data.zip", kal.parent / "data.zip")
    m3 = tmp_path / "m3"
    shutil.copytree(suite["m3exam"], m3)
    _break(next(m3.rglob("thai-questions-image.json")), lambda s: s.replace('"answer_text": "ค"', '"answer_text": "ฮ"'))
    cases = [
        (argv("maxm", "en", str(maxm)), r"maxm_v1_en.json: annotations\[0\].qa_pairs\[0\]: processed_answers must be"),
        (argv("maxm", "de"), r"MaXM has no language 'de'; its languages: en, fr, hi, iw, ro, th, zh"),
        (argv("maxm", "en", images=images), r"1 of the 2 images the maxm en questions show are not under .*images .*0004886b7d043cfd.jpg"),
        (argv("mtvqa", "ja", str(mtvqa)), r"mtvqa.parquet: missing column\(s\) \['qa_pairs'\]"),
        (argv("mtvqa", "ko"), r"no MTVQA questions in language 'ko' \(languages found: de, ja\)"),
        (argv("kaleidoscope", "uk", str(kal.parent)), r"row 0: answer must be an option index 0-4, got 7"),
        (argv("m3exam", "th", str(m3)), r"question 1: answer_text 'ฮ' names none of the 4 options"),
        (argv("xm100", "en", subset=""), r"xm100: give --subset"),
        (argv("m3exam", "th", rule="nope"), r"--rule 'nope' does not apply to m3exam; known: generate, letter, pangea"),
        (argv("xm3600", "en", images=tmp_path / "nowhere"), r"4 of the 4 images the xm3600 en questions show are not under .*nowhere"),
    ]
    _one_line_errors(cases, capsys)


def test_images_that_do_not_decode_are_scored_without_and_listed(suite, tmp_path, capsys, monkeypatch):
    """As cvqa score and iglue-hf (hf/photos.py), from the CLI: a truncated image file (MaXM over XM3600's images,
    and XM3600 retrieval), a truncated parquet cell (MTVQA), an empty zip member stacked with two good ones
    (Kaleidoscope): exit 0, one stderr line, `failed_images` naming each, the question scored without it (a blank
    in a stacked canvas); a resumed run (every chunk reused) lists them too. A member missing from the zip is one
    line, exit 2."""
    import io
    import zipfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from helpers_fake_backends import FakeGenerative, install
    from volta_ml.hf.loading import blank_image
    from volta_ml.suite.images import stack

    install(monkeypatch)
    images = tmp_path / "images"
    shutil.copytree(suite["xm3600"]["images"], images)
    whole = (images / "000411001ff7dd4f.jpg").read_bytes()
    (images / "000411001ff7dd4f.jpg").write_bytes(whole[: len(whole) // 2])
    mtvqa = tmp_path / "mtvqa" / "test-00000-of-00001.parquet"
    mtvqa.parent.mkdir()
    rows = pq.read_table(next(Path(suite["mtvqa"]).rglob("*.parquet"))).to_pylist()
    rows[0]["image"] = {"bytes": rows[0]["image"]["bytes"][:len(rows[0]["image"]["bytes"]) // 2], "path": "cut.png"}
    pq.write_table(pa.Table.from_pylist(rows), mtvqa)
    kal = tmp_path / "kal"
    shutil.copytree(suite["kaleidoscope"], kal)
    with zipfile.ZipFile(Path(suite["kaleidoscope"]) / "data.zip") as source, \
            zipfile.ZipFile(kal / "data.zip", "w") as archive:
        for member in source.namelist():
            archive.writestr(member, b"" if member.endswith("o1.png") else source.read(member))
    cases = {  # task, lang, --data, flags, {failed name: what the decoder says}
        "maxm": ("en", suite["maxm"], ["--images", str(images)],
                 {str(images / "000411001ff7dd4f.jpg"): "OSError"}),
        "xm3600_retrieval": ("en", suite["xm3600"]["captions"], ["--images", str(images)],
                             {str(images / "000411001ff7dd4f.jpg"): "OSError"}),
        "mtvqa": ("ja", mtvqa.parent, [], {f"{mtvqa} row 0 column image": "OSError"}),
        "kaleidoscope": ("uk", kal, [], {f"{kal / 'data.zip'}:final_data/data/UA_physics/images/o1.png":
                                         "UnidentifiedImageError"}),
    }
    for task, (lang, data, flags, damaged) in cases.items():
        out = tmp_path / task
        argv = ["--task", task, "--lang", lang, "--data", str(data), *flags, "--backend",
                "clip" if task == "xm3600_retrieval" else "mllm", "--model", "/models/fake", "--output_dir", str(out),
                "--chunk_size", "1", "--batch_size", "2", "--keep_chunks", "--no_progress"]
        for run in ("first", "resumed"):
            code, err = _cli(argv, capsys)
            assert code == 0 and "Traceback" not in err, (task, err)
            warning = [line for line in err.splitlines() if "failed to decode" in line]
            assert len(warning) == 1 and warning[0].startswith(f"suite: 1 photo(s) failed to decode (first: "
                                                               f"{next(iter(damaged))}: "), err
            assert run == "first" or "reused" in err, err
            results = json.loads((out / "suite_results.json").read_text())
            assert list(results["failed_images"]) == list(damaged), (task, run)
            for name, kind in damaged.items():
                assert results["failed_images"][name].startswith(kind), results["failed_images"]
                assert "0x" not in results["failed_images"][name], results["failed_images"]   # no memory address
        if task == "xm3600_retrieval":
            continue
        # the reference, one question at a time with a fresh fake: a damaged image is None (a stacked blank)
        opts = options(suite, task, lang, out, data=str(data), images=flags[1] if flags else None)
        found = TASKS[task].reader(resolve(opts["data"]), lang, opts)
        fake, expected = FakeGenerative(), []
        for item in found.items:
            shown = [None if found.store.name(k) in damaged else found.store.load(k) for k in item.images]
            if len(shown) > fake.max_images:
                shown = [stack([blank_image() if im is None else im for im in shown])]
            expected.append(fake.generate([shown], [TASKS[task].prompt(item, "generate", None)],
                                          TASKS[task].max_new_tokens)[0])
        predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert [p["generated"] for p in predictions] == expected, task
        assert any(None in [None if found.store.name(k) in damaged else 1 for k in item.images]
                   for item in found.items)
    with zipfile.ZipFile(kal / "data.zip", "w") as archive:
        archive.writestr("final_data/data/UA_physics/images/q1.png", b"")
    code, err = _cli(["--task", "kaleidoscope", "--lang", "uk", "--data", str(kal), "--backend", "mllm", "--model",
                      "/models/fake", "--output_dir", str(tmp_path / "missing")], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("volta-ml suite: error: 3 of the 4 images the kaleidoscope uk questions show are not in "
                          f"{kal / 'data.zip'}; first missing: {kal / 'data.zip'}:final_data/data/UA_physics/images/"), err


def test_published_rows_and_the_sources_own_aggregates():
    """A source that prints only en and mul (Centurio's Table 5) shows its mul where the table has every language
    of the benchmark, nothing where it does not; per-language rows reproduce the mean their source prints."""
    from volta_ml.protocols.suite import PUBLISHED
    from volta_ml.protocols.suite_report import SuiteTable

    whole = SuiteTable("xm3600", "score", {"vlm": {l: 10.0 for l in SUITE["xm3600"].languages}}, PUBLISHED["xm3600"])
    rows = {r[0]: r for r in whole.rows()}
    assert rows["Centurio Qwen [Centurio] (published)"][1::len(rows["vlm"]) - 2] == [79.1, 34.4]
    part = SuiteTable("xm3600", "score", {"vlm": {"en": 1.0, "de": 2.0}}, PUBLISHED["xm3600"])
    assert [r[1:] for r in part.rows() if r[0].startswith("Centurio Qwen")] == [[79.1, None, None]]
    checked = 0
    for task, published in PUBLISHED.items():
        for name, (source, scores, own) in published.items():
            assert source and set(scores) <= set(SUITE[task].languages), (task, name)
            if "mul" in own and len(scores) == len(SUITE[task].languages):
                others = [v for lang, v in scores.items() if lang != "en"]
                assert abs(np.mean(others) - own["mul"]) <= 0.1, (task, name)     # rounding only
                checked += 1
    assert checked == 11


def test_iglue_tasks_are_rows_of_the_same_table():
    assert {"xvnli", "xgqa", "marvl", "xflickrco", "wit"} <= set(TASKS)
    assert all(TASKS[t].command == "iglue-hf" for t in ("xvnli", "xgqa", "marvl", "xflickrco", "wit"))
    assert {t for t, row in TASKS.items() if row.command == "suite"} == set(SUITE)
    for task, spec in SUITE.items():
        row = TASKS[task]
        assert row.kind == spec.kind and row.default_rule in row.rules and row.aggregate == spec.aggregate


def test_sweep_over_the_suite_into_the_report(suite, tmp_path):
    """A grid's `suite:` section: one `volta-ml suite` cell per model, task, rule and language, recorded by the
    sweep's record step (its full-precision metrics), then tabulated by `volta-ml report`."""
    import yaml

    from volta_ml.protocols.grid import load_grid
    from volta_ml.protocols.runners import plan_cells

    xm = suite["xm3600"]
    grid = {"name": "suite", "output_dir": str(tmp_path / "runs"), "baseline": "vlm",   # a `suite:` model's row
            "commands": {"suite": [sys.executable, str(REPO / "tests" / "helpers_suite_entry.py")]},
            "suite": {"tasks": ["maxm", "mtvqa", "m3exam", "xm3600_retrieval"],
                      "data": {"maxm": str(suite["maxm"]), "mtvqa": str(suite["mtvqa"]), "m3exam": str(suite["m3exam"]),
                               "xm3600_retrieval": str(xm["captions"])},
                      "images": {"maxm": str(xm["images"])},
                      "languages": {"maxm": ["en", "zh"], "mtvqa": ["ja", "de"], "m3exam": ["th"],
                                    "xm3600_retrieval": ["en", "de"]},
                      "models": {"vlm": {"backend": "mllm", "model": "/m/vlm", "rules": {"m3exam": ["generate", "letter"]}},
                                 "clip": {"backend": "clip", "model": "/m/clip"}}}}
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump(grid, allow_unicode=True))
    cells = sorted(c.id for c in plan_cells(load_grid(path)))
    # a dual encoder gets the retrieval cells, a generative model the rest; rules asked for: one cell each
    assert cells == ["suite/clip/xm3600_retrieval/de", "suite/clip/xm3600_retrieval/en",
                     "suite/vlm/m3exam/generate/th", "suite/vlm/m3exam/letter/th", "suite/vlm/maxm/en",
                     "suite/vlm/maxm/zh", "suite/vlm/mtvqa/de", "suite/vlm/mtvqa/ja"]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}")
    for command in (["sweep", str(path), "--local", "--only", "suite/vlm/maxm"],
                    ["report", "--grid", str(path), "--no_plots"]):
        proc = subprocess.run([sys.executable, "-m", "volta_ml.protocols.cli", *command], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "paired differences from the baseline row vlm" in proc.stdout       # the grid's baseline, in suite_baseline
    mine = {lang: json.loads((tmp_path / f"runs/suite/vlm/maxm/{lang}/eval/suite_results.json").read_text())
            ["metrics"]["score"] for lang in ("en", "zh")}
    record = json.loads((tmp_path / "runs/suite/vlm/maxm/zh/result.json").read_text())
    assert record["metrics"]["score"] == mine["zh"] and record["rule"] == "exact" and record["backend"] == "mllm"
    assert (tmp_path / "runs/report/MaXM.csv").read_text().splitlines()[:2] == [
        "model,en,zh,mul", f"vlm,{mine['en']!r},{mine['zh']!r},{mine['zh']!r}"]     # then the published rows


def test_the_example_grid_plans_every_task():
    from volta_ml.protocols.grid import load_grid
    from volta_ml.protocols.runners import plan_cells

    cells = plan_cells(load_grid(REPO / "examples" / "grids" / "suite.yml"))
    assert {c.task for c in cells} == set(SUITE) and all(c.commands[0].argv[3] == "suite" for c in cells)
    assert {c.task for c in cells if c.model == "mclip"} == {"xm3600_retrieval"}
    assert sum(c.task == "xm3600" and c.model == "pangea-7b" for c in cells) == 36


def test_suite_tiny_example_plans_the_documented_sweep(suite, tmp_path):
    """examples/suite_tiny.py (docs/suite.md, "A sweep on tiny models"): its grid over the tiny releases plans the 65
    cells the page says (57 shown in its run, MMMB's 8 run on their own), with the grid's baseline; without Java the caption cells take cider-pyptb; the page shows
    the commands the script prints."""
    import importlib.util

    from volta_ml.protocols.grid import load_grid
    from volta_ml.protocols.runners import plan_cells

    spec = importlib.util.spec_from_file_location("suite_tiny", REPO / "examples" / "suite_tiny.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    models = {name: tmp_path / name for name in ("llava", "qwen2-vl", "clip")}
    files = dict(suite, copies=script.build_copies(tmp_path / "data", suite))
    grid = load_grid(script.write_grid(tmp_path, files, models))
    cells = {c.id for c in plan_cells(grid)}
    assert len(cells) == 65 and grid.baseline == "llava" and "suite/llava/xmmmu/letter/ja" in cells
    assert {c for c in cells if "/mmmb/" in c} == {f"suite/{m}/mmmb/{r}/{l}" for m in ("llava", "qwen2-vl")
                                                  for r in ("vlmevalkit", "letter") for l in ("en", "zh")}
    # the hub copies it reads: PangeaBench's XM100 (no --subset) and floschne's XM3600 (no --images)
    argv = {c.id: [a for command in c.commands for a in command.argv] for c in plan_cells(grid)}
    xm100, retrieval = argv["suite/llava/xm100/en"], argv["suite/clip/xm3600_retrieval/th"]
    assert str(files["copies"]["xm100"]) in xm100 and "--subset" not in xm100 and "--images" not in retrieval
    assert str(files["copies"]["xm3600_retrieval"]) in retrieval
    no_java = {c.id for c in plan_cells(load_grid(script.write_grid(tmp_path, files, models, java=False)))}
    assert "suite/qwen2-vl/xm3600/cider-pyptb/th" in no_java and len(no_java) == 65
    text = (REPO / "docs" / "suite.md").read_text(encoding="utf-8")
    assert "57 ran" in text and "The grid plans 65 cells" in text and [line for line in script.COMMANDS.splitlines() if line not in text] == []


def csv_rows(path: Path) -> list[dict]:
    import csv
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_report_tables_published_rows_and_format_errors(suite, tmp_path):
    from volta_ml.protocols.results import collect
    from volta_ml.protocols.suite_report import write_suite_report

    runs = tmp_path / "runs"
    for task, lang, rule in [("mtvqa", "ja", None), ("mtvqa", "de", None), ("m3exam", "th", "generate"),
                             ("m3exam", "th", "letter"), ("xm3600_retrieval", "en", None),
                             ("xm3600_retrieval", "de", None), ("kaleidoscope", "en", None), ("kaleidoscope", "uk", None)]:
        run_suite(options(suite, task, lang, runs / f"{task}-{lang}-{rule}", rule=rule, name="vlm"),
                  backend=backend_for(task))
    report = tmp_path / "report"
    write_suite_report(collect(runs), report)
    mtvqa = (report / "MTVQA.csv").read_text().splitlines()
    # the paper averages all languages (no English here): mul and avg; published rows over the same columns
    assert mtvqa[0] == "model,de,ja,mul,avg" and mtvqa[2] == "InternVL2.5 78B (published),39.0,21.1,30.05,30.05"
    assert "partial: 2 of the benchmark's 9" in (report / "MTVQA.md").read_text()
    m3 = (report / "M3Exam.csv").read_text().splitlines()
    assert m3[0] == "model,th,mul" and [r.split(",")[0] for r in m3[1:3]] == ["vlm (generate)", "vlm (letter)"]
    # the Pangea paper's per-language rows, over the same column; Centurio's en / mul rows have nothing here
    assert m3[3] == "PANGEA-7B [Pangea] (published),32.9,32.9" and not any("Centurio" in r for r in m3)
    errors = (report / "M3Exam_format_errors.csv").read_text().splitlines()
    assert errors[0] == "model,th,mul" and errors[1].startswith("vlm (generate),") and len(errors) == 2
    # (#44) the generation rules' truncated answers per cell (the fake backend's: none cut)
    assert (report / "MTVQA_truncated.csv").read_text().splitlines()[1:] == ["vlm,0.0,0.0,0.0,0.0"]
    assert (report / "M3Exam_truncated.csv").read_text().splitlines()[1:] == ["vlm (generate),0.0,0.0"]
    assert (report / "XM3600_retrieval_ir_r1.csv").read_text().startswith("model,en,de,mul\nvlm,")
    kal = (report / "Kaleidoscope.csv").read_text().splitlines()
    assert kal[0] == "model,en,uk,mul,avg"
    summary = (report / "suite_summary.md").read_text()
    assert "MTVQA avg" in summary and "M3Exam mul" in summary and "XM3600_retrieval ir_r1 en" in summary
    rows = [r["model"] for r in csv_rows(report / "suite_summary.csv")]        # our rows first, then the published
    assert rows[:4] == ["vlm", "vlm (generate)", "vlm (letter)", "InternVL2.5 78B (published)"]
    # every run's per-item file averages to its metrics; the cells carry intervals; a baseline row is compared
    from volta_ml import stats
    for folder in ("mtvqa-ja-None", "m3exam-th-generate", "kaleidoscope-uk-None"):
        record = json.loads((runs / folder / "result.json").read_text())
        items = stats.read_items(runs / folder / record["items"])
        for metric in ("score", "format_error_rate"):
            values = stats.metric_values(items, metric)
            if metric in record["metrics"]:
                assert sum(values.values()) / len(values) == pytest.approx(record["metrics"][metric])
    assert "±" in (report / "MTVQA.md").read_text() and "±" in (report / "M3Exam_format_errors.md").read_text()
    assert "(published) | 39.00 |" in (report / "MTVQA.md").read_text()            # no interval: no items
    write_suite_report(collect(runs), report, baseline="vlm (letter)")
    row = next(r for r in csv_rows(report / "suite_baseline.csv") if r["table"] == "M3Exam" and r["column"] == "th")
    letter, generate = (stats.metric_values(stats.read_items(runs / f"m3exam-th-{rule}/test_th_items.jsonl"), "score")
                        for rule in ("letter", "generate"))
    expected = stats.compare_items(generate, letter)
    assert (row["A"], row["B"]) == ("vlm (generate)", "vlm (letter)")
    assert (float(row["difference"]), float(row["ci_low"]), float(row["p_value"])) == \
        (expected.difference, expected.low, expected.p_value)
    # no score without its interval but the published rows' (no items) and p-values
    from helpers_report_cells import bare_cells
    published = {r.split(",")[0] for name in ("MTVQA", "M3Exam", "Kaleidoscope", "XM3600_retrieval_ir_r1",
                                              "XM3600_retrieval_tr_r1", "suite_summary")
                 for r in (report / f"{name}.csv").read_text().splitlines() if "(published)" in r}
    assert bare_cells(report, exempt_columns=("p", "p (Holm)"), exempt_rows=published) == []


def test_vlmevalkit_tsv_read_as_vlmevalkit_reads_it(suite):
    """MMMB's TSV: a row without an image left out and counted, an image given as another row's index is that
    row's image, a list literal is several images, pandas' missing words ("None") are no option, the hint kept."""
    data = TASKS["mmmb"].reader(resolve(str(suite["mmmb"])), "en", {})
    assert [it.id for it in data.items] == ["0", "1", "2", "3"] and data.skipped == {"no image": 1}
    by_id = {it.id: it for it in data.items}
    assert by_id["2"].images == by_id["0"].images == (("0", 0),)              # index "0" as the image cell
    assert by_id["3"].images == (("3", 0), ("3", 1))
    assert by_id["2"].options == ("yes", "no", "cannot tell") and by_id["1"].options == ("1", "2", "3")
    assert by_id["1"].meta["hint"] == "Count the animals." and by_id["0"].meta["hint"] is None
    assert [data.store.load(k).size for k in by_id["3"].images] == [(12, 12), (11, 10)]
    generic = TASKS["vlmevalkit_mcq"].reader(resolve(str(suite["mmmb"]) + "/mmmb"), "cn", {})
    zh = TASKS["mmmb"].reader(resolve(str(suite["mmmb"])), "zh", {})
    assert [(it.id, it.options, it.answer, it.images) for it in generic.items] == \
        [(it.id, it.options, it.answer, it.images) for it in zh.items]


def test_vlmevalkit_tsv_bad_inputs_are_one_line_exit_2(suite, tmp_path, capsys):
    source = Path(suite["mmmb"]) / "mmmb" / "mmmb_en.tsv"
    lines = source.read_text(encoding="utf-8").splitlines()

    def variant(name: str, fn) -> str:
        path = tmp_path / name
        path.write_text("\n".join(fn(list(lines))) + "\n", encoding="utf-8")
        return str(path)

    def cell(row: int, column: str, value: str):
        def fn(rows):
            header = rows[0].split("\t")
            fields = rows[row].split("\t")
            fields[header.index(column)] = value
            rows[row] = "\t".join(fields)
            return rows
        return fn

    def argv(task, lang, data):
        return ["--task", task, "--lang", lang, "--data", data, "--backend", "mllm", "--model", "/m/none",
                "--output_dir", str(tmp_path / "out")]

    no_answer = variant("no_answer.tsv", lambda rows: ["\t".join(f for f in r.split("\t")[:7] + r.split("\t")[8:])
                                                       for r in rows])
    cases = [
        (argv("vlmevalkit_mcq", "en", no_answer), r"no_answer.tsv: missing column\(s\) \['answer'\]"),
        (argv("vlmevalkit_mcq", "en", variant("bad_answer.tsv", cell(2, "answer", "D"))),
         r"bad_answer.tsv: data row 2 \(index 1\): answer 'D' is not one of the option letters ABC"),
        (argv("vlmevalkit_mcq", "en", variant("gap.tsv", cell(1, "B", ""))),
         r"gap.tsv: data row 1 \(index 0\): option B is empty but a later one is not"),
        (argv("vlmevalkit_mcq", "en", variant("ref.tsv", cell(3, "image", "42"))),
         r"ref.tsv: data row 3 \(index 2\): image '42' is short, so the index of another row's image"),
        (argv("vlmevalkit_mcq", "en", variant("twice.tsv", cell(2, "index", "0"))),
         r"twice.tsv: data row 2: index 0 repeated \(data row 1\)"),
        (argv("vlmevalkit_mcq", "en", variant("list.tsv", cell(4, "image", "[" + "not base64 " * 8 + "]"))),
         r"list.tsv: data row 4 \(index 3\): image starts with '\[' but is not a list literal"),
        (argv("vlmevalkit_mcq", "e n", str(source)), r"VLMEvalKit_MCQ: language 'e n' is not a code"),
        (argv("vlmevalkit_mcq", "ko", str(source.parent)), r"mmmb: 0 TSVs of language 'ko' \(<lang>.tsv or "
                                                            r"\*_<lang>.tsv\); give --data FILE.tsv"),
        (argv("mmmb", "cn", str(suite["mmmb"])), r"MMMB has no language 'cn'; its languages: en, zh, pt, ar, tr, ru"),
        (argv("mmmb", "pt", str(suite["mmmb"])), r"MMMB file of language 'pt' \(mmmb_pt.tsv\) not found"),
    ]
    _one_line_errors(cases, capsys)


def test_a_format_without_languages_takes_the_grids_codes(tmp_path):
    """vlmevalkit_mcq has no languages of its own: the grid must name them, its cells take them, the report's
    table has the languages found (English first) and no "partial" caption."""
    import yaml

    from volta_ml.protocols.grid import GridError, load_grid
    from volta_ml.protocols.runners import plan_cells
    from volta_ml.protocols.suite_report import SuiteTable

    def grid(**section):
        path = tmp_path / "g.yml"
        path.write_text(yaml.safe_dump({"name": "g", "output_dir": str(tmp_path / "runs"), "suite": {
            "tasks": ["vlmevalkit_mcq"], "data": {"vlmevalkit_mcq": str(tmp_path)},
            "models": {"m": {"backend": "mllm", "model": "/m"}}, **section}}))
        return path

    with pytest.raises(GridError, match=r"suite.languages: give the languages of \['vlmevalkit_mcq'\]"):
        load_grid(grid())
    with pytest.raises(GridError, match=r"language 'k o' is not a code"):
        load_grid(grid(languages={"vlmevalkit_mcq": ["en", "k o"]}))
    cells = plan_cells(load_grid(grid(languages={"vlmevalkit_mcq": ["ko", "en"]})))
    assert sorted(c.id for c in cells) == ["suite/m/vlmevalkit_mcq/en", "suite/m/vlmevalkit_mcq/ko"]
    table = SuiteTable("vlmevalkit_mcq", "score", {"m": {"ko": 50.0, "en": 40.0, "ar": 30.0}})
    assert table.header() == ["model", "en", "ar", "ko", "mul"] and table.rows() == [["m", 40.0, 30.0, 50.0, 40.0]]
    assert "partial" not in table.caption()


def test_vlmevalkit_tsv_cells_as_pandas_reads_them(tmp_path):
    """What VLMEvalKit's pd.read_csv(sep="\\t") makes of the cells, written out by hand: its missing-value words are
    no option, a column of integers prints as integers, one with an empty cell or a decimal as floats; a quoted
    cell may hold a tab or a line break, and U+2028 / U+0085 inside a question end no line."""
    from volta_ml.suite.readers import read_vlmevalkit_tsv

    image = __import__("helpers_suite").b64("cells")
    rows = [["index", "question", "A", "B", "C", "D", "answer", "image"],
            ["7", "How many?\u2028Count\x85them", "1", "2", "3", "NA", "C", image],
            ["8", '"Two\tlines\nhere"', "4", "1.5", "", "", "B", "7"],
            ["9", "Which one?", "5", "6", "None", "x", "A", "7"]]
    path = tmp_path / "cells.tsv"
    path.write_text("\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"data row 3 \(index 9\): option C is empty but a later one is not"):
        read_vlmevalkit_tsv(path, "en", {})
    path.write_text("\n".join("\t".join(r) for r in rows[:3]) + "\n", encoding="utf-8")
    items = read_vlmevalkit_tsv(path, "en", {}).items
    assert [(it.id, it.question, it.options, it.answer) for it in items] == [
        ("7", "How many?\u2028Count\x85them", ("1", "2.0", "3.0"), 2),     # B holds 1.5 below: floats
        ("8", "Two\tlines\nhere", ("4", "1.5"), 1)]
    assert items[1].images == items[0].images == (("7", 0),)


def test_vlmevalkit_tsv_of_image_files(suite, tmp_path):
    """A meta-only TSV (no image column): image_path names the files, one or a list, relative to --images (by
    default the TSV's folder); a missing file is one line before any scoring."""
    import csv

    from helpers_suite import picture
    from volta_ml.iglue_hf.images import MissingImagesError

    (tmp_path / "imgs").mkdir()
    for name in ("a.png", "b.png"):
        picture(name).save(tmp_path / "imgs" / name)
    path = tmp_path / "meta_en.tsv"
    with open(path, "w", encoding="utf-8", newline="") as handle:
        out = csv.writer(handle, delimiter="\t", lineterminator="\n")
        out.writerow(["index", "question", "A", "B", "answer", "image_path"])
        out.writerow([1, "Which?", "x", "y", "A", "imgs/a.png"])
        out.writerow([2, "Both?", "x", "y", "B", repr(["imgs/a.png", "imgs/b.png"])])
    data = TASKS["vlmevalkit_mcq"].reader(path, "en", {})
    assert [it.images for it in data.items] == [("imgs/a.png",), ("imgs/a.png", "imgs/b.png")]
    assert data.store.load("imgs/b.png").size == picture("b.png").size
    elsewhere = TASKS["vlmevalkit_mcq"].reader(path, "en", {"images": str(tmp_path / "nowhere")})
    with pytest.raises(MissingImagesError, match=r"2 of the 2 images .* not under .*nowhere"):
        elsewhere.store.check([k for it in elsewhere.items for k in it.images], "the vlmevalkit_mcq en questions")


def test_vlmevalkit_tsv_image_that_does_not_decode_is_listed(suite, tmp_path):
    """A base64 cell that is no image (or no base64 at all) is what cvqa score makes of an undecodable photo: the
    question is scored without it and failed_images names the TSV, index and image."""
    source = Path(suite["mmmb"]) / "mmmb" / "mmmb_en.tsv"
    rows = source.read_text(encoding="utf-8").splitlines()
    header = rows[0].split("\t")
    fields = rows[2].split("\t")
    fields[header.index("image")] = "QUJD" * 30                    # base64 of "ABC...": no image
    rows[2] = "\t".join(fields)
    path = tmp_path / "broken_en.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = run_suite({**options(suite, "vlmevalkit_mcq", "en", tmp_path / "out"), "data": str(path)},
                       backend=backend_for("vlmevalkit_mcq"))
    assert list(result["failed_images"]) == [f"{path} index 1 image 0"] and result["n_items"] == 4
