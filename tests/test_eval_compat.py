"""Replays the eval command shapes of IGLUE's experiment scripts (specs/user_scripts.md E1-E4) with paths
rewritten to a test cluster root, then reads the scores back with IGLUE's result-scraping rules."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from helpers_eval import build_checkpoint, build_data_root, tiny_config_file
from helpers_tasks import IGLUE, REPO, VOLTA_TASK_CONFIGS, bert_uncased_dir, need_iglue, read_jsonl, xlmr_dir
from volta_ml.tasks.config import load_task_config

CLUSTER = "/home/projects/ku_00062"
TC = "iglue_test_tasks_boxes36.dtu"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_iglue()
    if not (VOLTA_TASK_CONFIGS / f"{TC}.yml").is_file():
        pytest.skip("IGLUE's original task configs are not in ../shared")
    root = tmp_path_factory.mktemp("cluster")
    build_data_root(root / "data", IGLUE)
    texts = [r["caption"] for r in read_jsonl(IGLUE / "marvl/zero_shot/annotations/marvl-id.jsonl")]
    texts += [r["sentence2"] for r in read_jsonl(IGLUE / "XVNLI/annotations/ar/test.jsonl")]
    hf = root / "huggingface"
    bert_uncased_dir(hf)
    xlmr = xlmr_dir(hf, texts)
    (xlmr).rename(hf / "xlm-roberta-base")
    from transformers import AutoTokenizer
    vocab = len(AutoTokenizer.from_pretrained(str(hf / "xlm-roberta-base"), local_files_only=True))
    volta = root / "iglue/volta"
    (volta / "scripts").mkdir(parents=True)
    (volta / "config_tasks").mkdir()
    shutil.copy(REPO / "eval_task.py", volta / "eval_task.py")  # users drop volta-ml's entry points in place
    shutil.copy(REPO / "scripts/GQA_score.py", volta / "scripts/GQA_score.py")
    shutil.copy(VOLTA_TASK_CONFIGS / f"{TC}.yml", volta / f"config_tasks/{TC}.yml")  # absolute cluster paths
    configs = {"ctrl_uniter_base": tiny_config_file(volta / "config/ctrl_uniter_base.json"),
               "ctrl_xuniter_base": tiny_config_file(volta / "config/ctrl_xuniter_base.json", "ctrl_xuniter_base",
                                                     vocab)}
    (root / "envs/iglue/bin").mkdir(parents=True)
    (root / "envs/iglue/bin/activate").write_text("deactivate() { :; }\n")
    return {"root": root, "configs": configs, "tasks": load_task_config(volta / f"config_tasks/{TC}.yml")}


def checkpoint(cluster, task_dir: str, model: str, cfg: str, name: str, task: str, force: int) -> None:
    path = cluster["root"] / f"checkpoints/iglue/zero_shot/{task_dir}/{model}/{name}_{cfg}/pytorch_model_best.bin"
    if not path.exists():
        build_checkpoint(cluster["configs"][cfg], cluster["tasks"], f"TASK{task}", path, force_class=force)


def replay(cluster, folder: str, script: str, name: str = "test") -> tuple[str, str]:
    """Run a script as the PBS job does (cd to its dir, stdout/stderr to <name>.out/.err)."""
    here = cluster["root"] / "iglue/experiments" / folder
    script = script.replace("cd ../../../../volta", "cd " + "../" * len(folder.split("/")) + "../volta")
    here.mkdir(parents=True, exist_ok=True)
    (here / f"{name}.sh").write_text(script.replace(CLUSTER, str(cluster["root"])))
    env = dict(os.environ, PYTHONPATH=str(REPO), VOLTA_ML_PATH_MAP=f"{CLUSTER}={cluster['root']}",
               VOLTA_ML_CACHE=str(cluster["root"] / "cache"), LANG="de")  # LANG=<l> as in the scripts
    with open(here / f"{name}.out", "w") as out, open(here / f"{name}.err", "w") as err:
        done = subprocess.run(["bash", f"{name}.sh"], cwd=here, stdout=out, stderr=err, env=env)
    stdout, stderr = (here / f"{name}.out").read_text(), (here / f"{name}.err").read_text()
    assert done.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    return stdout, stderr


HEADER = """#!/bin/bash
TASK={task}
MODEL={model}
MODEL_CONFIG={cfg}
TASKS_CONFIG=iglue_test_tasks_boxes36.dtu
TRTASK={name}
PRETRAINED=/home/projects/ku_00062/checkpoints/iglue/zero_shot/{task_dir}/${{MODEL}}/${{TRTASK}}_${{MODEL_CONFIG}}/pytorch_model_best.bin
OUTPUT_DIR=/home/projects/ku_00062/results/iglue/zero_shot/{task_dir}/${{MODEL}}/${{TRTASK}}_${{MODEL_CONFIG}}/{tetask}/test
source /home/projects/ku_00062/envs/iglue/bin/activate
cd ../../../../volta
"""
BERT = "--bert_model /home/projects/ku_00062/huggingface/bert-base-uncased --do_lower_case"
XLMR = "--bert_model /home/projects/ku_00062/huggingface/xlm-roberta-base"


def iglue_last_validation(err: str) -> float:
    """results/get_*.py for MaRVL/XVNLI: last token of the last line containing `Validation`."""
    return float([line for line in err.splitlines() if "Validation" in line][-1].split()[-1])


def test_e1_xvnli_english_and_target_language(cluster):
    checkpoint(cluster, "xvnli", "ctrl_uniter", "ctrl_uniter_base", "XVNLI", "19", force=2)
    script = HEADER.format(task=19, model="ctrl_uniter", cfg="ctrl_uniter_base", name="XVNLI", task_dir="xvnli",
                           tetask="XVNLIen") + f"""
python eval_task.py {BERT} \\
  --config_file config/${{MODEL_CONFIG}}.json \\
  --from_pretrained ${{PRETRAINED}} \\
  --tasks_config_file config_tasks/${{TASKS_CONFIG}}.yml --task $TASK --split test \\
  --output_dir ${{OUTPUT_DIR}}

deactivate
"""
    _, err = replay(cluster, "zero_shot/ctrl_uniter/xvnli", script, "test.en")
    rows = read_jsonl(IGLUE / "XVNLI/annotations/en/test.jsonl")
    expected = 100 * sum(r["gold_label"] == "entailment" for r in rows) / len(rows)
    # XVNLI zero-shot scraper: the last line of the .err file
    assert float(err.strip("\n").splitlines()[-1].split()[-1]) == pytest.approx(expected, abs=5e-4)
    result = (cluster["root"] / "results/iglue/zero_shot/xvnli/ctrl_uniter/XVNLI_ctrl_uniter_base/XVNLIen/test/"
              "pytorch_model_best.bin-/test_result.json")
    assert len(json.loads(result.read_text())) == 1164

    checkpoint(cluster, "xvnli", "ctrl_xuniter", "ctrl_xuniter_base", "XVNLI", "19", force=0)
    script = HEADER.format(task=19, model="ctrl_xuniter", cfg="ctrl_xuniter_base", name="XVNLI",
                           task_dir="xvnli", tetask="XVNLIar") + f"""
python eval_task.py {XLMR} \\
  --config_file config/${{MODEL_CONFIG}}.json \\
  --from_pretrained ${{PRETRAINED}} \\
  --tasks_config_file config_tasks/${{TASKS_CONFIG}}.yml --task $TASK --split test \\
  --val_annotations_jsonpath /home/projects/ku_00062/data/XVNLI/annotations/en/test.jsonl \\
  --output_dir ${{OUTPUT_DIR}} \\
  --val_annotations_jsonpath /home/projects/ku_00062/data/XVNLI/annotations/ar/test.jsonl

deactivate
"""
    _, err = replay(cluster, "few_shot/ctrl_xuniter/xvnli/ar/5", script)
    rows = read_jsonl(IGLUE / "XVNLI/annotations/ar/test.jsonl")
    expected = 100 * sum(r["gold_label"] == "contradiction" for r in rows) / len(rows)
    # XVNLI few-shot scraper: the *first* Validation line; the last --val_annotations_jsonpath wins
    first = [line for line in err.splitlines() if "Validation" in line][0]
    assert float(first.split()[-1]) == pytest.approx(expected, abs=5e-4)


def test_e2_xgqa_eval_then_gqa_score(cluster):
    ans2label = json.loads((IGLUE / "gqa/annotations/trainval_ans2label.json").read_text())
    checkpoint(cluster, "xgqa", "ctrl_xuniter", "ctrl_xuniter_base", "GQA", "15", force=ans2label["no"])
    script = HEADER.format(task=15, model="ctrl_xuniter", cfg="ctrl_xuniter_base", name="GQA", task_dir="xgqa",
                           tetask="xGQAde") + f"""LANG=de
TEXT_PATH=/home/projects/ku_00062/data/xGQA/annotations/few_shot/${{LANG}}/test.json
python eval_task.py {XLMR} \\
  --config_file config/${{MODEL_CONFIG}}.json \\
  --from_pretrained ${{PRETRAINED}} \\
  --tasks_config_file config_tasks/${{TASKS_CONFIG}}.yml --task $TASK --split test_${{LANG}} \\
  --output_dir ${{OUTPUT_DIR}} --val_annotations_jsonpath ${{TEXT_PATH}}

python scripts/GQA_score.py \\
  --preds_file ${{OUTPUT_DIR}}/pytorch_model_best.bin-/test_${{LANG}}_result.json \\
  --truth_file $TEXT_PATH \\
deactivate
"""
    out, err = replay(cluster, "zero_shot/ctrl_xuniter/xgqa", script, "test.de")
    truth = json.loads((IGLUE / "xGQA/annotations/few_shot/de/train_5.json").read_text(encoding="utf-8"))
    expected = 100 * sum(q["answer"] == "no" for q in truth.values()) / len(truth)
    assert float(out.strip("\n").splitlines()[-1]) == pytest.approx(expected)  # xGQA scraper: last .out line
    assert "Validation [GQA]: loss 0.000 score 0.000" in err


def test_e3_marvl_with_its_own_features_and_e4_nlvr2_english(cluster):
    checkpoint(cluster, "marvl", "ctrl_xuniter", "ctrl_xuniter_base", "NLVR2", "12", force=1)
    script = HEADER.format(task=12, model="ctrl_xuniter", cfg="ctrl_xuniter_base", name="NLVR2",
                           task_dir="marvl", tetask="MaRVLid") + f"""
python eval_task.py {XLMR} \\
  --config_file config/${{MODEL_CONFIG}}.json \\
  --from_pretrained ${{PRETRAINED}} \\
  --val_annotations_jsonpath /home/projects/ku_00062/data/marvl/zero_shot/annotations/marvl-id.jsonl \\
  --val_features_lmdbpath /home/projects/ku_00062/data/marvl/zero_shot/features/marvl-id_boxes36.lmdb \\
  --tasks_config_file config_tasks/${{TASKS_CONFIG}}.yml --task $TASK --split test \\
  --output_dir ${{OUTPUT_DIR}}

deactivate
"""
    _, err = replay(cluster, "zero_shot/ctrl_xuniter/marvl", script, "test.id")
    rows = read_jsonl(IGLUE / "marvl/zero_shot/annotations/marvl-id.jsonl")
    assert iglue_last_validation(err) == pytest.approx(100 * sum(r["label"] for r in rows) / len(rows), abs=5e-4)
    groups = defaultdict(list)
    for r in rows:
        groups[r["caption"]].append(r["label"])
    consistency = float([line for line in err.splitlines() if "Consistency:" in line][-1].split()[-1])
    assert consistency == pytest.approx(100 * sum(all(g) for g in groups.values()) / len(groups))

    checkpoint(cluster, "marvl", "ctrl_uniter", "ctrl_uniter_base", "NLVR2", "12", force=0)
    script = HEADER.format(task=12, model="ctrl_uniter", cfg="ctrl_uniter_base", name="NLVR2", task_dir="marvl",
                           tetask="NLVR2") + f"""
python eval_task.py {BERT} \\
  --config_file config/${{MODEL_CONFIG}}.json \\
  --from_pretrained ${{PRETRAINED}} \\
  --tasks_config_file config_tasks/${{TASKS_CONFIG}}.yml --task $TASK \\
  --output_dir ${{OUTPUT_DIR}}

deactivate
"""
    _, err = replay(cluster, "zero_shot/ctrl_uniter/marvl", script, "test.en")
    rows = read_jsonl(IGLUE / "nlvr2/annotations/dev.jsonl")  # linked as the test file
    assert iglue_last_validation(err) == pytest.approx(
        100 * sum(r["label"] == "False" for r in rows) / len(rows), abs=5e-4)
    result = (cluster["root"] / "results/iglue/zero_shot/marvl/ctrl_uniter/NLVR2_ctrl_uniter_base/NLVR2/test/"
              "pytorch_model_best.bin-/test_result.json")  # no --split: the config's val_split names the file
    assert len(json.loads(result.read_text())) == len(rows)


def test_retrieval_shapes_are_for_eval_retrieval(tmp_path):
    """E5/E6 (xFlickr&CO, WIT recall) go through eval_retrieval.py, a separate entry point (run end to end in
    test_retrieval_cli); here: the script, dropped into a VOLTA folder as users do, takes IGLUE's E5 flags."""
    shutil.copy(REPO / "eval_retrieval.py", tmp_path / "eval_retrieval.py")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "eval_retrieval.py", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: eval_retrieval.py")
    for flag in ("--bert_model", "--config_file", "--from_pretrained", "--tasks_config_file", "--task", "--split",
                 "--batch_size", "--num_subiters", "--caps_per_image", "--val_annotations_jsonpath",
                 "--val_features_lmdbpath", "--output_dir", "--zero_shot"):
        assert flag in done.stdout, flag