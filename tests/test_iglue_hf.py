"""IGLUE tasks with Hugging Face backends: every task x backend kind on subsets of the real IGLUE files with
generated images; scores equal a direct computation, sharding and resuming change nothing, the report places
the rows into IGLUE's CSVs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, shared_path
from helpers_fake_backends import FailingAfter, FakeDual, FakeGenerative
from helpers_iglue_hf import build_data_root, make_images
from volta_ml.engine.failures import UsageError
from volta_ml.iglue_hf.data import read_task
from volta_ml.iglue_hf.images import DEFAULT_TEMPLATES, ImageSource, MissingImagesError, side_by_side
from volta_ml.iglue_hf.prompts import OPTIONS, letter_choices, user_turn
from volta_ml.iglue_hf.run import annotation_path, run_iglue_hf
from volta_ml.iglue_hf.scoring import normalise_answer
from volta_ml.iglue_hf.tasks import BackendTaskError
from volta_ml.stats import metric_values, read_items


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """data_root with IGLUE's layout (real rows) and an image root holding every image those rows name."""
    shared = shared_path("iglue", "datasets")
    tmp = tmp_path_factory.mktemp("iglue_hf")
    root = build_data_root(shared, tmp / "datasets")
    images = tmp / "images"
    for task, lang, protocol in [("xvnli", "ar", "zero-shot"), ("xvnli", "ar", "translate-test"),
                                 ("xvnli", "en", "zero-shot"), ("xflickrco", "de", "zero-shot"),
                                 ("xflickrco", "de", "translate-test"), ("wit", "ar", "zero-shot"),
                                 ("marvl", "id", "zero-shot"), ("marvl", "id", "translate-test")]:
        make_images(task, Path(annotation_path(task, lang, protocol, str(root), None)), lang, images / task)
    make_images("xgqa", root / "xGQA/annotations/few_shot/de/train_5.json", "de", images / "xgqa")
    return {"root": root, "images": images, "tmp": tmp}


def options(world, task, lang, out, protocol="zero-shot", **extra):
    opts = {"task": task, "backend": "fake", "model": "/models/fake-model", "lang": lang, "protocol": protocol,
            "images": str(world["images"] / task), "output_dir": str(out), "data_root": str(world["root"]),
            "progress": False, "batch_size": 3, "chunk_size": 5}
    if task == "xgqa":
        opts["annotations"] = str(world["root"] / "xGQA/annotations/few_shot/de/train_5.json")
    opts.update(extra)
    return opts


def reference_accuracy(backend, task, rule, examples, source, layout=None, vocabulary=None, max_new_tokens=10):
    """One example at a time, straight from the backend."""
    correct = 0
    for e in examples:
        images = [source.load(r) for r in e.images]
        if layout == "canvas":
            images = [side_by_side(*images)]
        prompt = user_turn(task, rule, e, layout, getattr(backend, "vqa_frame", None))
        if rule == "letter":
            pred = OPTIONS[task][int(backend.choice_logits([images], [prompt], letter_choices(task)).argmax())]
        elif rule == "likelihood":
            words = [" " + w for w in OPTIONS[task]]
            pred = OPTIONS[task][int(backend.continuation_logprobs([images], [prompt], [words])[0].argmax())]
        elif rule == "generate" and task in OPTIONS:      # multiple choice by generation: parsed, "" = unparsed
            from volta_ml.hf.mllm import parse_choice
            k = parse_choice(backend.generate([images], [prompt], max_new_tokens)[0], letter_choices(task),
                             OPTIONS[task])
            pred = "" if k is None else OPTIONS[task][k]
        elif rule == "generate":
            pred = normalise_answer(backend.generate([images], [prompt], max_new_tokens)[0])
        else:
            words = [" " + w for w in vocabulary]
            pred = vocabulary[int(backend.continuation_logprobs([images], [prompt], [words])[0].argmax())]
        correct += pred == e.label
    return 100.0 * correct / len(examples)


@pytest.mark.parametrize("rule", ["letter", "likelihood", "generate"])
@pytest.mark.parametrize("protocol", ["zero-shot", "translate-test"])
def test_xvnli_scores_equal_direct_computation(world, tmp_path, capsys, rule, protocol):
    backend = FakeGenerative()
    opts = options(world, "xvnli", "ar", tmp_path, protocol, rule=rule)
    result = run_iglue_hf(opts, backend=backend)
    ann = annotation_path("xvnli", "ar", protocol, str(world["root"]), None)
    assert ("machine-translate" in ann) == (protocol == "translate-test")
    examples = read_task("xvnli", ann, "ar")
    source = ImageSource(opts["images"], DEFAULT_TEMPLATES["xvnli"])
    expected = reference_accuracy(FakeGenerative(), "xvnli", rule, examples, source)
    assert result["metrics"]["score"] == pytest.approx(expected)
    assert result["first_prompt_rendered"] == backend.render(user_turn("xvnli", rule, examples[0]), 1)
    assert f"Validation [XVNLI]: loss 0.000 score {expected:.3f}" in capsys.readouterr().err
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["protocol"] == protocol.replace("-", "_") and record["model"] == "fake-model"
    rows = [json.loads(l) for l in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == len(examples) == 24 and not (tmp_path / "test_ar_chunks").exists()
    # the per-item file of the intervals: one row per example, named as the zoo names it, averaging to the score
    split = "test_ar" + ("_mt" if protocol == "translate-test" else "")
    assert record["items"] == f"{split}_items.jsonl"
    items = read_items(tmp_path / record["items"])
    assert list(items) == [e.id for e in examples]
    for metric in result["metrics"]:            # score, and the generate rule's parse_failure_rate
        assert np.mean([v[metric] for v in items.values()]) == pytest.approx(result["metrics"][metric])
    assert ("parse_failure_rate" in result["metrics"]) == (rule == "generate")


@pytest.mark.parametrize("rule", ["generate", "closed"])
def test_xgqa_scores_equal_direct_computation(world, tmp_path, capsys, rule):
    vocabulary = ["yes", "no", "red car", "left", "right", "table"]
    opts = options(world, "xgqa", "de", tmp_path, rule=rule, vocabulary=vocabulary if rule == "closed" else None)
    result = run_iglue_hf(opts, backend=FakeGenerative(answers=("Yes.", "no", "The red car.", "left\nbecause")))
    examples = read_task("xgqa", opts["annotations"], "de")
    expected = reference_accuracy(FakeGenerative(answers=("Yes.", "no", "The red car.", "left\nbecause")), "xgqa",
                                  rule, examples, ImageSource(opts["images"], "{id}.jpg"), vocabulary=vocabulary)
    assert result["metrics"]["score"] == pytest.approx(expected)
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(expected)   # GQA_score's bare float


class PlainStrings(FakeGenerative):
    """A backend whose answers are plain strings: whether they were cut short is unknown (as an imported run)."""

    def generate(self, images, prompts, max_new_tokens):
        return [str(a) for a in super().generate(images, prompts, max_new_tokens)]


def test_xgqa_generate_records_the_answers_cut_at_max_new_tokens(world, tmp_path, capsys):
    """(#44) truncated_rate beside the score, the truncated items listed, one warning line above 5%; a backend that
    does not say records "unknown", not 0."""
    answers = ("Yes.", "no", "The red car.", "left\nbecause")
    opts = options(world, "xgqa", "de", tmp_path / "cut", rule="generate")
    result = run_iglue_hf(opts, backend=FakeGenerative(answers=answers, cut={"The red car."}))
    examples = read_task("xgqa", opts["annotations"], "de")
    rows = [json.loads(l) for l in (tmp_path / "cut" / "predictions.jsonl").read_text().splitlines()]
    cut = [e.id for e, r in zip(examples, rows) if r["generated"] == "The red car."]
    assert cut and [r["truncated"] for r in rows] == [r["generated"] == "The red car." for r in rows]
    assert result["truncated"] == cut
    assert result["metrics"]["truncated_rate"] == pytest.approx(100.0 * len(cut) / len(examples))
    items = read_items(tmp_path / "cut" / "test_de_items.jsonl")
    assert [v["truncated_rate"] for v in items.values()] == [100.0 * (i in cut) for i in items]
    # (#44) each item names the image it asks about: the intervals resample images (xGQA: several per scene)
    assert [v["cluster"] for v in items.values()] == ["+".join(ref.id for ref in e.images) for e in examples]
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "max_new_tokens" in line]
    assert len(warnings) == 1 and f"xgqa generate: {len(cut)} of {len(examples)} answers" in warnings[0], err
    result = run_iglue_hf(options(world, "xgqa", "de", tmp_path / "plain", rule="generate"),
                          backend=PlainStrings(answers=answers))
    assert result["truncated"] == "unknown" and result["metrics"]["truncated_rate"] is None
    assert "truncated_rate" not in next(iter(read_items(tmp_path / "plain" / "test_de_items.jsonl").values()))
    assert "max_new_tokens, not at an end token" not in capsys.readouterr().err
    result = run_iglue_hf(options(world, "xgqa", "de", tmp_path / "none", rule="generate"),
                          backend=FakeGenerative(answers=answers))
    assert result["truncated"] == [] and result["metrics"]["truncated_rate"] == 0.0


def test_xgqa_closed_names_both_vocabulary_files(world, tmp_path):
    """The closed rule reads VOLTA's GQA vocabulary: both trainval_ans2label and trainval_label2ans."""
    opts = options(world, "xgqa", "de", tmp_path, rule="closed", vocabulary=None, data_root=None)
    with pytest.raises(UsageError) as err:
        run_iglue_hf(opts, backend=FakeGenerative())
    assert "trainval_ans2label.json" in str(err.value) and "trainval_label2ans.json" in str(err.value)
    root = tmp_path / "root"
    (root / "gqa/annotations").mkdir(parents=True)
    (root / "gqa/annotations/trainval_label2ans.json").write_text('["yes", "no"]')
    opts = options(world, "xgqa", "de", tmp_path / "out", rule="closed", vocabulary=None, data_root=str(root))
    with pytest.raises(FileNotFoundError, match="trainval_ans2label.json"):
        run_iglue_hf(opts, backend=FakeGenerative())


def test_gqa_answer_normalisation():
    assert normalise_answer("The red car.") == "red car"
    assert normalise_answer("  Yes!\nBecause the sky") == "yes"
    assert normalise_answer("an  apple") == "apple"
    assert normalise_answer("") == ""


@pytest.mark.parametrize("max_images,layout", [(1, "canvas"), (2, "multi")])
def test_marvl_canvas_or_two_images(world, tmp_path, max_images, layout):
    opts = options(world, "marvl", "id", tmp_path, rule="letter")
    result = run_iglue_hf(opts, backend=FakeGenerative(max_images=max_images))
    examples = read_task("marvl", annotation_path("marvl", "id", "zero-shot", str(world["root"]), None), "id")
    source = ImageSource(opts["images"], DEFAULT_TEMPLATES["marvl"])
    expected = reference_accuracy(FakeGenerative(max_images=max_images), "marvl", "letter", examples, source, layout)
    assert result["marvl_layout"] == layout and result["metrics"]["score"] == pytest.approx(expected)
    assert result["first_prompt_rendered"].count("<image>") == max_images


def test_side_by_side_canvas():
    from PIL import Image
    left, right = Image.new("RGB", (10, 20), "red"), Image.new("RGB", (30, 10), "blue")
    canvas = side_by_side(left, right)
    assert canvas.size == (5 + 30, 10)
    assert canvas.getpixel((0, 0)) == (255, 0, 0) and canvas.getpixel((34, 9)) == (0, 0, 255)


def brute_force_recalls(scores: np.ndarray, caption_image: list[int]) -> dict:
    ir = [list(np.argsort(-row, kind="stable")).index(g) for row, g in zip(scores, caption_image)]
    tr = []
    for image in range(scores.shape[1]):
        order = list(np.argsort(-scores[:, image], kind="stable"))
        tr.append(min(order.index(c) for c, g in enumerate(caption_image) if g == image))
    out = {}
    for prefix, ranks in (("ir", np.array(ir)), ("tr", np.array(tr))):
        for k in (1, 5, 10):
            out[f"{prefix}_r{k}"] = 100.0 * float(np.mean(ranks < k))
    return out


@pytest.mark.parametrize("task,lang,protocol", [("xflickrco", "de", "zero-shot"), ("xflickrco", "de", "translate-test"),
                                                ("wit", "ar", "zero-shot")])
def test_retrieval_recalls_equal_brute_force(world, tmp_path, capsys, task, lang, protocol):
    backend = FakeDual()
    opts = options(world, task, lang, tmp_path, protocol)
    result = run_iglue_hf(opts, backend=backend)
    data = read_task(task, annotation_path(task, lang, protocol, str(world["root"]), None), lang)
    source = ImageSource(opts["images"], DEFAULT_TEMPLATES[task])
    texts = FakeDual().embed_texts(data.captions).numpy()
    images = FakeDual().embed_images([source.load(r) for r in data.images]).numpy()
    expected = brute_force_recalls(texts @ images.T, data.caption_image)
    for key, value in expected.items():
        assert result["metrics"][key] == pytest.approx(value), key
    split = result["split"]
    assert len(json.loads((tmp_path / f"{split}_result.json").read_text())) == len(data.captions)
    assert np.load(tmp_path / f"{split}_scores.npy").shape == (len(data.captions), len(data.images))
    finals = [l for l in capsys.readouterr().out.splitlines() if l.startswith("Final")]
    assert len(finals) == 2 and finals[0].startswith("Final r1:%.3f" % expected["ir_r1"])
    items = read_items(tmp_path / f"{split}_items.jsonl")      # per query: its hits, averaging to the recalls
    for prefix, kind, n in (("ir", "caption", len(data.captions)), ("tr", "image", len(data.images))):
        for k in (1, 5, 10):
            values = metric_values(items, f"{prefix}_r{k}")
            assert list(values) == [f"{kind}:{i}" for i in range(n)]
            assert sum(values.values()) / n == pytest.approx(expected[f"{prefix}_r{k}"])


@pytest.mark.parametrize("task,backend_factory", [("xvnli", FakeGenerative), ("xflickrco", FakeDual)])
def test_resume_equals_uninterrupted(world, tmp_path, task, backend_factory):
    lang = "ar" if task == "xvnli" else "de"
    whole = run_iglue_hf(options(world, task, lang, tmp_path / "whole"), backend=backend_factory())
    with pytest.raises(RuntimeError, match="interrupted"):
        run_iglue_hf(options(world, task, lang, tmp_path / "cut"), backend=FailingAfter(backend_factory(), 5))
    again = backend_factory()
    resumed = run_iglue_hf(options(world, task, lang, tmp_path / "cut"), backend=again)
    assert resumed["metrics"] == whole["metrics"]
    total = backend_factory()
    run_iglue_hf(options(world, task, lang, tmp_path / "count"), backend=total)
    assert 0 < again.calls < total.calls            # the saved chunks were reused, not recomputed
    split = whole["split"]
    for name in ("predictions.jsonl",) if task == "xvnli" else (f"{split}_result.json",):
        assert (tmp_path / "whole" / name).read_text() == (tmp_path / "cut" / name).read_text()


@pytest.mark.parametrize("task", ["xvnli", "xflickrco"])
def test_two_processes_equal_one(world, tmp_path, task):
    lang = "ar" if task == "xvnli" else "de"
    one = run_iglue_hf(options(world, task, lang, tmp_path / "one"),
                       backend=FakeGenerative() if task == "xvnli" else FakeDual())
    opts = options(world, task, lang, tmp_path / "two")
    spec = tmp_path / "options.json"
    spec.write_text(json.dumps(opts))
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(_free_port()), str(REPO / "tests" / "helpers_iglue_hf_entry.py"), str(spec)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = json.loads((tmp_path / "two" / "iglue_hf_results.json").read_text())
    assert two["world_size"] == 2 and two["metrics"] == one["metrics"]
    name = "predictions.jsonl" if task == "xvnli" else f"{one['split']}_result.json"
    assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_report_places_rows_beside_the_zoo(world, tmp_path):
    from volta_ml.protocols.report import write_report
    from volta_ml.protocols.results import collect

    runs = tmp_path / "runs"
    for lang, protocol in [("ar", "zero-shot"), ("en", "zero-shot"), ("ar", "translate-test")]:
        run_iglue_hf(options(world, "xvnli", lang, runs / f"xvnli-{lang}-{protocol}", protocol, name="mllm-letter"),
                     backend=FakeGenerative())
    run_iglue_hf(options(world, "xflickrco", "de", runs / "flickr-de", name="clip"), backend=FakeDual())
    zoo = runs / "experiments" / "uc2" / "xvnli"                 # an IGLUE log of the zoo, read as IGLUE does
    zoo.mkdir(parents=True)
    (zoo / "test.ar.err").write_text("Validation [XVNLI]: loss 1.000 score 55.000 \n")
    (zoo / "test.ar.out").write_text("")
    write_report(collect(runs), tmp_path / "report")
    zero = (tmp_path / "report" / "XVNLI_0.csv").read_text().splitlines()
    mine = json.loads((runs / "xvnli-ar-zero-shot" / "iglue_hf_results.json").read_text())["metrics"]["score"]
    english = json.loads((runs / "xvnli-en-zero-shot" / "iglue_hf_results.json").read_text())["metrics"]["score"]
    assert zero[0] == "model,en,ar,avg"
    assert zero[1].startswith("uc2,-1.0,55.0")
    assert zero[2] == f"mllm-letter,{english!r},{mine!r},{mine!r}"
    assert (tmp_path / "report" / "XVNLI_0.mt.csv").read_text().splitlines()[1].startswith(f"mllm-letter,{english!r},")
    ir = (tmp_path / "report" / "xFlickrCO_ir_0.csv").read_text().splitlines()
    assert ir[0] == "model,de,avg" and ir[1].startswith("clip,")


def test_two_rules_without_a_name_are_two_rows_not_one_average(world, tmp_path):
    """Issue 23 item 6: a letter and a likelihood run of one model folder, both named after it, used to become one
    row with the mean of the two scores."""
    from volta_ml.protocols.report import write_report
    from volta_ml.protocols.results import collect

    runs = tmp_path / "runs"
    scores = {}
    for rule in ("letter", "likelihood"):
        result = run_iglue_hf(options(world, "xvnli", "ar", runs / rule, rule=rule), backend=FakeGenerative())
        scores[rule] = result["metrics"]["score"]
    assert scores["letter"] != scores["likelihood"]
    write_report(collect(runs), tmp_path / "report")
    rows = (tmp_path / "report" / "XVNLI_0.csv").read_text().splitlines()
    assert rows == ["model,ar,avg"] + [f"fake-model ({rule}),{scores[rule]!r},{scores[rule]!r}"
                                       for rule in ("letter", "likelihood")]


def test_missing_images_are_listed(world, tmp_path):
    images = tmp_path / "few"
    images.mkdir()
    with pytest.raises(MissingImagesError, match=r"of the images .*test.jsonl names are not under .*first missing: "
                                                 r".*\.jpg, .*\.jpg"):
        run_iglue_hf(options(world, "xvnli", "ar", tmp_path, images=str(images)), backend=FakeGenerative())


@pytest.mark.parametrize("task,backend,can", [("xvnli", FakeDual(), "xflickrco, wit"),
                                              ("wit", FakeGenerative(), "xvnli, xgqa, marvl")])
def test_backend_that_cannot_do_the_task(world, tmp_path, task, backend, can):
    lang = "ar"
    with pytest.raises(BackendTaskError, match=f"cannot do {task}.*can do: {can}"):
        run_iglue_hf(options(world, task, lang, tmp_path), backend=backend)


def test_cli_usage_errors_exit_2(world, tmp_path, capsys):
    from volta_ml.cli import main
    code = main(["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", "m", "--lang", "ar",
                 "--images", str(tmp_path / "nothing"), "--data_root", str(world["root"]),
                 "--output_dir", str(tmp_path / "out")])
    assert code == 2
    assert "volta-ml iglue-hf: error: 8 of the images" in capsys.readouterr().err


def test_sweep_cells_for_hf_models_and_report(world, tmp_path):
    """A grid with `hf:` models: volta-ml iglue-hf cells per task x language x protocol, recorded by the sweep's
    own record step from the zoo's log lines, and tabulated beside each other."""
    import yaml

    from volta_ml.protocols.grid import load_grid
    from volta_ml.protocols.runners import plan_cells

    grid = {"name": "hf", "data_root": str(world["root"]), "output_dir": str(tmp_path / "runs"),
            "tasks": ["xvnli", "xflickrco", "marvl"], "protocols": ["zero_shot", "translate_test"],
            "languages": {"xvnli": ["ar"], "xflickrco": ["de"], "marvl": ["id"]},
            "images": {t: str(world["images"] / t) for t in ("xvnli", "xflickrco", "marvl")},
            "models": {"mllm-letter": {"hf": {"backend": "mllm", "model": "/m/llava", "rules": {"xvnli": "letter"},
                                              "batch_size": 4}},
                       "clip": {"hf": {"backend": "clip", "model": "/m/clip"}}},
            "commands": {"iglue_hf": [sys.executable, str(REPO / "tests" / "helpers_iglue_hf_fake_cli.py")]}}
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    cells = {c.id: c for c in plan_cells(load_grid(path))}
    # a dual encoder gets the retrieval cells, a generative model the others; MaRVL has no English file here
    assert sorted(i for i in cells if i.startswith("zero_shot/")) == [
        "zero_shot/clip/xflickrco/de", "zero_shot/clip/xflickrco/en", "zero_shot/mllm-letter/marvl/id",
        "zero_shot/mllm-letter/xvnli/ar", "zero_shot/mllm-letter/xvnli/en"]
    assert sorted(i for i in cells if i.startswith("translate_test/")) == [
        "translate_test/clip/xflickrco/de", "translate_test/mllm-letter/marvl/id", "translate_test/mllm-letter/xvnli/ar"]
    argv = cells["translate_test/mllm-letter/xvnli/ar"].commands[0].argv
    assert argv[2:4] == ["--task", "xvnli"] and "--rule" in argv and "translate-test" in argv
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}")
    proc = subprocess.run([sys.executable, "-m", "volta_ml.protocols.cli", "sweep", str(path), "--local",
                           "--only", "zero_shot/mllm-letter/xvnli/ar", "--only", "translate_test/mllm-letter/xvnli",
                           "--only", "zero_shot/clip/xflickrco/de"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "runs/zero_shot/mllm-letter/xvnli/ar/result.json").read_text())
    mine = json.loads((tmp_path / "runs/zero_shot/mllm-letter/xvnli/ar/eval/iglue_hf_results.json").read_text())
    assert record["metrics"] == mine["metrics"]          # full precision, as a standalone run records it
    assert record["items"] == "eval/test_ar_items.jsonl"  # the record step found the per-item file
    record = json.loads((tmp_path / "runs/zero_shot/clip/xflickrco/de/result.json").read_text())
    mine = json.loads((tmp_path / "runs/zero_shot/clip/xflickrco/de/eval/iglue_hf_results.json").read_text())
    assert record["metrics"] == mine["metrics"] and len(record["metrics"]) == 10
    assert record["items"] == "eval/test_de_items.jsonl"
    assert not (tmp_path / "runs/zero_shot/mllm-letter/xvnli/ar/eval/result.json").exists()
    proc = subprocess.run([sys.executable, "-m", "volta_ml.protocols.cli", "report", str(tmp_path / "runs"),
                           "--no_plots"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = tmp_path / "runs" / "report"
    assert (report / "XVNLI_0.csv").read_text().splitlines()[1].startswith("mllm-letter,")
    assert (report / "XVNLI_0.mt.csv").read_text().splitlines()[1].startswith("mllm-letter,")
    assert (report / "xFlickrCO_tr_0.csv").read_text().splitlines()[1].startswith("clip,")
    assert "±" in (report / "XVNLI_0.md").read_text() and "±" in (report / "xFlickrCO_tr_0.md").read_text()


def test_grid_rejects_hf_models_in_training_protocols(world, tmp_path):
    import yaml

    from volta_ml.protocols.grid import GridError, load_grid
    from volta_ml.protocols.runners import plan_cells

    base = {"data_root": str(world["root"]), "tasks": ["xvnli"], "images": {"xvnli": "/img"}}
    path = tmp_path / "g.yml"
    path.write_text(yaml.safe_dump(dict(base, protocols=["few_shot"], models={"m": {"hf": {"backend": "mllm",
                                                                                          "model": "x"}}})))
    with pytest.raises(GridError, match="few_shot starts from the English fine-tuned model; give hf.train"):
        plan_cells(load_grid(path))
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "sweep", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "give hf.train" in proc.stderr.strip().splitlines()[-1]
    path.write_text(yaml.safe_dump(dict(base, models={"m": {"hf": {"backend": "mllm", "model": "x", "dtyp": 1}}})))
    with pytest.raises(GridError, match=r"models.m.hf: unknown key\(s\) \['dtyp'\]"):
        load_grid(path)


def test_text_base_flag_goes_into_the_backend_extra(world, tmp_path, monkeypatch):
    """`volta-ml iglue-hf --text_base X` is M-CLIP's `extra["text_base"]`, next to the --extra options."""
    from volta_ml.cli import main
    from volta_ml.iglue_hf import run

    class Loaded(BaseException):   # past the command's error handling
        pass

    def load_backend(kind, model, options):
        raise Loaded(options["extra"])
    monkeypatch.setattr(run, "load_backend", load_backend)
    with pytest.raises(Loaded) as loaded:
        main(["iglue-hf", "--task", "xflickrco", "--backend", "mclip", "--model", "/m", "--lang", "de",
              "--data_root", str(world["root"]), "--images", str(world["images"] / "xflickrco"),
              "--output_dir", str(tmp_path), "--extra", '{"image_model": "/clip"}', "--text_base", "/xlmr-large"])
    assert loaded.value.args[0] == {"image_model": "/clip", "text_base": "/xlmr-large"}


def test_cli_one_line_for_user_errors_only(monkeypatch, capsys):
    """`volta-ml iglue-hf` turns what a user's flags, files or model cause into one line (exit 2); any other
    exception is a bug and keeps its traceback (it used to be any KeyError / ValueError)."""
    import argparse

    from volta_ml.hf import ModelLoadError
    from volta_ml.iglue_hf import cli, run

    for error, code in ((UsageError("--rule x does not apply to xvnli"), 2), (ModelLoadError("m: no config.json"), 2),
                        (ValueError("3 image lists for 2 prompts"), None), (KeyError("input_ids"), None)):
        def fail(options, error=error):
            raise error
        monkeypatch.setattr(run, "run_iglue_hf", fail)
        if code is None:
            with pytest.raises(type(error)):
                cli.run_command(argparse.Namespace(task="xvnli"))
        else:
            assert cli.run_command(argparse.Namespace(task="xvnli")) == code
            assert capsys.readouterr().err.strip() == f"volta-ml iglue-hf: error: {error}"


def test_sweep_plans_vllm_models_as_generative_cells(world, tmp_path):
    """An `hf: {backend: vllm}` model gets the generative cells (not retrieval), each a `volta-ml iglue-hf
    --backend vllm` command carrying its engine options (docs/engines.md)."""
    import yaml

    from volta_ml.protocols.grid import load_grid
    from volta_ml.protocols.runners import plan_cells

    grid = {"name": "hf", "data_root": str(world["root"]), "output_dir": str(tmp_path / "runs"),
            "tasks": ["xvnli", "xflickrco"], "protocols": ["zero_shot"], "languages": {"xvnli": ["ar"], "xflickrco": ["de"]},
            "images": {t: str(world["images"] / t) for t in ("xvnli", "xflickrco")},
            "models": {"llava-vllm": {"hf": {"backend": "vllm", "model": "/m/llava", "rules": {"xvnli": "letter"},
                                             "extra": {"tensor_parallel_size": 2}}}}}
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    cells = {c.id: c for c in plan_cells(load_grid(path))}
    assert sorted(cells) == ["zero_shot/llava-vllm/xvnli/ar", "zero_shot/llava-vllm/xvnli/en"]
    argv = cells["zero_shot/llava-vllm/xvnli/ar"].commands[0].argv
    assert argv[argv.index("--backend") + 1] == "vllm"
    assert json.loads(argv[argv.index("--extra") + 1]) == {"tensor_parallel_size": 2}


def test_engine_record_is_in_results_and_resume_key(world, tmp_path):
    """A backend that carries `engine` (vllm: engine, version, options) has it recorded in the results and in the
    chunks' content key: the same engine reuses saved chunks, another version recomputes them."""
    def backend(version):
        fake = FakeGenerative()
        fake.engine = {"engine": "vllm", "version": version, "options": {"tensor_parallel_size": 1}}
        return fake

    first = run_iglue_hf(options(world, "xvnli", "ar", tmp_path, keep_chunks=True), backend=backend("1.0"))
    assert first["engine"] == backend("1.0").engine
    same, other = backend("1.0"), backend("1.1")
    run_iglue_hf(options(world, "xvnli", "ar", tmp_path, keep_chunks=True), backend=same)
    assert same.calls == 0                           # every chunk reused
    again = run_iglue_hf(options(world, "xvnli", "ar", tmp_path, keep_chunks=True), backend=other)
    assert other.calls > 0 and again["metrics"] == first["metrics"] and again["engine"]["version"] == "1.1"
