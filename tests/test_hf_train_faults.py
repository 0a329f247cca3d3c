"""`volta-ml train --hf_model` when something is wrong or goes wrong (issues #34, #35): the validation loss with
rows that have no gold answer, the `hf_best/` export under a full disk and kills, resume files that do not fit.
A tiny random Qwen2-VL (LoRA) and CLIP (tests/helpers_vlm_families.py, tests/helpers_hf.py) on tiny XVNLI- and
Flickr30k-style data roots (tests/helpers_hf_train.py, whose entry point injects the export's faults).

- the validation loss is the mean answer NLL over the labelled rows, computed one row at a time here, at eval
  batch 1, 4 and on 2 gloo ranks;
- a full disk in the export (a tmpfs filled up, or a file size limit where user namespaces are not available):
  exit 4, one line naming the file and the free space, the previous export complete, and `iglue-hf` on it says
  that it is older than the run's best; then a kill between the export's two renames (a file system without an
  atomic exchange) and a full disk in the next run's first export: a complete export on disk throughout; the
  finished run's export is its best; a full disk on the dual encoder's `config.json` names that file;
- a resume file from another model, LoRA rank or target set, an older one that does not record its model, a
  truncated one: one line (exit 2) naming the file and what differs.
"""
import json
import subprocess
import sys

import pytest
import torch

from helpers_drills import userns_tmpfs_available
from helpers_hf import build
from helpers_hf_train import REPO, make_flickr_root, make_xvnli_root, train_env
from helpers_train import free_port
from helpers_vlm_families import build_family, shared_root

ENTRY = str(REPO / "tests" / "helpers_hf_train.py")
XVNLI_RUN, CLIP_RUN = "XVNLI_qwen2-vl", "RetrievalFlickr30k_clip"
COMMON = ["--num_workers", "0", "--num_val_workers", "0", "--warmup_proportion", "0", "--lora_dropout", "0"]
UNLABELLED = (1, 4, 5)      # dev rows whose gold label is "-" (XVNLI has such rows)


@pytest.fixture(scope="module")
def qwen():
    return build_family("qwen2-vl", shared_root())


@pytest.fixture(scope="module")
def xvnli(tmp_path_factory):
    data, images = make_xvnli_root(tmp_path_factory.mktemp("xvnli"), n_train=8, n_val=11)
    dev = data / "XVNLI/annotations/en/dev.jsonl"
    rows = [json.loads(line) for line in dev.read_text().splitlines()]
    for i in UNLABELLED:
        rows[i]["gold_label"] = "-"
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data, images


def _xvnli_argv(out, qwen, xvnli, *extra):
    data, images = xvnli
    return ["--hf_model", str(qwen), "--data_root", str(data), "--images", str(images), "--task", "xvnli",
            "--output_dir", str(out / "save"), "--logdir", str(out / "logs"), "--batch_size", "4", "--lr", "0",
            "--lora_r", "4", *COMMON, *extra]


def _in_process(argv, entry=False) -> int:
    """A run in this process, one thread (as the subprocesses); `entry`: through the helper entry's job wrapper."""
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, run
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if entry:
            import helpers_hf_train
            return helpers_hf_train.main(argv)
        return run(parse_train_args(argv), build_task_job)
    finally:
        torch.set_num_threads(threads)


def _subprocess(argv, cwd, timeout=180, wrap=(), **env):
    return subprocess.run([*wrap, sys.executable, ENTRY, *argv], cwd=cwd, env=train_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def _last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


def _one_line_error(code: int, stderr: str, expected_code: int) -> str:
    """The last stderr line, after checking the exit code and that no traceback was printed."""
    assert code == expected_code, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return _last_line(stderr)


# --- the validation loss ----------------------------------------------------------------------------------------
def _tensorboard_losses(logdir) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(logdir / XVNLI_RUN))
    events.Reload()
    return [e.value for e in events.Scalars("val/XVNLI_loss")]


def _answer_nll_over_labelled_rows(qwen, xvnli) -> float:
    """One row at a time, the obvious way: the base model (lr 0 leaves LoRA's B at zero) on the scoring input
    followed by the gold letter's token; -log p(letter) at the last prompt position; the mean over the rows that
    have a gold label."""
    from volta_ml.hf.base import ModelSpec
    from volta_ml.hf.mllm import GenerativeBackend
    from volta_ml.iglue_hf.data import read_xvnli
    from volta_ml.iglue_hf.images import ImageSource
    from volta_ml.iglue_hf.prompts import OPTIONS, letter_choices, user_turn
    data, images = xvnli
    backend = GenerativeBackend(ModelSpec(model=str(qwen)))
    source = ImageSource(images, "{id}.jpg")
    nlls = []
    for example in read_xvnli(str(data / "XVNLI/annotations/en/dev.jsonl"), "en"):
        if example.label not in OPTIONS["xvnli"]:
            continue
        prompt = user_turn("xvnli", "letter", example)
        letter = backend.choice_ids(letter_choices("xvnli"), prompt)[OPTIONS["xvnli"].index(example.label)][0]
        inputs = backend.encode([[source.load(example.images[0])]], [prompt])
        length = inputs["input_ids"].shape[1]
        added = {"input_ids": letter, "attention_mask": 1}      # other per-token keys: 0 (a text token)
        for key, value in list(inputs.items()):
            if value.dim() == 2 and value.shape == (1, length):
                inputs[key] = torch.cat([value, torch.full((1, 1), added.get(key, 0), dtype=value.dtype)], dim=1)
        with torch.no_grad():
            logits = backend.model(**inputs).logits[0, -2].double()
        nlls.append(-torch.log_softmax(logits, -1)[letter].item())
    assert len(nlls) == 11 - len(UNLABELLED)
    return sum(nlls) / len(nlls)


def test_validation_loss_is_the_mean_answer_nll_over_labelled_rows(tmp_path, qwen, xvnli):
    expected = _answer_nll_over_labelled_rows(qwen, xvnli)
    flags = ["--num_epoch", "1"]
    for batch in (1, 4):
        out = tmp_path / f"eval{batch}"
        assert _in_process(_xvnli_argv(out, qwen, xvnli, *flags, "--eval_batch_size", str(batch))) == 0
        assert _tensorboard_losses(out / "logs") == [pytest.approx(expected, rel=1e-5)], batch
    out = tmp_path / "ranks2"
    argv = _xvnli_argv(out, qwen, xvnli, *flags, "--batch_size", "8", "--eval_batch_size", "4")
    for _attempt in range(3):     # two processes with Slurm's variables (no torchrun agent to start)
        port, logs = str(free_port()), [tmp_path / f"rank{r}.log" for r in (0, 1)]
        ranks = []
        for r, log in enumerate(logs):    # stderr into files: a full pipe would stall one rank, and both
            with log.open("w") as handle:
                ranks.append(subprocess.Popen(
                    [sys.executable, ENTRY, *argv], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=handle,
                    env=train_env(SLURM_NTASKS="2", SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_JOB_ID="4343",
                                  SLURM_JOB_NODELIST="localhost", MASTER_PORT=port)))
        outcomes = [(rank.wait(timeout=300), log.read_text()) for rank, log in zip(ranks, logs)]
        if not any("Address already in use" in err for _, err in outcomes):
            break
    for code, err in outcomes:
        assert code == 0, err[-3000:]
    assert "world size 2" in outcomes[0][1]
    assert _tensorboard_losses(out / "logs") == [pytest.approx(expected, rel=1e-5)]


# --- the export under kills and a full disk -----------------------------------------------------------------------
IN_A_TMPFS = r"""
disk=$1; keep=$2; shift 2
mount -t tmpfs -o size=16m tmpfs "$disk" || exit 97
cp -a "$keep"/. "$disk"/
"$@"; rc=$?
rm -rf "$keep"; mkdir "$keep"; cp -a "$disk"/. "$keep"/; exit $rc
"""


def _on_a_disk_that_fills_up(tmp_path, argv, **env) -> tuple[subprocess.CompletedProcess, object]:
    """`argv` (the helper entry's flags, writing under tmp_path/save) with its export's `full` fault on a real
    full disk: a 16 MB tmpfs (ENOSPC) holding a copy of tmp_path/save, copied back afterwards, where user
    namespaces allow it; else the same folder with a file size limit of 0 (EFBIG). (process, where the process
    saw tmp_path/save)."""
    if not userns_tmpfs_available():
        return _subprocess(argv, tmp_path, **env), tmp_path / "save"
    disk = tmp_path / "disk"
    disk.mkdir(exist_ok=True)
    (tmp_path / "save").mkdir(exist_ok=True)
    argv = [str(disk) if a == str(tmp_path / "save") else a for a in argv]
    proc = _subprocess(argv, tmp_path, wrap=("unshare", "-rm", "sh", "-c", IN_A_TMPFS, "disk", str(disk),
                                            str(tmp_path / "save")), HF_FULL_DISK="tmpfs", **env)
    assert proc.returncode != 97, "cannot mount a tmpfs"
    return proc, disk


def _record(export) -> dict:
    return json.loads((export / "volta_ml_export.json").read_text())


def test_full_disk_and_kills_in_the_export_leave_a_complete_export(tmp_path, qwen, xvnli, capsys, monkeypatch):
    """1st run: the disk is full while safetensors writes the weights of its 2nd export (a LoRA of rank 64:
    larger than the space left): exit 4, one line; iglue-hf on the export says it is older than the run's best.
    2nd run, resumed: killed between the two renames of its export (a file system without an atomic exchange, as
    NFS). 3rd run, resumed: the disk is full in its first export: the interrupted swap was finished first, never
    undone. 4th run, resumed: finishes; its export is its best."""
    from volta_ml.cli import main
    from volta_ml.hf.export import status
    argv = _xvnli_argv(tmp_path, qwen, xvnli, "--num_epoch", "3", "--eval_batch_size", "11", "--lr", "1e-2",
                       "--lora_r", "64", "--checkpoint_every_steps", "1")
    run, export = tmp_path / "save" / XVNLI_RUN, tmp_path / "save" / XVNLI_RUN / "hf_best"
    resume = [*argv, "--resume_file", str(run / "pytorch_ckpt_latest.tar")]

    first, seen = _on_a_disk_that_fills_up(tmp_path, argv, HF_TRAIN_RISING="1", HF_EXPORT_FAULT="full:2",
                                           HF_FULL_DISK_LEAVE="32768")
    line = _one_line_error(first.returncode, first.stderr, 4)
    # safetensors removes the file it could not write: the line names the new export's folder
    assert line.startswith(f"train_task.py: error: cannot write {seen / XVNLI_RUN / '.hf_best.partial'}: "), line
    assert ("No space left on device" in line or "File too large" in line) and "MiB free there" in line, line
    assert line.endswith("the previous hf_best (if any) is unchanged"), line
    assert _record(export)["epoch"] == 0 and status(str(export))["older_than_best"] is True   # best: epoch 1's

    data, images = xvnli
    capsys.readouterr()
    assert main(["iglue-hf", "--backend", "mllm", "--model", str(qwen), "--adapter", str(export), "--task", "xvnli",
                 "--lang", "en", "--annotations", str(data / "XVNLI/annotations/en/dev.jsonl"), "--images",
                 str(images), "--output_dir", str(tmp_path / "eval"), "--no_progress"]) == 0   # a complete export
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"{export} is older than its run's best: it holds the weights of epoch 0" \
        in warnings[0] and str(run / "pytorch_model_best.bin") in warnings[0], warnings
    results = json.loads((tmp_path / "eval" / "iglue_hf_results.json").read_text())
    assert results["exports"]["adapter"]["older_than_best"] is True and results["exports"]["adapter"]["epoch"] == 0

    second = _subprocess(resume, tmp_path, HF_TRAIN_RISING="1", HF_EXPORT_FAULT="kill_swap:1")
    assert second.returncode == -9, second.stderr[-3000:]
    assert not export.exists()          # the window of a two-rename swap: both exports complete beside it
    assert _record(run / ".hf_best.old")["epoch"] == 0 and _record(run / ".hf_best.new")["epoch"] == 1

    third, _ = _on_a_disk_that_fills_up(tmp_path, resume, HF_TRAIN_RISING="1", HF_EXPORT_FAULT="full:1")
    _one_line_error(third.returncode, third.stderr, 4)
    assert _record(export)["epoch"] == 1 and not (run / ".hf_best.old").exists() and not (run / ".hf_best.new").exists()

    monkeypatch.setenv("HF_TRAIN_RISING", "1")          # the 4th run in this process, through the same entry
    assert _in_process(resume, entry=True) == 0
    assert _record(export)["epoch"] == 2 and status(str(export))["older_than_best"] is False
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []


def test_full_disk_on_the_exports_config_json_names_the_file(tmp_path):
    clip = build("clip", tmp_path / "models")
    data, images = make_flickr_root(tmp_path / "flickr", n_train=8, n_val=4)
    argv = ["--hf_model", str(clip), "--data_root", str(data), "--images", str(images), "--task", "8",
            "--output_dir", str(tmp_path / "save"), "--logdir", str(tmp_path / "logs"), "--batch_size", "8",
            "--num_epoch", "2", "--lr", "1e-4", "--hf_val_gallery", "4", *COMMON[:-2]]
    proc, seen = _on_a_disk_that_fills_up(tmp_path, argv, HF_TRAIN_RISING="1", HF_EXPORT_FAULT="full:2")
    line = _one_line_error(proc.returncode, proc.stderr, 4)
    written = seen / CLIP_RUN / ".hf_best.partial" / "config.json"
    assert line.startswith(f"train_task.py: error: cannot write {written}: "), line
    run = tmp_path / "save" / CLIP_RUN
    assert "MiB free there" in line and line.endswith("the previous hf_best (if any) is unchanged"), line
    assert _record(run / "hf_best")["epoch"] == 0
    assert json.loads((run / "hf_best" / "config.json").read_text())["model_type"] == "clip"


# --- resume files ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resume_file(tmp_path_factory, qwen, xvnli):
    out = tmp_path_factory.mktemp("resumable")
    assert _in_process(_xvnli_argv(out, qwen, xvnli, "--num_epoch", "1", "--lora_target", "q_proj,v_proj")) == 0
    return out / "save" / XVNLI_RUN / "pytorch_ckpt_latest.tar"


@pytest.mark.parametrize("case, flags, expected", [
    ("rank", ["--lora_r", "8", "--lora_target", "q_proj,v_proj"],
     "of another shape (first peft.base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default."
     "weight: file [4, 64], model [8, 64])"),
    ("targets", ["--lora_target", "q_proj,k_proj"], "not in this model (first peft.base_model.model.model."
                                                    "language_model.layers.0.self_attn.v_proj.lora_A.default.weight)"),
    ("model", ["--lora_target", "q_proj,v_proj"], "of another shape (first peft.base_model.model.model.language_model."
                                                  "layers.0.self_attn.v_proj.lora_B.default.weight: file [32, 4], model "
                                                  "[64, 4])"),
    ("older_file", ["--lora_r", "8", "--lora_target", "q_proj,v_proj"], "saved by an older volta-ml that did not "
                                                                        "record its model"),
])
def test_resume_file_of_another_model_is_one_line(tmp_path, qwen, xvnli, resume_file, capsys, case, flags, expected):
    from volta_ml.cli import main
    path = resume_file
    model = qwen
    if case == "older_file":
        state = torch.load(resume_file, weights_only=True)
        del state["saved_from"]
        path = tmp_path / "old.tar"
        torch.save(state, path)
    if case == "model":     # the same family, another attention layout
        model = _other_qwen(tmp_path)
    argv = _xvnli_argv(tmp_path, model, xvnli, "--num_epoch", "1", *flags, "--resume_file", str(path))
    capsys.readouterr()
    code = main(["train", *argv])
    line = _one_line_error(code, capsys.readouterr().err, 2)
    assert line.startswith(f"volta-ml train: error: --resume_file {path}: another model's resume file ("), line
    assert expected in line, line
    if case != "older_file":
        assert f"saved from model {qwen} (qwen2_vl), LoRA r 4 on q_proj,v_proj (4 modules), projector frozen; this run: " \
               f"model {model} (qwen2_vl)" in line, line
    assert not (tmp_path / "save" / XVNLI_RUN / "pytorch_model_0.bin").exists()


def _other_qwen(tmp_path):
    """qwen2-vl's folder with as many key/value heads as query heads (random weights of the same family)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
    qwen = build_family("qwen2-vl", shared_root())
    config = AutoConfig.from_pretrained(qwen)
    config.text_config.num_key_value_heads = config.text_config.num_attention_heads
    torch.manual_seed(0)
    out = tmp_path / "qwen2-vl"
    AutoModelForImageTextToText.from_config(config).save_pretrained(out)
    AutoProcessor.from_pretrained(qwen).save_pretrained(out)
    return out


def test_truncated_resume_file_is_one_line(tmp_path, qwen, xvnli, resume_file, capsys):
    from volta_ml.cli import main
    truncated = tmp_path / "latest.tar"
    truncated.write_bytes(resume_file.read_bytes()[:-4000])
    capsys.readouterr()
    code = main(["train", *_xvnli_argv(tmp_path, qwen, xvnli, "--num_epoch", "1", "--resume_file", str(truncated))])
    line = _one_line_error(code, capsys.readouterr().err, 2)
    assert line.startswith(f"volta-ml train: error: --resume_file {truncated}: truncated or corrupt"), line
    assert "codec" not in line, line
