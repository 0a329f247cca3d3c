"""No file volta-ml reads runs code: VOLTA resume files through torch's weights-only unpickler with inert stand-ins
for VOLTA's own classes, annotation pickles through the restricted reader. Every crafted file here would create
a marker file if any of its code ran; the tests check that the marker never appears."""
from __future__ import annotations

import os
import pickle
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers_train import REPO, run_dir, run_toy, toy_env
from volta_ml.data.annotations import AnnotationError, read_pickle
from volta_ml.engine import checkpointing as ckpt
from volta_ml.engine.failures import UsageError

# VOLTA's logger and stop controller, at their real module paths, with the fields VOLTA pickles. Their
# __setstate__ touches a marker (VOLTA's own reopens the TensorBoard writer and out.txt): volta-ml must not run it.
VOLTA_PACKAGE = {
    "volta/__init__.py": "",
    "volta/train_utils.py": """
        import os
        class tbLogger(object):
            def __init__(self, log_dir, txt_dir, task_names, task_ids, task_num_iters):
                self.save_logger, self.log_dir, self.txt_dir = True, log_dir, txt_dir
                self.task_id2name = dict(zip(task_ids, task_names))
                self.task_ids = task_ids
                self.task_loss = {t: 0.25 for t in task_ids}
                self.task_step = {t: 40 for t in task_ids}
                self.task_num_iters = task_num_iters
                self.epochId = 3
            def __getstate__(self):
                return dict(self.__dict__)
            def __setstate__(self, d):
                open(os.environ["VOLTA_MARKER"], "w").write("tbLogger.__setstate__ ran")
                self.__dict__.update(d)
        """,
    "volta/evil.py": """
        class Evil(object):
            pass
        """,
    "volta/task_utils.py": """
        class MultiTaskStopOnPlateau(object):
            def __init__(self, mode="max", patience=1):
                self.mode, self.patience, self.in_stop, self.best = mode, patience, False, 0.61
        """,
}


def _write_volta_package(root: Path) -> Path:
    for rel, text in VOLTA_PACKAGE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def _save_volta_resume_file(tmp: Path, state_dict_path: Path, out: Path, legacy: bool, epoch_id=0, score=0.61,
                            evil: bool = False) -> Path:
    """A resume file written the way VOLTA's train_task.py writes it, with VOLTA's classes imported from a folder
    for the save only: they leave sys.modules and sys.path before anything is read back."""
    pkg = str(_write_volta_package(tmp / "volta_src"))
    sys.path.insert(0, pkg)
    try:
        from volta.evil import Evil
        from volta.task_utils import MultiTaskStopOnPlateau
        from volta.train_utils import tbLogger
        weights = torch.load(state_dict_path, weights_only=True)
        state = {"model_state_dict": {"module." + k: v for k, v in weights.items()},
                 "optimizer_state_dict": {"state": {}, "param_groups": []},
                 "scheduler_state_dict": {"last_epoch": 40}, "global_step": 40, "epoch_id": epoch_id,
                 "tb_logger": tbLogger("logs", "save", ["Toy"], ["TASK0"], {"TASK0": 12}),
                 "task_stop_controller": {"TASK0": MultiTaskStopOnPlateau()}, "score": np.float64(score)}
        if evil:
            state["other"] = Evil()
        torch.save(state, out, _use_new_zipfile_serialization=not legacy)
    finally:
        sys.path.remove(pkg)
        for name in [m for m in sys.modules if m == "volta" or m.startswith("volta.")]:
            del sys.modules[name]
    return out


@pytest.fixture()
def marker(tmp_path, monkeypatch):
    path = tmp_path / "code_ran.txt"
    monkeypatch.setenv("VOLTA_MARKER", str(path))
    return path


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-torch<1.6"])
def test_volta_resume_file_loads_with_inert_stand_ins(tmp_path, marker, legacy):
    model = nn.Linear(3, 2)
    torch.save(model.state_dict(), tmp_path / "w.bin")
    path = _save_volta_resume_file(tmp_path, tmp_path / "w.bin", tmp_path / "latest.tar", legacy, epoch_id=3)
    assert "volta" not in sys.modules
    state = ckpt.load_latest(path)
    assert not marker.exists(), "VOLTA's tbLogger.__setstate__ ran while reading the resume file"
    assert "volta" not in sys.modules  # VOLTA's classes were never imported
    assert state["format"] == "volta" and state["resume_epoch"] == 4 and state["global_step"] == 40
    assert state["score"] == pytest.approx(0.61)
    assert {k: v.tolist() for k, v in state["model_state_dict"].items()} == \
        {k: v.tolist() for k, v in model.state_dict().items()}


def test_stand_ins_carry_the_fields_and_run_nothing(tmp_path, marker):
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "w.bin")
    path = _save_volta_resume_file(tmp_path, tmp_path / "w.bin", tmp_path / "latest.tar", legacy=False)
    stand_ins = ckpt._stand_ins(ckpt.pickle_globals(path))
    assert sorted(name for _, name in stand_ins) == ["volta.task_utils.MultiTaskStopOnPlateau",
                                                      "volta.train_utils.tbLogger"]
    with torch.serialization.safe_globals(ckpt._numpy_safe_globals() + stand_ins):
        raw = torch.load(path, weights_only=True)
    logger = raw["tb_logger"]
    assert isinstance(logger, ckpt.VoltaObject) and logger.volta_class == "volta.train_utils.tbLogger"
    assert logger.fields["epochId"] == 3 and logger.fields["task_step"] == {"TASK0": 40}
    assert raw["task_stop_controller"]["TASK0"].fields["best"] == 0.61
    assert not marker.exists()


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-torch<1.6"])
def test_resume_file_that_would_run_code_is_refused(tmp_path, marker, legacy):
    path = tmp_path / "latest.tar"
    torch.save({"model_state_dict": {"w": torch.ones(2)}, "epoch_id": 1, "tb_logger": _RunsCode(marker)}, path,
               _use_new_zipfile_serialization=not legacy)
    with pytest.raises(UsageError) as err:
        ckpt.load_latest(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and ("os.system" in message or "posix.system" in message)
    assert not marker.exists(), "the crafted resume file ran its command"


def test_torch_class_outside_the_weights_only_list_is_refused_by_name(tmp_path, marker):
    path = tmp_path / "latest.tar"
    torch.save({"model_state_dict": {}, "module": nn.Linear(2, 2)}, path)
    with pytest.raises(UsageError, match=r"refused: the file names torch\.nn\.modules\.linear\.Linear"):
        ckpt.load_latest(path)


def test_a_volta_named_class_outside_the_known_ones_is_refused(tmp_path, marker):
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "w.bin")
    path = _save_volta_resume_file(tmp_path, tmp_path / "w.bin", tmp_path / "latest.tar", legacy=False, evil=True)
    with pytest.raises(UsageError, match=r"volta\.evil\.Evil"):
        ckpt.load_latest(path)


def test_training_resumes_from_a_volta_resume_file(tmp_path, marker):
    """Through the training entry point: a VOLTA-written resume file restores weights, epoch and score."""
    flags = ["--toy_examples", "24", "--batch_size", "8", "--num_epoch", "2"]
    first = tmp_path / "first"
    first.mkdir()
    assert run_toy(first, *flags[:-1], "1").returncode == 0
    volta_file = _save_volta_resume_file(tmp_path, run_dir(first) / "pytorch_model_0.bin",
                                         tmp_path / "volta_latest.tar", legacy=True, epoch_id=0)
    second = tmp_path / "second"
    second.mkdir()
    proc = run_toy(second, *flags, "--resume_file", str(volta_file), VOLTA_MARKER=str(marker))
    assert proc.returncode == 0, proc.stderr
    assert "was written by VOLTA" in proc.stderr and "Resumed from" in proc.stderr
    assert (run_dir(second) / "pytorch_model_1.bin").exists() and not (run_dir(second) / "pytorch_model_0.bin").exists()
    assert not marker.exists()


def test_training_refuses_a_crafted_resume_file_with_one_line(tmp_path, marker):
    crafted = tmp_path / "latest.tar"
    torch.save({"model_state_dict": {}, "tb_logger": _RunsCode(marker)}, crafted)
    out = tmp_path / "run"
    out.mkdir()
    proc = run_toy(out, "--toy_examples", "8", "--batch_size", "8", "--num_epoch", "1", "--resume_file", str(crafted))
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "refused" in last and str(crafted) in last and "system" in last and "Traceback" not in proc.stderr
    assert not marker.exists()


# ---- annotation pickles ------------------------------------------------------------------------------------

def test_annotation_pickles_of_the_real_kinds_read_as_before(tmp_path):
    targets = [{"question_id": 20968379, "image_id": "n161313", "labels": [3, 17], "scores": [1.0, 0.3]}]
    vocab = {"yes": 0, "no": 1, "Ä-umlaut": 2}
    negatives = {"hard_negative": np.arange(12, dtype=np.int64).reshape(3, 4), "ids": ["a", "b"]}
    for name, obj in (("train_target.pkl", targets), ("ans2label.pkl", vocab), ("hard_negative.pkl", negatives)):
        for protocol in (2, pickle.HIGHEST_PROTOCOL):
            (tmp_path / name).write_bytes(pickle.dumps(obj, protocol=protocol))
            got = read_pickle(tmp_path / name)
            if name == "hard_negative.pkl":
                assert np.array_equal(got["hard_negative"], obj["hard_negative"]) and got["ids"] == ["a", "b"]
            else:
                assert got == obj


def test_annotation_pickle_that_would_run_code_is_refused(tmp_path, marker):
    path = tmp_path / "trainval_label2ans.pkl"
    path.write_bytes(pickle.dumps(["yes", _RunsCode(marker)], protocol=2))
    with pytest.raises(AnnotationError) as err:
        read_pickle(path, "GQA answer vocabulary")
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "system" in message and "refused" in message
    assert not marker.exists()
