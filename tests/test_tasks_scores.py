"""Losses and scores against VOLTA's definitions, on hand-built cases."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from helpers_tasks import REPO
from volta_ml.tasks import gqa, nlvr2, retrieval, visual_entailment
from volta_ml.tasks.common import onehot_score_sum, triplet_loss


class RecordingModel(torch.nn.Module):
    """Returns fixed logits and records the inputs it was called with (shape checks of the reshaping)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.as_tensor(logits, dtype=torch.float32)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def forward(self, input_txt, input_imgs, image_loc, task_id, token_type_ids=None, attention_mask=None,
                image_attention_mask=None):
        self.calls.append(dict(input_txt=input_txt, input_imgs=input_imgs, task_id=task_id,
                               image_attention_mask=image_attention_mask))
        return self.logits + self.anchor


def batch_of(b, rows, txt=5, feat=4, extra=()):
    """A batch of distinct, recognisable inputs: `extra=(4,)` adds retrieval's options dimension."""
    lead = (b, *extra)
    count = int(torch.tensor(lead).prod())
    return {"input_txt": torch.arange(count * txt).view(*lead, txt),
            "input_imgs": torch.arange(count * rows * feat, dtype=torch.float32).view(*lead, rows, feat),
            "image_loc": torch.zeros(*lead, rows, 5),
            "image_attention_mask": torch.ones(*lead, rows, dtype=torch.long),
            "token_type_ids": torch.zeros(*lead, txt, dtype=torch.long),
            "attention_mask": torch.ones(*lead, txt, dtype=torch.long)}


def test_xvnli_accuracy_counts_dash_labels_as_wrong():
    logits = torch.tensor([[3.0, 0, 0], [0, 2.0, 0], [0, 0, 1.0], [5.0, 0, 0], [0, 1.0, 0]])
    target = torch.zeros(5, 3)
    target[0, 0] = target[1, 2] = target[2, 2] = target[4, 1] = 1  # row 3 is a '-' label: all zero
    batch = dict(batch_of(5, 6), target=target)
    loss, score, count, out = visual_entailment.forward_and_loss(RecordingModel(logits), batch, "TASK19")
    assert count == 5 and float(score) == 3.0  # rows 0, 2, 4 right; the '-' row cannot be right
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)  # BCE, not CE
    assert torch.isclose(loss, expected)


def test_gqa_loss_is_scaled_by_vocabulary_and_score_is_soft():
    logits = torch.zeros(2, 6)
    logits[0, 2] = 4.0
    logits[1, 5] = 4.0
    target = torch.zeros(2, 6)
    target[0, 2], target[0, 1] = 0.6, 0.3
    target[1, 0] = 1.0
    batch = dict(batch_of(2, 3), target=target)
    loss, score, count, _ = gqa.forward_and_loss(RecordingModel(logits), batch, "TASK15")
    assert math.isclose(float(score), 0.6, rel_tol=1e-6)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    assert torch.isclose(loss, bce * 6)


def test_gqa_score_denominator_skips_unknown_ids(tmp_path):
    truth = {"1": {"answer": "yes"}, "2": {"answer": "no"}, "3": {"answer": "cat"}}
    preds = [{"questionId": "1", "prediction": "yes"}, {"questionId": "2", "prediction": "yes"},
             {"questionId": "3", "prediction": "cat"}, {"questionId": "99", "prediction": "yes"}]
    accuracy, matched = gqa.gqa_accuracy(preds, truth)
    assert matched == 3 and accuracy == 2 / 3 * 100  # IGLUE: the unknown id 99 is not in the denominator
    many_truth = {str(i): {"answer": "yes"} for i in range(9666)}
    many = [{"questionId": str(i), "prediction": "yes" if i < 3367 else "no"} for i in range(9666)]
    assert repr(gqa.gqa_accuracy(many, many_truth)[0]) == "34.83343678874405"  # an IGLUE xGQA log value
    (tmp_path / "p.json").write_text(json.dumps(preds))
    (tmp_path / "t.json").write_text(json.dumps(truth))
    for command in ([sys.executable, str(REPO / "scripts/GQA_score.py")],
                    [sys.executable, "-m", "volta_ml.cli", "gqa-score"]):
        out = subprocess.run(command + ["--preds_file", str(tmp_path / "p.json"), "--truth_file",
                                        str(tmp_path / "t.json")], capture_output=True, text=True, cwd=REPO,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        assert float(out.stdout.strip().splitlines()[-1]) == pytest.approx(66.66666666666667)
        assert "skipped 1" in out.stderr


def test_nlvr2_pairs_rows_and_consistency():
    logits = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0]])
    batch = dict(batch_of(3, 4), target=torch.tensor([[0.0, 1], [0, 1], [0, 1]]))
    model = RecordingModel(logits)
    loss, score, count, _ = nlvr2.forward_and_loss(model, batch, "TASK12")
    call = model.calls[0]
    assert call["input_imgs"].shape == (6, 2, 4)  # (B, 2R', D) -> (2B, R', D)
    assert torch.equal(call["input_imgs"][0], batch["input_imgs"][0, :2])  # row 2i = image 0 of example i
    assert torch.equal(call["input_imgs"][1], batch["input_imgs"][0, 2:])
    assert torch.equal(call["input_txt"][0], call["input_txt"][1])  # the text repeated per image
    assert torch.equal(call["input_txt"][2], batch["input_txt"][1])
    assert count == 3 and float(score) == 2.0
    rows = [{"sentence": "a", "prediction": 1, "label": 1}, {"sentence": "a", "prediction": 0, "label": 1},
            {"sentence": "b", "prediction": 1, "label": 1}, {"sentence": "c", "prediction": 0, "label": 0},
            {"sentence": "c", "prediction": 1, "label": 1}]
    assert nlvr2.consistency(rows) == pytest.approx(200 / 3)  # groups b and c all right, a not
    assert nlvr2.extra_metrics(rows, "TASK12") == {"consistency": pytest.approx(200 / 3)}
    assert nlvr2.extra_metrics(rows, "TASK5") == {}  # VOLTA only computes it for TASK12
    # 663 of 1987 sentence groups all right: IGLUE's ctrl_xuniter NLVR2 log line, digit for digit
    groups = [{"sentence": f"s{i}", "prediction": 1, "label": int(i < 663)} for i in range(1987)]
    assert f"Consistency: {nlvr2.consistency(groups)}" == "Consistency: 33.36688475088073"


def test_retrieval_cross_entropy_triplet_and_score():
    logits = torch.tensor([[2.0], [0.5], [0.1], [0.0], [0.0], [1.0], [0.2], [0.3]])  # 2 examples x 4 options
    batch = batch_of(2, 3, extra=(4,))
    batch["target"] = torch.zeros(2, dtype=torch.long)
    model = RecordingModel(logits)
    loss, score, count, out = retrieval.forward_and_loss(model, batch, "TASK8")
    assert model.calls[0]["input_imgs"].shape == (8, 3, 4) and out.shape == (2, 4)
    assert count == 2 and float(score) == 1.0
    assert torch.isclose(loss, torch.nn.functional.cross_entropy(logits.view(2, 4), torch.zeros(2).long()))
    loss_t, *_ = retrieval.forward_and_loss(model, batch, "TASK8", "TripletLoss")
    s = torch.sigmoid(logits.view(2, 4))
    expected = torch.clamp(0.2 + s[:, 1:] - s[:, :1], min=0).mean()
    assert torch.isclose(loss_t, expected) and torch.isclose(triplet_loss(logits.view(2, 4)), expected)


def test_onehot_score_uses_first_argmax():
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(onehot_score_sum(logits, torch.tensor([[1.0, 0, 0]]))) == 1.0
