"""eval_task end to end on CPU: tiny models, real annotation files, generated feature stores, real tokenizers.

Checkpoints whose head always predicts one class give scores that can be computed from the annotation files
alone; the other runs check the logged score against the written predictions.
"""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from helpers_eval import build_checkpoint, build_data_root, tiny_config_file
from helpers_tasks import IGLUE, REPO, bert_uncased_dir, need_iglue, read_jsonl, xlmr_dir
from volta_ml.cli import eval_task as eval_cli
from volta_ml.tasks.config import load_task_config

TASKS = str(REPO / "config_tasks/iglue_test_tasks_boxes36.yml")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    need_iglue()
    tmp = tmp_path_factory.mktemp("e2e")
    root = build_data_root(tmp / "data", IGLUE)
    texts = [r["caption"] for r in read_jsonl(IGLUE / "marvl/zero_shot/annotations/marvl-id.jsonl")]
    texts += [r["sentence2"] for r in read_jsonl(IGLUE / "XVNLI/annotations/ar/test.jsonl")]
    texts += [q["question"] for q in json.loads((IGLUE / "xGQA/annotations/few_shot/de/train_5.json")
                                                 .read_text(encoding="utf-8")).values()]
    xlmr = xlmr_dir(tmp, texts)
    from transformers import AutoTokenizer
    xlmr_vocab = len(AutoTokenizer.from_pretrained(str(xlmr), local_files_only=True))
    return {"tmp": tmp, "root": root, "bert": bert_uncased_dir(tmp), "xlmr": xlmr,
            "uniter": tiny_config_file(tmp / "config/ctrl_uniter_base.json"),
            "xuniter": tiny_config_file(tmp / "config/ctrl_xuniter_base.json", "ctrl_xuniter_base", xlmr_vocab),
            "tasks": load_task_config(TASKS)}


def run(env, capsys, model: str, task: str, extra: list[str], force=None, seed=0, head_gain=1.0):
    config = env["uniter"] if model == "uniter" else env["xuniter"]
    ckpt_dir = env["tmp"] / f"ckpt_{model}_{task}_{force}_{seed}"
    ckpt = build_checkpoint(config, env["tasks"], f"TASK{task}", ckpt_dir / "pytorch_model_best.bin",
                            seed=seed, force_class=force, head_gain=head_gain)
    out = env["tmp"] / f"out_{model}_{task}_{force}_{seed}"
    tokenizer = ["--bert_model", str(env["bert"]), "--do_lower_case"] if model == "uniter" else \
        ["--bert_model", str(env["xlmr"])]
    capsys.readouterr()
    eval_cli.main(tokenizer + ["--config_file", str(config), "--from_pretrained", str(ckpt),
                               "--tasks_config_file", TASKS, "--task", task, "--output_dir", str(out),
                               "--data_root", str(env["root"]), "--num_val_workers", "0", "--no_cache"] + extra)
    captured = capsys.readouterr()
    return out / "pytorch_model_best.bin-", captured.out, captured.err


def last_validation(err: str) -> float:
    line = [l for l in err.splitlines() if "Validation" in l][-1]
    return float(line.split()[-1])


def test_xvnli_english_forced_entailment(env, capsys):
    results, out, err = run(env, capsys, "uniter", "19", ["--split", "test"], force=2)
    rows = read_jsonl(env["root"] / "XVNLI/annotations/en/test.jsonl")
    expected = 100 * sum(r["gold_label"] == "entailment" for r in rows) / len(rows)
    last = err.splitlines()[-1]  # IGLUE's XVNLI scraper reads the last line of the .err file
    assert "Validation [XVNLI]: loss " in last and last.endswith(f"score {expected:.3f} ")
    assert last_validation(err) == pytest.approx(expected, abs=5e-4)
    assert "***** Running evaluation *****" in out and "Num Iters:  39" in out and "Batch size:  30" in out
    predictions = json.loads((results / "test_result.json").read_text())
    assert [p["label"] for p in predictions] == [r["gold_label"] for r in rows]
    assert {p["prediction"] for p in predictions} == {"entailment"}
    assert json.loads((results / "test_others.json").read_text()) == []
    assert (results / "eval.txt").read_text().strip().endswith(f"score {expected:.3f}")


def test_xvnli_arabic_score_matches_predictions(env, capsys):
    annotations = str(env["root"] / "XVNLI/annotations/ar/test.jsonl")
    results, _, err = run(env, capsys, "xuniter", "19", ["--split", "test", "--val_annotations_jsonpath",
                                                          annotations], seed=3)
    predictions = json.loads((results / "test_result.json").read_text())
    assert len(predictions) == 1164
    accuracy = 100 * sum(p["prediction"] == p["label"] for p in predictions) / len(predictions)
    assert last_validation(err) == pytest.approx(accuracy, abs=5e-4)


def test_xgqa_predictions_and_gqa_score(env, capsys, tmp_path):
    truth_path = env["root"] / "xGQA/annotations/few_shot/de/test.json"
    ans2label = json.loads((env["root"] / "gqa/annotations/trainval_ans2label.json").read_text())
    results, _, err = run(env, capsys, "xuniter", "15", ["--split", "test_de", "--val_annotations_jsonpath",
                                                          str(truth_path)], force=ans2label["yes"])
    assert "Validation [GQA]: loss 0.000 score 0.000" in err.splitlines()[-1]  # as VOLTA: GQA_score has the score
    truth = json.loads(truth_path.read_text(encoding="utf-8"))
    predictions = json.loads((results / "test_de_result.json").read_text())
    assert [p["questionId"] for p in predictions] == list(truth)
    assert {p["prediction"] for p in predictions} == {"yes"}
    from volta_ml.cli import gqa_score as gqa_score_cli
    capsys.readouterr()
    assert gqa_score_cli.main(["--preds_file", str(results / "test_de_result.json"),
                               "--truth_file", str(truth_path)]) == 0
    score = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert score == pytest.approx(100 * sum(q["answer"] == "yes" for q in truth.values()) / len(truth))


def test_marvl_forced_true_score_and_consistency(env, capsys):
    annotations = env["root"] / "marvl/zero_shot/annotations/marvl-id.jsonl"
    features = env["root"] / "marvl/zero_shot/features/marvl-id_boxes36.lmdb"
    results, _, err = run(env, capsys, "xuniter", "12", ["--split", "test", "--val_annotations_jsonpath",
                                                          str(annotations), "--val_features_lmdbpath",
                                                          str(features)], force=1)
    rows = read_jsonl(annotations)
    expected = 100 * sum(bool(r["label"]) for r in rows) / len(rows)
    groups = defaultdict(list)
    for r in rows:
        groups[r["caption"]].append(bool(r["label"]))
    consistency = sum(all(v) for v in groups.values()) / len(groups) * 100
    lines = err.strip().splitlines()
    assert "Validation [NLVR2]:" in lines[-2] and last_validation(err) == pytest.approx(expected, abs=5e-4)
    assert lines[-1].split("Consistency: ")[1] == repr(consistency)
    predictions = json.loads((results / "test_result.json").read_text())
    assert [p["label"] for p in predictions] == [int(r["label"]) for r in rows]
    assert predictions[0]["sentence"] == rows[0]["caption"] and {p["prediction"] for p in predictions} == {1}


def test_retrieval_as_classification(env, capsys):
    annotations = env["root"] / "xFlickrCO/annotations/de/dev_100.jsonl"
    results, _, err = run(env, capsys, "xuniter", "8", ["--split", "dev_de", "--val_annotations_jsonpath",
                                                         str(annotations)], seed=5, head_gain=1e4)
    predictions = json.loads((results / "dev_de_result.json").read_text())
    assert len(predictions) == 100 and all(len(p["answer"]) == 4 for p in predictions)
    assert all(abs(sum(p["answer"]) - 1) < 1e-5 for p in predictions)
    # the head gain keeps the positive apart from the negatives, so the written probabilities decide as the
    # logits did (two negatives may tie exactly when they drew the same caption; that changes nothing)
    assert all(abs(p["answer"][0] - max(p["answer"][1:])) > 1e-6 for p in predictions)
    picked_positive = sum(p["answer"][0] > max(p["answer"][1:]) for p in predictions)
    assert last_validation(err) == pytest.approx(picked_positive, abs=5e-4)
    assert 0 < picked_positive < 100
    assert "Validation [RetrievalxFlickrCO]" in err.splitlines()[-1]


def test_wrong_task_head_warns(env, capsys):
    config = env["uniter"]
    ckpt = build_checkpoint(config, env["tasks"], "TASK12", env["tmp"] / "wrong/pytorch_model_best.bin")
    capsys.readouterr()
    eval_cli.main(["--bert_model", str(env["bert"]), "--do_lower_case", "--config_file", str(config),
                   "--from_pretrained", str(ckpt), "--tasks_config_file", TASKS, "--task", "19",
                   "--output_dir", str(env["tmp"] / "wrong_out"), "--data_root", str(env["root"]),
                   "--num_val_workers", "0", "--cache_dir", str(env["tmp"] / "token_cache")])
    assert "has no TASK19 head" in capsys.readouterr().err
    assert len(list((env["tmp"] / "token_cache").glob("*.npz"))) == 1  # the cache lives outside the data
    assert not list(env["root"].rglob("cache"))


def test_amp_and_workers_keep_the_forced_score(env, capsys):
    results, _, err = run(env, capsys, "uniter", "19", ["--split", "test", "--amp", "--num_val_workers", "2"],
                          force=2)
    rows = read_jsonl(env["root"] / "XVNLI/annotations/en/test.jsonl")
    assert last_validation(err) == pytest.approx(100 * sum(r["gold_label"] == "entailment" for r in rows)
                                                 / len(rows), abs=5e-4)
    assert len(json.loads((results / "test_result.json").read_text())) == len(rows)


def test_user_errors_are_one_line(env, capsys, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"gold_label": "neutral", "sentence2": "x", "Flikr30kID": "1"}\n{oops\n')
    ckpt = build_checkpoint(env["uniter"], env["tasks"], "TASK19", tmp_path / "pytorch_model_best.bin")
    capsys.readouterr()
    code = eval_cli.main(["--bert_model", str(env["bert"]), "--config_file", str(env["uniter"]),
                          "--from_pretrained", str(ckpt), "--tasks_config_file", TASKS, "--task", "19",
                          "--data_root", str(env["root"]), "--val_annotations_jsonpath", str(broken),
                          "--output_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "broken.jsonl:2: not valid JSON" in err and "Traceback" not in err
    capsys.readouterr()
    code = eval_cli.main(["--config_file", str(env["uniter"]), "--from_pretrained", str(ckpt),
                          "--tasks_config_file", TASKS, "--task", "4", "--output_dir", str(tmp_path)])
    assert code == 2 and "available: TASK8, TASK12, TASK15, TASK19, TASK20" in capsys.readouterr().err
