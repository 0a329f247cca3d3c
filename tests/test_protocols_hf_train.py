"""IGLUE's training protocols for Hugging Face models in a sweep grid (volta_ml/protocols/hf_cells.py): the cells
and commands a grid plans (English fine-tuning, zero-shot transfer of its export, few-shot from it with the zoo's
selection), the grid's errors, the report's rows, and the example grid's layout run end to end on CPU with tiny
models (`volta-ml sweep --local`, then `volta-ml report`)."""
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
from helpers_hf import build
from helpers_hf_train import make_flickr_root, make_xvnli_root
from helpers_vlm_families import build_family, shared_root
from volta_ml.protocols.errors import GridError
from volta_ml.protocols.grid import load_grid
from volta_ml.protocols.runners import plan_cells

EXAMPLE = REPO / "examples" / "grids" / "iglue_hf_protocol.yml"


def _grid(tmp_path, **overrides) -> Path:
    grid = {"name": "t", "data_root": "/data", "output_dir": str(tmp_path / "runs"), "tasks": ["xflickrco", "xvnli"],
            "protocols": ["zero_shot", "few_shot"], "languages": {"xflickrco": ["de"], "xvnli": ["ar"]},
            "few_shot_languages": {"xflickrco": ["de"], "xvnli": ["ar"]}, "shots": ["1"], "include_english": False,
            "images": {"xflickrco": "/img/xfc", "xvnli": "/img/flickr"}, "train_images": {"xflickrco": "/img/flickr"},
            "models": {"clip": {"hf": {"backend": "clip", "model": "/m/clip",
                                       "train": {"lr": 1e-5, "epochs": 2, "flags": ["--amp", "bf16"]}}},
                       "llava": {"hf": {"backend": "mllm", "model": "llava-hf/llava-1.5-7b-hf", "revision": "abc",
                                        "dtype": "bf16", "rules": {"xvnli": "letter"}, "train": {"batch_size": 32}}}}}
    grid.update(overrides)
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _after(argv: list[str], flag: str) -> list[str]:
    """The values following each occurrence of `flag`."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_plan_fine_tunes_transfers_and_few_shots_both_kinds(tmp_path):
    cells = {c.id: c for c in plan_cells(load_grid(_grid(tmp_path)))}
    runs = tmp_path / "runs"
    lrs = ("1e-4", "5e-5", "1e-5")
    assert sorted(cells) == sorted(
        [f"finetune/{m}/{t}/seed0" for m, t in (("clip", "xflickrco"), ("llava", "xvnli"))]
        + [f"zero_shot/{m}/{t}/{l}{s}" for m, t, l in (("clip", "xflickrco", "de"), ("llava", "xvnli", "ar"))
           for s in ("", "/seed0")]
        + [f"few_shot_train/{m}/{t}/{l}/1/seed0/lr{lr}" for m, t, l in (("clip", "xflickrco", "de"),
                                                                        ("llava", "xvnli", "ar")) for lr in lrs]
        + ["few_shot_test/clip/xflickrco/de/1/seed0", "few_shot_test/llava/xvnli/ar/1/seed0"])

    # English fine-tuning: the published model on the task's English training data, hf.train's settings
    clip_en, llava_en = cells["finetune/clip/xflickrco/seed0"], cells["finetune/llava/xvnli/seed0"]
    argv = clip_en.commands[0].argv
    assert argv[1:4] == ["-m", "volta_ml.cli", "train"] and _after(argv, "--hf_model") == ["/m/clip"]
    assert _after(argv, "--task") == ["8"] and _after(argv, "--images") == ["/img/flickr"]   # train_images
    assert _after(argv, "--lr") == ["1e-05"] and _after(argv, "--num_epoch") == ["2"] and "--amp" in argv
    assert _after(argv, "--output_dir") == [str(runs / "finetune/clip/xflickrco/seed0/ckpt")]
    argv = llava_en.commands[0].argv
    assert _after(argv, "--hf_model") == ["llava-hf/llava-1.5-7b-hf@abc"] and _after(argv, "--task") == ["19"]
    assert _after(argv, "--hf_backend") == ["mllm"] and _after(argv, "--batch_size") == ["32"]
    assert "--hf_adapter" not in argv and clip_en.extra["best"] == "hf_best"

    # zero-shot: the published model (its own row) and the English export (the fine-tuned row)
    published, tuned = cells["zero_shot/clip/xflickrco/de"], cells["zero_shot/clip/xflickrco/de/seed0"]
    assert _after(published.commands[0].argv, "--model") == ["/m/clip"] and not published.depends_on
    assert _after(tuned.commands[0].argv, "--model") == [str(runs / "finetune/clip/xflickrco/seed0/hf_best")]
    assert _after(tuned.commands[0].argv, "--images") == ["/img/xfc"]
    assert tuned.depends_on == [clip_en.id] and tuned.extra["variant"] == "fine-tuned"
    argv = cells["zero_shot/llava/xvnli/ar/seed0"].commands[0].argv      # generative: base model + adapter
    assert _after(argv, "--model") == ["llava-hf/llava-1.5-7b-hf"] and _after(argv, "--revision") == ["abc"]
    assert _after(argv, "--adapter") == [str(runs / "finetune/llava/xvnli/seed0/hf_best")]
    assert _after(argv, "--rule") == ["letter"] and "--adapter" not in cells["zero_shot/llava/xvnli/ar"].commands[0].argv

    # few-shot: from the English export, IGLUE's files, rates and schedule; the zoo's selection step, then the test
    train = cells["few_shot_train/clip/xflickrco/de/1/seed0/lr5e-5"]
    argv = train.commands[0].argv
    assert _after(argv, "--hf_model") == [str(runs / "finetune/clip/xflickrco/seed0/hf_best")]
    assert _after(argv, "--train_annotations_jsonpath") == ["/data/xFlickrCO/annotations/de/train_1.jsonl"]
    assert _after(argv, "--val_annotations_jsonpath") == ["/data/flickr30k/annotations/valid_ann.jsonl"]
    assert _after(argv, "--task") == ["xflickrco"]       # IGLUE's task (its image template), not English's 8
    assert _after(argv, "--lr") == ["5e-5"] and _after(argv, "--num_epoch") == ["20"]
    assert _after(argv, "--batch_size") == ["1"] and _after(argv, "--images") == ["/img/xfc"]
    assert train.depends_on == [clip_en.id] and "--amp" in argv          # hf.train.flags on every training run
    argv = cells["few_shot_train/llava/xvnli/ar/1/seed0/lr1e-4"].commands[0].argv
    assert _after(argv, "--hf_model") == ["llava-hf/llava-1.5-7b-hf@abc"]
    assert _after(argv, "--hf_adapter") == [str(runs / "finetune/llava/xvnli/seed0/hf_best")]
    assert _after(argv, "--batch_size") == ["2"]          # IGLUE's 1-shot XVNLI schedule, not hf.train's 32
    test = cells["few_shot_test/llava/xvnli/ar/1/seed0"]
    select, run, record = (c.argv for c in test.commands)
    assert select[-2:] == ["select", test.dir] and record[-2:] == ["record", test.dir]
    assert _after(run, "--adapter") == [str(Path(test.dir) / "selected" / "hf_best")]
    assert test.extra["learning_rates"] == list(lrs) and test.extra["best"] == "hf_best"
    assert test.protocol == "few_shot" and test.shot == "1" and test.extra["variant"] == "fine-tuned"


def test_translate_test_has_both_rows_too(tmp_path):
    cells = {c.id: c for c in plan_cells(load_grid(_grid(tmp_path, protocols=["translate_test"])))}
    assert not any(i.startswith("few_shot") for i in cells)
    published, tuned = cells["translate_test/llava/xvnli/ar"], cells["translate_test/llava/xvnli/ar/seed0"]
    assert _after(published.commands[0].argv, "--protocol") == ["translate-test"] and not published.depends_on
    assert _after(tuned.commands[0].argv, "--adapter") == [str(tmp_path / "runs/finetune/llava/xvnli/seed0/hf_best")]
    assert tuned.depends_on == ["finetune/llava/xvnli/seed0"] and tuned.extra["variant"] == "fine-tuned"


def test_hf_training_cells_become_slurm_stages(tmp_path):
    from volta_ml.protocols.slurm import write_slurm

    grid = load_grid(_grid(tmp_path))
    submit = write_slurm("t", plan_cells(grid), tmp_path / "slurm", {}, {}, grid.step()).read_text()
    jobs = {line.split(".sbatch)")[0].split(" ")[-1]: line for line in submit.splitlines() if line.startswith("j=")}
    assert list(jobs) == ["finetune", "zero_shot", "few_shot_train", "few_shot_test"]
    assert "--dependency" not in jobs["finetune"]
    assert "--dependency=afterok:${finetune}" in jobs["zero_shot"]
    assert "--dependency=afterok:${finetune}" in jobs["few_shot_train"]
    assert "--dependency=afterok:${few_shot_train}" in jobs["few_shot_test"]
    script = (tmp_path / "slurm" / "finetune.sbatch").read_text()
    assert "--hf_model /m/clip" in script and "--hf_model llava-hf/llava-1.5-7b-hf@abc" in script


@pytest.mark.parametrize("change,message", [
    ({"train": {"lr": 1e-5, "epoch": 2}}, r"models.clip.hf.train: unknown key\(s\) \['epoch'\]"),
    ({"train": [1]}, r"models.clip.hf.train: expected a mapping"),
    ({"train": {"flags": {"a": 1}}}, r"models.clip.hf.train.flags: expected a list of strings"),
    ({"backend": "mine", "train": {}}, r"models.clip.hf.train: backend 'mine' cannot be trained"),
])
def test_bad_train_block_is_one_line(tmp_path, change, message):
    path = _grid(tmp_path, models={"clip": {"hf": dict({"backend": "clip", "model": "/m/clip"}, **change)}})
    with pytest.raises(GridError, match=message):
        load_grid(path)


def test_few_shot_needs_train_and_translate_train_is_refused(tmp_path):
    models = {"clip": {"hf": {"backend": "clip", "model": "/m/clip"}}}
    with pytest.raises(GridError, match=r"models.clip.hf: few_shot starts from the English fine-tuned model; give "
                                        r"hf.train"):
        plan_cells(load_grid(_grid(tmp_path, models=models)))
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "sweep",
                           str(_grid(tmp_path, protocols=["translate_train"]))], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("Hugging Face models run zero_shot, translate_test, "
                                                         "few_shot, not translate_train (give them their own grid)")


def _record(runs: Path, cell: str, **fields) -> None:
    path = runs / cell / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(fields, status="done")))


def test_report_rows_beside_the_zoo(tmp_path):
    """The published model's zero-shot row, the fine-tuned row (transfer and few-shot), and a zoo row."""
    from volta_ml.protocols.report import write_report
    from volta_ml.protocols.results import collect

    runs = tmp_path / "runs"
    scores = {("zero_shot", "", "ar"): 40.0, ("zero_shot", "", "es"): 42.0, ("zero_shot", "fine-tuned", "ar"): 60.0,
              ("zero_shot", "fine-tuned", "es"): 64.0, ("few_shot", "fine-tuned", "ar"): 66.0,
              ("few_shot", "fine-tuned", "es"): 70.0}
    for (protocol, variant, lang), score in scores.items():
        extra = {"variant": variant} if variant else {}
        _record(runs, f"{protocol}/llava/{lang}{'/ft' if variant else ''}", protocol=protocol, model="llava",
                task="xvnli", lang=lang, shot="1" if protocol == "few_shot" else None, rule="letter",
                metrics={"score": score}, **extra)
    for lang, score in (("ar", 55.0), ("es", 57.0)):
        _record(runs, f"zoo/{lang}", protocol="zero_shot", model="uc2", task="xvnli", lang=lang, metrics={"score": score})
    write_report(collect(runs), tmp_path / "report")
    zero = list(csv.reader((tmp_path / "report" / "XVNLI_0.csv").open()))
    assert zero == [["model", "ar", "es", "avg"], ["uc2", "55.0", "57.0", "56.0"], ["llava", "40.0", "42.0", "41.0"],
                    ["llava (fine-tuned)", "60.0", "64.0", "62.0"]]
    few = list(csv.reader((tmp_path / "report" / "XVNLI_1.csv").open()))
    assert few == [["model", "ar", "es", "avg"], ["llava (fine-tuned)", "66.0", "70.0", "68.0"]]
    summary = list(csv.reader((tmp_path / "report" / "XVNLI_summary.csv").open()))
    assert summary[0] == ["model", "en", "zero-shot", "translate-test", "1-shot"]
    assert summary[1:] == [["uc2", "", "56.0", "", ""], ["llava", "", "41.0", "", ""],
                           ["llava (fine-tuned)", "", "62.0", "", "68.0"]]


# --- the example grid end to end, tiny -------------------------------------------------------------------------
def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """Tiny models (CLIP; Qwen2-VL, built once per session for every test that wants it) and one IGLUE-shaped data
    root: Flickr30k's and SNLI-VE's English train/dev files, xFlickr&CO's German and XVNLI's Arabic test and
    1-shot files, all on the coloured pictures of tests/helpers_hf_train.py (one image folder)."""
    root = tmp_path_factory.mktemp("hf_protocol")
    data, images = make_flickr_root(root, n_train=16, n_val=8)
    make_xvnli_root(root, n_train=16, n_val=8)
    for task, lang, train, dev in (("xFlickrCO", "de", "flickr30k/annotations/train_ann.jsonl",
                                    "flickr30k/annotations/valid_ann.jsonl"),
                                   ("XVNLI", "ar", "XVNLI/annotations/en/train.jsonl", "XVNLI/annotations/en/dev.jsonl")):
        _write_jsonl(data / f"{task}/annotations/{lang}/test.jsonl", _read_jsonl(data / dev))
        _write_jsonl(data / f"{task}/annotations/{lang}/train_1.jsonl", _read_jsonl(data / train)[:2])
    return {"root": root, "data": data, "images": images, "clip": build("clip", root / "models"),
            "generative": build_family("qwen2-vl", shared_root())}


def tiny_grid(world, out: Path) -> Path:
    """examples/grids/iglue_hf_protocol.yml with tiny local models (the generative one a Qwen2-VL: the mllm backend
    like LLaVA), one task and language per model, one shot count, 2 rates, CPU."""
    grid = yaml.safe_load(EXAMPLE.read_text())
    grid.pop("slurm")
    grid.pop("train_images")
    workers = ["--num_workers", "0", "--num_val_workers", "0"]
    clip, llava = grid["models"]["clip-vit-b32"]["hf"], grid["models"]["llava-1.5-7b"]["hf"]
    clip.update(model=str(world["clip"]), device="cpu", batch_size=8,
                train={"lr": "3e-3", "batch_size": 8, "epochs": 2, "flags": workers + ["--hf_val_gallery", "8"]})
    llava.update(model=str(world["generative"]), dtype="fp32", device="cpu", batch_size=8,
                 train={"lr": "2e-2", "batch_size": 8, "epochs": 1, "flags": workers + ["--lora_r", "4"]})
    tasks = {"xflickrco": "de", "xvnli": "ar"}
    grid.update(data_root=str(world["data"]), output_dir=str(out), tasks=list(tasks), include_english=False,
                images={t: str(world["images"]) for t in tasks}, languages={t: [l] for t, l in tasks.items()},
                few_shot_languages={t: [l] for t, l in tasks.items()}, shots=["1"], learning_rates=["1e-4", "1e-5"],
                num_epoch=1, env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    path = out.parent / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_example_grid_end_to_end_tiny(tiny_world, tmp_path):
    runs = tmp_path / "runs"
    grid = tiny_grid(tiny_world, runs)
    out = _cli("sweep", str(grid), "--local")
    assert "12 ran, 0 already finished, 0 failed, 0 blocked" in out.stdout
    _cli("report", str(runs), "--no_plots")
    result = lambda cell: json.loads((runs / cell / "result.json").read_text())  # noqa: E731
    table = lambda stem: list(csv.reader((runs / "report" / f"{stem}.csv").open()))  # noqa: E731

    for model, task, lang, stems in (("clip-vit-b32", "xflickrco", "de", {"xFlickrCO_ir": "ir_r1", "xFlickrCO_tr": "tr_r1"}),
                                     ("llava-1.5-7b", "xvnli", "ar", {"XVNLI": "score"})):
        # few-shot: the zoo's selection (the higher dev score of the rates' training logs, ties to the first)
        base = f"{model}/{task}/{lang}/1/seed0"
        test = result(f"few_shot_test/{base}")
        dev = {lr: result(f"few_shot_train/{base}/lr{lr}")["metrics"]["dev"] for lr in ("1e-4", "1e-5")}
        assert test["selected_lr"] == ("1e-4" if dev["1e-4"] >= dev["1e-5"] else "1e-5")
        chosen = (runs / f"few_shot_train/{base}/lr{test['selected_lr']}/hf_best").resolve()
        assert (runs / f"few_shot_test/{base}/selected/hf_best").resolve() == chosen
        assert test["checkpoint"] == str(chosen) and test["variant"] == "fine-tuned"
        published, tuned = result(f"zero_shot/{model}/{task}/{lang}"), result(f"zero_shot/{model}/{task}/{lang}/seed0")
        # IGLUE's tables: the published model's zero-shot row, the fine-tuned row (transfer, few-shot)
        for stem, metric in stems.items():
            assert table(f"{stem}_0")[1:] == [[model] + [repr(published["metrics"][metric])] * 2,
                                              [f"{model} (fine-tuned)"] + [repr(tuned["metrics"][metric])] * 2]
            assert table(f"{stem}_1") == [["model", lang, "avg"],
                                          [f"{model} (fine-tuned)"] + [repr(test["metrics"][metric])] * 2]
            summary = table(f"{stem}_summary")
            assert summary[0] == ["model", "en", "zero-shot", "translate-test", "1-shot"]
            assert summary[1:] == [[model, "", repr(published["metrics"][metric]), "", ""],
                                   [f"{model} (fine-tuned)", "", repr(tuned["metrics"][metric]), "",
                                    repr(test["metrics"][metric])]]
    # the English fine-tuning changed the dual encoder's retrieval (the tiny generative model may tie at chance)
    assert result("zero_shot/clip-vit-b32/xflickrco/de")["metrics"] != result(
        "zero_shot/clip-vit-b32/xflickrco/de/seed0")["metrics"]


def test_sharded_cells_launch_one_process_per_gpu(tmp_path):
    """examples/grids/iglue_hf_sharded.yml: `hf.train.sharding` / `processes` / `finetune` on every training cell;
    a full fine-tuning's export is a model folder (`--model`, `--hf_model`), LoRA's an adapter."""
    grid = yaml.safe_load((REPO / "examples/grids/iglue_hf_sharded.yml").read_text())
    grid["output_dir"] = str(tmp_path / "runs")
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    cells = {c.id: c for c in plan_cells(load_grid(path))}
    runs = tmp_path / "runs"
    for model, full in (("qwen2.5-vl-72b", False), ("qwen2.5-vl-32b-full", True)):
        english = cells[f"finetune/{model}/xvnli/seed0"].commands[0].argv
        few = cells[f"few_shot_train/{model}/xvnli/ar/1/seed0/lr1e-4"].commands[0].argv
        for argv in (english, few):
            assert argv[1:8] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "8",
                                 "--no-python", argv[0]]
            assert argv[8:11] == ["-m", "volta_ml.cli", "train"] and _after(argv, "--sharding") == ["fsdp"]
            assert _after(argv, "--finetune") == (["full"] if full else [])
        export = str(runs / f"finetune/{model}/xvnli/seed0/hf_best")
        transfer = cells[f"zero_shot/{model}/xvnli/ar/seed0"].commands[0].argv
        if full:
            assert _after(few, "--hf_model") == [export] and "--hf_adapter" not in few
            assert _after(transfer, "--model") == [export] and "--adapter" not in transfer
        else:
            assert _after(few, "--hf_adapter") == [export] and _after(transfer, "--adapter") == [export]
    for change, message in (({"sharding": "zero3"}, r"hf.train.sharding: 'zero3'; expected one of ddp, fsdp"),
                            ({"processes": "0"}, r"hf.train.processes: '0'"),
                            ({"finetune": "full"}, r"hf.train.finetune: generative models only")):
        bad = _grid(tmp_path, models={"clip": {"hf": {"backend": "clip", "model": "/m/clip", "train": change}}})
        with pytest.raises(GridError, match=message):
            load_grid(bad)


def test_a_multi_node_training_cell_runs_under_srun_with_the_first_node_as_rendezvous(tmp_path):
    """`hf.train: {sharding: fsdp, processes: 2, nodes: 2}`: the training command is one Slurm task per GPU of 2 nodes
    (`srun --nodes 2 --ntasks-per-node 2`); the stage's script asks Slurm for the nodes and, run as Slurm runs it
    (a fake `srun` / `scontrol` on PATH), exports the allocation's first node and the job's port before the command."""
    import os
    import shutil
    import subprocess

    from volta_ml.protocols.slurm import write_slurm
    train = {"sharding": "fsdp", "processes": 2, "nodes": 2, "batch_size": 32}
    models = {"llava": {"hf": {"backend": "mllm", "model": "llava-hf/llava-1.5-7b-hf", "train": train}}}
    grid = load_grid(_grid(tmp_path, models=models, tasks=["xvnli"], languages={"xvnli": ["ar"]},
                           few_shot_languages={"xvnli": ["ar"]}))
    cells = plan_cells(grid)
    argv = next(c for c in cells if c.stage == "finetune").commands[0].argv
    assert argv[:6] == ["srun", "--nodes", "2", "--ntasks-per-node", "2", "--kill-on-bad-exit=1"]
    assert argv[6:6 + len(grid.commands["train"])] == grid.commands["train"] and _after(argv, "--sharding") == ["fsdp"]
    few = next(c for c in cells if c.stage == "few_shot_train").commands[0].argv
    assert few[:3] == ["srun", "--nodes", "2"]
    with pytest.raises(GridError, match=r"slurm.stages.finetune.nodes: 1, but its cells train on 2 nodes"):
        write_slurm("t", cells, tmp_path / "bad", {}, {}, ["false"])
    slurm = {"stages": {stage: {"nodes": 2, "ntasks_per_node": 2, "gres": "gpu:2"}
                        for stage in ("finetune", "few_shot_train")}}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    step = bin_dir / "step"          # the in-cell steps: no cell is finished, the others succeed
    step.write_text('#!/bin/bash\n[[ "$1" != is-done ]]\n')
    write_slurm("t", cells, tmp_path / "slurm", slurm, {}, [str(step)])
    script = tmp_path / "slurm" / "finetune.sbatch"
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=2" in text
    assert "MASTER_ADDR" not in (tmp_path / "slurm" / "zero_shot.sbatch").read_text()   # one-node stages unchanged
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[[ "$*" == "show hostnames gpu[07-08]" ]] && printf "gpu07\\ngpu08\\n"\n')
    (bin_dir / "srun").write_text('#!/bin/bash\necho "srun $* MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"\n')
    for tool in ("scontrol", "srun", "step"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "0",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4321"}
    done = subprocess.run([shutil.which("bash"), str(script)], capture_output=True, text=True, env=env, timeout=60)
    cell = next(c for c in cells if c.stage == "finetune")     # (its record step then fails: nothing was trained)
    logged = Path(cell.commands[0].stdout).read_text().strip()
    assert logged.startswith("srun --nodes 2 --ntasks-per-node 2 --kill-on-bad-exit=1 ")
    assert logged.endswith(" MASTER_ADDR=gpu07 MASTER_PORT=24321")
