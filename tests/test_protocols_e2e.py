"""A small IGLUE grid end to end on CPU with the real entry points: `volta-ml sweep --local` runs
`volta-ml eval` and `volta-ml gqa-score` (and `volta-ml train` for few-shot once it is available) on a tiny
model, generated feature stores and the real IGLUE annotation files; `volta-ml report` then builds the tables
and plots. The checkpoints' heads always predict one class, so every score is known from the annotation
files alone."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

from helpers_eval import build_checkpoint, link, tiny_config_file
from helpers_tasks import IGLUE, bert_uncased_dir, make_store, need_iglue, read_jsonl
from volta_ml.stats import metric_values, read_items

ENTAILMENT, YES = 2, 1773          # XVNLI label index; trainval_ans2label["yes"]
FEATURE_DIM = 16


def data_root(root: Path) -> Path:
    """IGLUE's datasets/ layout: real annotation files (linked) and generated feature stores."""
    ve_files = ["XVNLI/annotations/en/test.jsonl", "XVNLI/annotations/ar/test.jsonl",
                "XVNLI/annotations_machine-translate/ar/test.jsonl", "XVNLI/annotations/ar/train_1.jsonl"]
    for f in ve_files:
        link(IGLUE / f, root / f)
    link(IGLUE / "XVNLI/annotations/ar/train_5.jsonl", root / "XVNLI/annotations/en/dev.jsonl")   # dev is not public
    ids = {int(r["Flikr30kID"]) for f in ve_files for r in read_jsonl(IGLUE / f)}
    ids |= {int(r["Flikr30kID"]) for r in read_jsonl(IGLUE / "XVNLI/annotations/ar/train_5.jsonl")}
    make_store(root / "flickr30k/features/flickr30k_boxes36.lmdb", sorted(ids), FEATURE_DIM)
    for name in ("trainval_ans2label.json", "trainval_label2ans.json"):
        link(IGLUE / f"gqa/annotations/{name}", root / f"gqa/annotations/{name}")
    # xGQA's test.json is not public; the German 5-shot file has the same format 
    questions = IGLUE / "xGQA/annotations/few_shot/de/train_5.json"
    link(questions, root / "xGQA/annotations/few_shot/de/test.json")
    link(questions, root / "xGQA/annotations/few_shot/en/test.json")
    q = json.loads(questions.read_text(encoding="utf-8"))
    make_store(root / "gqa/features/vg-gqa_boxes36.lmdb", sorted({v["imageId"] for v in q.values()}), FEATURE_DIM)
    return root


def entailment_share(path: Path) -> float:
    rows = read_jsonl(path)
    return 100 * sum(r["gold_label"] == "entailment" for r in rows) / len(rows)


@pytest.fixture(scope="module")
def sweep_env(tmp_path_factory):
    need_iglue()
    tmp = tmp_path_factory.mktemp("protocols_e2e")
    from volta_ml.tasks.config import load_task_config
    tasks = load_task_config(str(REPO / "config_tasks/iglue_test_tasks_boxes36.yml"))
    config = tiny_config_file(tmp / "config/ctrl_uniter_base.json")
    ckpts = {"xvnli": build_checkpoint(config, tasks, "TASK19", tmp / "en/xvnli/pytorch_model_best.bin",
                                       force_class=ENTAILMENT),
             "xgqa": build_checkpoint(config, tasks, "TASK15", tmp / "en/xgqa/pytorch_model_best.bin",
                                      force_class=YES)}
    return {"tmp": tmp, "root": data_root(tmp / "data"), "config": config, "ckpts": ckpts,
            "bert": bert_uncased_dir(tmp)}


def write_grid(env, name: str, **overrides) -> Path:
    grid = {
        "name": name, "data_root": str(env["root"]), "output_dir": str(env["tmp"] / name),
        "task_configs": str(REPO / "config_tasks"),
        "tasks": ["xvnli", "xgqa"], "protocols": ["zero_shot", "translate_test"],
        "languages": {"xvnli": ["ar"], "xgqa": ["de"]},
        "models": {"ctrl_uniter": {"config": str(env["config"]), "bert_model": str(env["bert"]),
                                   "do_lower_case": True,
                                   "finetuned": {t: str(p) for t, p in env["ckpts"].items()}}},
        "extra_flags": {"eval": ["--num_val_workers", "0", "--no_cache", "--device", "cpu"]},
        "env": {"OMP_NUM_THREADS": "2"},
    }
    grid.update(overrides)
    path = env["tmp"] / f"{name}.yml"
    path.write_text(yaml.safe_dump(grid))
    return path


def volta_ml(*args: str, module: str = "volta_ml.protocols.cli") -> subprocess.CompletedProcess:
    """`volta-ml ARGS`; volta_ml.protocols.cli has the same sweep/report commands and starts faster."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_zero_shot_and_translate_test_grid_then_report(sweep_env):
    grid = write_grid(sweep_env, "transfer")
    # the grid has 6 cells; 4 of them cover both scorers and both protocols (each eval is a few seconds)
    only = ["--only", "zero_shot/ctrl_uniter/xvnli", "--only", "translate_test/ctrl_uniter/xvnli",
            "--only", "zero_shot/ctrl_uniter/xgqa/de"]
    out = volta_ml("sweep", str(grid), "--local", *only, module="volta_ml.cli")
    assert "4 ran, 0 already finished, 0 failed" in out.stdout
    runs = sweep_env["tmp"] / "transfer"
    score = lambda cell: json.loads((runs / cell / "result.json").read_text())["metrics"]["score"]  # noqa: E731
    for cell, file in (("zero_shot/ctrl_uniter/xvnli/en", "XVNLI/annotations/en/test.jsonl"),
                       ("zero_shot/ctrl_uniter/xvnli/ar", "XVNLI/annotations/ar/test.jsonl"),
                       ("translate_test/ctrl_uniter/xvnli/ar", "XVNLI/annotations_machine-translate/ar/test.jsonl")):
        assert score(cell) == pytest.approx(entailment_share(IGLUE / file), abs=5e-4)
    questions = json.loads((IGLUE / "xGQA/annotations/few_shot/de/train_5.json").read_text(encoding="utf-8"))
    yes = 100 * sum(q["answer"] == "yes" for q in questions.values()) / len(questions)
    assert score("zero_shot/ctrl_uniter/xgqa/de") == pytest.approx(yes)
    # IGLUE's file conventions: eval_task's output folder and the xGQA scraper's last .out line
    de = runs / "zero_shot/ctrl_uniter/xgqa/de"
    assert (de / "eval/pytorch_model_best.bin-/test_de_result.json").exists()
    assert float((de / "test.out").read_text().strip().splitlines()[-1]) == pytest.approx(yes)
    # per-item files beside eval_task's / GQA_score's outputs (the record step names them in result.json): one row
    # per question, 100 or 0, averaging to the score
    for cell, items, ids in (("zero_shot/ctrl_uniter/xvnli/ar", "eval/pytorch_model_best.bin-/test_items.jsonl",
                              [r["pairID"] for r in read_jsonl(IGLUE / "XVNLI/annotations/ar/test.jsonl")]),
                             ("zero_shot/ctrl_uniter/xgqa/de", "eval/pytorch_model_best.bin-/test_de_items.jsonl",
                              list(questions))):
        record = json.loads((runs / cell / "result.json").read_text())
        assert record["items"] == items
        values = metric_values(read_items(runs / cell / items), "score")
        assert list(values) == ids and set(values.values()) <= {0.0, 100.0}
        assert sum(values.values()) / len(values) == pytest.approx(record["metrics"]["score"], abs=5e-4)

    again = volta_ml("sweep", str(grid), "--local", *only)
    assert "0 ran, 4 already finished" in again.stdout
    assert "4/6 cells finished" in volta_ml("sweep", str(grid), "--list").stdout

    volta_ml("report", str(runs))
    report = runs / "report"
    xvnli = (report / "XVNLI_0.csv").read_text().splitlines()
    assert xvnli[0] == "model,en,ar,avg"
    en, ar = (entailment_share(IGLUE / f"XVNLI/annotations/{l}/test.jsonl") for l in ("en", "ar"))
    values = [float(v) for v in xvnli[1].split(",")[1:]]
    assert values == pytest.approx([en, ar, ar], abs=5e-4)
    header, row = (report / "xGQA_0.csv").read_text().splitlines()[:2]
    assert header == "model,de,avg" and [float(v) for v in row.split(",")[1:]] == pytest.approx([yes, yes])
    for name in ("XVNLI_summary.md", "XVNLI_0.tex", "plots/XVNLI_languages.png", "plots/XVNLI_mt_gap.png"):
        assert (report / name).stat().st_size > 0
    # every cell with its interval; a checkpoint that always says "entailment" is right on a fixed set of items
    assert all(r["ci_low"] and float(r["ci_low"]) <= float(r["value"]) <= float(r["ci_high"])
               for r in csv.DictReader((report / "uncertainty/XVNLI_0.csv").open()))


def test_few_shot_grid_trains_selects_and_tests(sweep_env):
    grid = write_grid(sweep_env, "fewshot", tasks=["xvnli"], protocols=["few_shot"],
                      few_shot_languages={"xvnli": ["ar"]}, shots={"xvnli": ["1"]},
                      learning_rates=["1e-4", "5e-5"], num_epoch=1,
                      extra_flags={"eval": ["--num_val_workers", "0", "--no_cache", "--device", "cpu"],
                                   "train": ["--num_val_workers", "0", "--no_cache", "--device", "cpu"]})
    out = volta_ml("sweep", str(grid), "--local")
    assert "3 ran, 0 already finished, 0 failed" in out.stdout
    runs = sweep_env["tmp"] / "fewshot"
    result = json.loads((runs / "few_shot_test/ctrl_uniter/xvnli/ar/1/seed0/result.json").read_text())
    assert result["selected_lr"] in ("1e-4", "5e-5")
    dev = {lr: json.loads((runs / f"few_shot_train/ctrl_uniter/xvnli/ar/1/seed0/lr{lr}/result.json").read_text())
           ["metrics"]["dev"] for lr in ("1e-4", "5e-5")}
    assert result["selected_lr"] == ("1e-4" if dev["1e-4"] >= dev["5e-5"] else "5e-5")
    volta_ml("report", str(runs))
    assert (runs / "report/XVNLI_1.csv").read_text().startswith("model,ar,avg\nctrl_uniter,")


def test_retrieval_grid_reads_final_lines_into_ir_and_tr_tables(sweep_env):
    root = sweep_env["root"]
    # a 10-image German gallery keeps the caption x image scoring small on CPU
    test = link(IGLUE / "xFlickrCO/annotations/de/train_10.jsonl", root / "xFlickrCO/annotations/de/test_10.jsonl")
    make_store(root / "xFlickrCO/features/xflickrco-test_boxes36.lmdb", [r["img_path"] for r in read_jsonl(test)],
               FEATURE_DIM)
    from volta_ml.tasks.config import load_task_config
    tasks = load_task_config(str(REPO / "config_tasks/iglue_test_tasks_boxes36.yml"))
    ckpt = build_checkpoint(sweep_env["config"], tasks, "TASK8", sweep_env["tmp"] / "en/xflickrco/pytorch_model_best.bin")
    grid = write_grid(sweep_env, "retrieval", tasks=["xflickrco"], languages={"xflickrco": ["de"]},
                      protocols=["zero_shot"], include_english=False,
                      paths={"xflickrco": {"test_file": "xFlickrCO/annotations/{lang}/test_10.jsonl"}},
                      models={"ctrl_uniter": {"config": str(sweep_env["config"]), "bert_model": str(sweep_env["bert"]),
                                              "do_lower_case": True, "finetuned": {"xflickrco": str(ckpt)}}},
                      extra_flags={"eval_retrieval": ["--num_val_workers", "0", "--no_cache", "--device", "cpu"]})
    assert "1 ran, 0 already finished, 0 failed" in volta_ml("sweep", str(grid), "--local").stdout
    runs = sweep_env["tmp"] / "retrieval"
    cell = runs / "zero_shot/ctrl_uniter/xflickrco/de"
    metrics = json.loads((cell / "result.json").read_text())["metrics"]
    finals = [l for l in (cell / "test.out").read_text().splitlines() if l.startswith("Final")]
    assert f"{metrics['ir_r1']:.3f}" in finals[-2] and f"{metrics['tr_r1']:.3f}" in finals[-1]
    assert 0 <= metrics["ir_r1"] <= metrics["ir_r5"] <= metrics["ir_r10"] <= 100
    items = read_items(cell / json.loads((cell / "result.json").read_text())["items"])
    for prefix, n in (("ir", 10), ("tr", 10)):      # 10 images with one caption each in train_10
        values = metric_values(items, f"{prefix}_r1")
        assert len(values) == n and sum(values.values()) / n == pytest.approx(metrics[f"{prefix}_r1"], abs=5e-4)
    volta_ml("report", str(runs), "--no_plots")
    ir = (runs / "report/xFlickrCO_ir_0.csv").read_text().splitlines()
    assert ir[0] == "model,de,avg" and ir[1] == f"ctrl_uniter,{metrics['ir_r1']!r},{metrics['ir_r1']!r}"
    assert (runs / "report/xFlickrCO_tr_0.csv").exists()
