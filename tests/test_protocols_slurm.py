"""Grid expansion with IGLUE's settings, and the generated Slurm job arrays: array sizes, the cell of every
index (a dry run expands each one), dependencies between the arrays, resources, `bash -n`."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from volta_ml.protocols.grid import GridError, load_grid
from volta_ml.protocols.runners import cells_by_stage, plan_cells
from volta_ml.protocols.slurm import write_slurm

BASH = "/bin/bash"


def grid_file(tmp: Path, **overrides) -> Path:
    grid = {
        "name": "t", "data_root": str(tmp / "data"), "output_dir": str(tmp / "runs"),
        "tasks": ["xvnli", "marvl", "xflickrco"], "protocols": ["zero_shot", "few_shot"],
        "languages": {"xvnli": ["ar"], "marvl": ["id"], "xflickrco": ["de"]},
        "few_shot_languages": {"xvnli": ["ar"], "marvl": ["id"], "xflickrco": ["de"]},
        "shots": {"xvnli": ["1", "20"], "marvl": ["10x2"], "xflickrco": ["100"]},
        "models": {"uc2": {"config": "uc2_base", "bert_model": "/hf/xlm-roberta-base",
                           "pretrained": "/ckpt/uc2_checkpoint_200000.bin"},
                   "m3p": {"config": "m3p_base", "bert_model": "/hf/xlm-roberta-base",
                           "finetuned": "/ckpt/{task}/{name}_{cfg}/pytorch_model_best.bin"}},
        "slurm": {"partition": "gpu", "max_parallel": 4, "setup": ["module load cuda"],
                  "stages": {"few_shot_train": {"time": "01:00:00", "mem": "16G"}}},
    }
    grid.update(overrides)
    path = tmp / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    return path


def flag(argv: list[str], name: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]      # argparse keeps the last value


def test_iglue_settings_in_the_expanded_cells(tmp_path):
    grid = load_grid(grid_file(tmp_path, extra_flags={"few_shot_train": ["--num_workers", "2"]}))
    cells = {c.id: c for c in plan_cells(grid)}
    # uc2 has no fine-tuned checkpoint: it is fine-tuned on English first, with IGLUE's settings
    ft = cells["finetune/uc2/marvl/seed0"].commands[0].argv
    assert flag(ft, "--gradient_accumulation_steps") == "4" and flag(ft, "--task") == "12"
    assert flag(ft, "--tasks_config_file").endswith("iglue_trainval_tasks_boxes36.yml")
    assert "--adam_correct_bias" in ft and flag(ft, "--weight_decay") == "0.0001"
    assert flag(cells["finetune/uc2/xflickrco/seed0"].commands[0].argv, "--loss") == "TripletLoss"
    zs = cells["zero_shot/uc2/xvnli/ar/seed0"]
    assert zs.depends_on == ["finetune/uc2/xvnli/seed0"]
    assert flag(zs.commands[0].argv, "--from_pretrained") == str(tmp_path / "runs/finetune/uc2/xvnli/seed0/pytorch_model_best.bin")
    # m3p: given checkpoints, X101 features, --is_m3p, m3p's batch schedules
    zs = cells["zero_shot/m3p/xflickrco/de"].commands[0].argv
    assert flag(zs, "--from_pretrained") == "/ckpt/xflickrco/RetrievalFlickr30k_m3p_base/pytorch_model_best.bin"
    assert "--is_m3p" in zs and flag(zs, "--num_subiters") == "4" and flag(zs, "--batch_size") == "1"
    assert flag(zs, "--val_features_lmdbpath") == str(tmp_path / "data/xFlickrCO/features/xflickrco-test_X101.lmdb")
    assert flag(zs, "--split") == "test_de" and zs[:4] == [sys.executable, "-m", "volta_ml.cli", "eval-retrieval"]
    # MaRVL English = NLVR2 test from the task config: no split, annotations or features
    en = cells["zero_shot/m3p/marvl/en"].commands[0].argv
    assert "--split" not in en and "--val_annotations_jsonpath" not in en and "--val_features_lmdbpath" not in en
    m3p20 = cells["few_shot_train/m3p/xvnli/ar/20/seed0/lr1e-4"].commands[0].argv
    assert (flag(m3p20, "--batch_size"), flag(m3p20, "--gradient_accumulation_steps")) == ("64", "2")
    assert flag(m3p20, "--eval_batch_size") == "32" and flag(m3p20, "--num_epoch") == "20"
    assert flag(m3p20, "--train_annotations_jsonpath") == str(tmp_path / "data/XVNLI/annotations/ar/train_20.jsonl")
    assert flag(m3p20, "--val_annotations_jsonpath") == str(tmp_path / "data/XVNLI/annotations/en/dev.jsonl")
    uc2_1 = cells["few_shot_train/uc2/xvnli/ar/1/seed0/lr5e-5"].commands[0].argv
    assert (flag(uc2_1, "--batch_size"), flag(uc2_1, "--gradient_accumulation_steps"), flag(uc2_1, "--lr")) == ("2", "1", "5e-5")
    assert flag(uc2_1, "--num_workers") == "2"                                   # grid override wins
    marvl = cells["few_shot_train/m3p/marvl/id/10x2/seed0/lr1e-5"].commands[0].argv
    assert flag(marvl, "--max_val_batches") == "30" and flag(marvl, "--batch_size") == "32"
    assert flag(marvl, "--train_features_lmdbpath").endswith("marvl/few_shot/features/marvl-id_fewshot_X101.lmdb")
    xf = cells["few_shot_train/uc2/xflickrco/de/100/seed0/lr1e-4"].commands[0].argv
    assert flag(xf, "--train_split") == "train_de_100" and flag(xf, "--loss") == "TripletLoss"
    assert (flag(xf, "--batch_size"), flag(xf, "--gradient_accumulation_steps")) == ("32", "2")
    test = cells["few_shot_test/uc2/xvnli/ar/1/seed0"]
    assert test.depends_on == [f"few_shot_train/uc2/xvnli/ar/1/seed0/lr{lr}" for lr in ("1e-4", "5e-5", "1e-5")]
    assert test.commands[0].argv[-2] == "select"
    assert flag(test.commands[1].argv, "--from_pretrained").endswith("few_shot_test/uc2/xvnli/ar/1/seed0/selected/pytorch_model_best.bin")


@pytest.mark.parametrize("change, message", [
    ({"modles": {}}, "unknown key(s) ['modles']"),
    ({"tasks": ["vqa"]}, "unknown task 'vqa'"),
    ({"protocols": ["zero-shot"]}, "unknown protocol 'zero-shot'"),
    ({"models": {"x": {"config": "c.json"}}}, "models.x: no English fine-tuned checkpoint for task(s)"),
    ({"models": {"x": {"config": "c.json", "finetuned": "a", "lr": 1}}}, "models.x: unknown key(s) ['lr']"),
    ({"languages": {"xvlni": ["ar"]}}, "languages.xvlni: unknown task"),
    ({"seeds": "0"}, "seeds: expected a non-empty list of integers"),
])
def test_grid_errors_name_the_key(tmp_path, change, message):
    with pytest.raises(GridError) as error:
        load_grid(grid_file(tmp_path, **change))
    assert message in str(error.value) and "grid.yml" in str(error.value)


@pytest.mark.parametrize("change, slurm, message", [
    ({"tasks": ["wit"], "languages": {"wit": ["ar"]}, "few_shot_languages": {}}, False,
     "task 'wit' has no few-shot protocol in IGLUE"),
    ({"tasks": ["xvnli"], "protocols": ["translate_train"]}, False, "task 'xvnli' has no translate-train data"),
    ({"tasks": ["xflickrco"], "protocols": ["translate_train"]}, False, "models.m3p: translate-train starts from"),
    ({"slurm": {"partition": "gpu", "qoss": "x"}}, True, "slurm: unknown key(s) ['qoss']"),
    ({"slurm": {"stages": {"zero_shot": {"gpus": 2}}}}, True, "slurm.stages.zero_shot: unknown resource(s)"),
])
def test_planning_errors_are_grid_errors(tmp_path, change, slurm, message):
    """What the planner and the Slurm writer find wrong in a grid is one line and exit code 2, as every other
    grid error (these were SystemExit: exit code 1)."""
    path = grid_file(tmp_path, **change)
    with pytest.raises(GridError, match=re.escape(message)):
        write_slurm("t", plan_cells(load_grid(path)), tmp_path / "slurm", load_grid(path).slurm, {}, ["step"])
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "sweep", str(path)] + (["--slurm"] if slurm else []),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0] and "grid.yml" in lines[0], proc.stderr


def test_example_grids_expand(tmp_path):
    xvnli = plan_cells(load_grid(REPO / "examples/grids/xvnli_table.yml"))
    by_stage = cells_by_stage(xvnli)
    # 4 models x (en + 4 languages zero-shot, 4 translate-test, 4 languages x 6 shots x (3 rates + 1 test))
    assert {s: len(c) for s, c in by_stage.items()} == {"zero_shot": 20, "translate_test": 16,
                                                          "few_shot_train": 288, "few_shot_test": 96}
    full = cells_by_stage(plan_cells(load_grid(REPO / "examples/grids/full_iglue.yml")))
    assert len(full["finetune"]) == 2 * 5


def run_index(script: Path, index: int, chunk: int = 1000) -> subprocess.CompletedProcess:
    """Dry-run one cell the way Slurm would start it: array index within its chunk, plus the chunk offset."""
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(index % chunk), "VOLTA_ML_DRY_RUN": "1",
           "VOLTA_ML_INDEX_OFFSET": str(index - index % chunk)}
    return subprocess.run([BASH, str(script)], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("chunk", [1000, 5])
def test_slurm_arrays_map_every_index_to_its_cell_and_chain_stages(tmp_path, chunk):
    grid = load_grid(grid_file(tmp_path))
    grid.slurm["max_array_size"] = chunk
    cells = plan_cells(grid)
    submit = write_slurm(grid.name, cells, tmp_path / "slurm", grid.slurm, grid.env, grid.step())
    stages = cells_by_stage(cells)
    assert {s: len(c) for s, c in stages.items()} == {"finetune": 3, "zero_shot": 12, "few_shot_train": 24,
                                                       "few_shot_test": 8}
    for stage, group in stages.items():
        script = tmp_path / "slurm" / f"{stage}.sbatch"
        text = script.read_text()
        assert subprocess.run([BASH, "-n", str(script)]).returncode == 0
        assert f"#SBATCH --array=0-{min(len(group), chunk) - 1}%4\n" in text
        assert "#SBATCH --partition=gpu" in text and "module load cuda" in text
        if stage == "few_shot_train":
            assert "#SBATCH --time=01:00:00" in text and "#SBATCH --mem=16G" in text
        for index, cell in enumerate(group):
            proc = run_index(script, index, chunk)
            assert proc.returncode == 0, proc.stderr
            lines = proc.stdout.splitlines()
            assert lines[0] == f"cell {index}: {cell.id}"
            assert len(lines) == 1 + len(cell.commands)
            for line, command in zip(lines[1:], cell.commands):
                argv_text, _, redirect = line.rpartition(" > ")
                assert shlex.split(argv_text) == command.argv
                out, err = shlex.split(redirect.replace(" 2> ", " "))
                assert (out, err) == (command.stdout, command.stderr)
        beyond = run_index(script, len(group), chunk)
        assert beyond.returncode == 2 and "no cell for index" in beyond.stderr

    # submit.sh with a stand-in sbatch that records its arguments and hands out job ids
    fake = tmp_path / "sbatch"
    fake.write_text('#!/bin/bash\nn=$(( $(wc -l < "$LOG" 2>/dev/null || echo 0) + 100 ))\n'
                    'echo "$n $*" >> "$LOG"\necho "$n;cluster"\n')
    fake.chmod(0o755)
    log = tmp_path / "sbatch.log"
    proc = subprocess.run([BASH, str(submit)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SBATCH": str(fake), "LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    jobs: dict[str, list[list[str]]] = {}
    for line in log.read_text().splitlines():
        words = line.split()
        jobs.setdefault(words[-1].removesuffix(".sbatch"), []).append(words)
    assert list(jobs) == ["finetune", "zero_shot", "few_shot_train", "few_shot_test"]
    ids = {stage: ":".join(w[0] for w in submits) for stage, submits in jobs.items()}
    deps = {stage: {w for words in submits for w in words if w.startswith("--dependency")}
            for stage, submits in jobs.items()}
    assert deps == {"finetune": set(), "zero_shot": {f"--dependency=afterok:{ids['finetune']}"},
                    "few_shot_train": {f"--dependency=afterok:{ids['finetune']}"},
                    "few_shot_test": {f"--dependency=afterok:{ids['few_shot_train']}"}}
    # chunks cover each stage's cells exactly once
    for stage, submits in jobs.items():
        n = len(stages[stage])
        if n <= chunk:
            assert len(submits) == 1 and not any(w.startswith("--array") for w in submits[0])
            continue
        spans = [(int(next(w for w in words if w.startswith("--export")).rsplit("=", 1)[1]),
                  int(next(w for w in words if w.startswith("--array=")).split("=")[1].split("-")[1].split("%")[0]) + 1)
                 for words in submits]
        assert [o for o, _ in spans] == list(range(0, n, chunk)) and sum(size for _, size in spans) == n


def test_finished_cells_exit_early_in_the_job_script(tmp_path):
    from volta_ml.protocols.cell import write_json_atomic

    grid = load_grid(grid_file(tmp_path, tasks=["xvnli"], protocols=["zero_shot"],
                               models={"m": {"config": "c", "finetuned": "/x.bin"}}, slurm={}))
    cells = plan_cells(grid)
    write_slurm(grid.name, cells, tmp_path / "slurm", grid.slurm, grid.env, grid.step())
    write_json_atomic(Path(cells[0].dir) / "result.json", {"status": "done", "metrics": {"score": 1.0}})
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([BASH, str(tmp_path / "slurm/zero_shot.sbatch")], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0 and "already finished" in proc.stdout


def test_volta_ml_command_registers_sweep_and_report():
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "--help"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0 and "sweep" in proc.stdout and "report" in proc.stdout


def test_run_command_is_a_one_model_grid(tmp_path):
    from volta_ml.protocols.cli import main

    assert main(["run", "zero_shot", "few_shot", "--task", "marvl", "--model", "uc2", "--config", "uc2_base",
                 "--finetuned", "/ckpt/{task}.bin", "--data_root", str(tmp_path / "data"), "--output_dir",
                 str(tmp_path / "out"), "--languages", "id", "--shots", "1", "2", "--slurm"]) == 0
    grid = load_grid(tmp_path / "out/grid.yml")
    assert grid.models["uc2"].finetuned == {"marvl": "/ckpt/{task}.bin"} and grid.shots == {"marvl": ["1", "2"]}
    sizes = {s: len(c) for s, c in cells_by_stage(plan_cells(grid)).items()}
    assert sizes == {"zero_shot": 2, "few_shot_train": 2 * 3, "few_shot_test": 2}
    assert "#SBATCH --array=0-5\n" in (tmp_path / "out/slurm/few_shot_train.sbatch").read_text()
