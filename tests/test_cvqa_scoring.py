"""Scoring CVQA with the matching heads: the "match" convention per family, batching, ties, text-only."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_cvqa import make_cvqa_store, tiny_tokenizer, write_release
from helpers_tiny import tiny_batch, tiny_config

from volta_ml.features import RegionView
from volta_ml.models import build_model
from volta_ml.cvqa.zoo import MatchingHeadError, MatchingScorer, blank_image, predict, score_condition
from volta_ml.cvqa.data import load_cvqa
from volta_ml.cvqa.prompts import encode_option_texts, option_texts

ITM_FAMILIES = ["ctrl_lxmert", "ctrl_muniter_base", "ctrl_uniter_base", "ctrl_vilbert_base",
                "ctrl_visualbert_base", "ctrl_vl-bert_base", "ctrl_xuniter_base", "lxmert", "original_lxmert",
                "uc2_base", "vilbert_base"]
RETRIEVAL = {"TASK8": {"type": "VL-logit", "num_labels": 1}}


def _set_head(linear: torch.nn.Linear, bias):
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.copy_(torch.tensor(bias, dtype=linear.bias.dtype))


@pytest.mark.parametrize("family", ITM_FAMILIES)
def test_pretraining_itm_class_zero_means_match(family):
    """VOLTA's convention (models spec 4.6): softmax index 0 of cls.bi_seq_relationship is "matched"."""
    torch.manual_seed(0)
    config = tiny_config(family)
    model = build_model(config, kind="pretraining").eval()
    scorer = MatchingScorer(model)
    assert scorer.kind == "itm" and scorer.convention == "softmax(itm)[:, 0] (index 0 = matched)"
    batch = tiny_batch(config, batch=4)
    with torch.no_grad():
        expected = torch.softmax(model(**batch)["itm_logits"], dim=-1)[:, 0]
        assert torch.allclose(scorer(batch), expected, atol=1e-6)
        _set_head(model.cls.bi_seq_relationship, [4.0, -4.0])     # everything "matched"
        assert (scorer(batch) > 0.99).all()
        _set_head(model.cls.bi_seq_relationship, [-4.0, 4.0])     # everything "not matched"
        assert (scorer(batch) < 0.01).all()


@pytest.mark.parametrize("family", ["m3p_base", "ctrl_xuniter_base", "uc2_base"])
def test_retrieval_head_logit_is_the_match_score(family):
    torch.manual_seed(0)
    config = tiny_config(family)
    model = build_model(config, RETRIEVAL, ["TASK8"], kind="tasks").eval()
    scorer = MatchingScorer(model)          # the one VL-logit head is found without naming it
    assert scorer.task_id == "TASK8" and scorer.convention == "logit (higher = match)"
    batch = tiny_batch(config, batch=3)
    with torch.no_grad():
        logits = model(batch["input_txt"], batch["input_imgs"], batch["image_loc"], "TASK8",
                       batch["token_type_ids"], batch["attention_mask"], batch["image_attention_mask"])
        assert torch.equal(scorer(batch), logits[:, 0].float())
        _set_head(model.clfs_dict["TASK8"], [1.5])
        assert torch.allclose(scorer(batch), torch.full((3,), 1.5))


def test_models_without_a_matching_head_are_refused():
    with pytest.raises(MatchingHeadError, match="fusion_method 'none'"):
        MatchingScorer(build_model(tiny_config("vl-bert_base"), kind="pretraining"))
    tasks = build_model(tiny_config("ctrl_uniter_base"), {"TASK19": {"type": "VL-tri-classifier", "num_labels": 3}},
                        ["TASK19"])
    with pytest.raises(MatchingHeadError, match="one VL-logit head"):
        MatchingScorer(tasks)
    with pytest.raises(MatchingHeadError, match="not a VL-logit"):
        MatchingScorer(tasks, "TASK19")


def test_ties_go_to_the_lowest_index():
    scores = np.array([[0.2, 0.7, 0.7, 0.1], [1.0, 1.0, 1.0, 1.0], [0.0, np.nan, 0.5, 0.5],
                       [np.nan] * 4, [-3.0, -1.0, -2.0, -1.0]])
    assert predict(scores).tolist() == [1, 0, 2, 0, 1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cvqa_scoring")
    dataset = load_cvqa(write_release(tmp, "latest"))
    store = make_cvqa_store(tmp / "feats", dataset, skip={"2002"})   # one photo failed extraction
    torch.manual_seed(0)
    config = tiny_config("ctrl_xuniter_base")
    model = build_model(config, kind="pretraining").eval()
    with torch.no_grad():   # a sharper ITM head than the 0.02-std initialisation, so scores spread out
        model.cls.bi_seq_relationship.weight.normal_(0, 2.0)
    view = RegionView(str(store), num_locs=config.num_locs, add_global_imgfeat="first", max_region_num=8)
    return dataset, model, view, tiny_tokenizer(tmp / "tok")


def _one_by_one(model, question, condition, tokenizer, sample, max_len=24):
    """Reference: each (image, text) pair through the model alone, unpadded text."""
    enc = encode_option_texts(tokenizer, option_texts(question, condition), max_len)
    out = []
    with torch.no_grad():
        for i in range(4):
            ids = torch.from_numpy(enc.ids[i:i + 1, :enc.lengths[i]])
            itm = model(ids, sample[0][None], sample[1][None], torch.zeros_like(ids), torch.ones_like(ids),
                        sample[2][None])["itm_logits"]
            out.append(torch.softmax(itm, -1)[0, 0].item())
    return np.array(out)


@pytest.mark.parametrize("condition", ["en-aware", "loc-agnostic"])
def test_batched_scores_equal_one_pair_at_a_time(setup, condition):
    dataset, model, view, tok = setup
    scored = score_condition(MatchingScorer(model), dataset.questions, condition, tok, view, max_seq_length=24,
                             batch_size=10, progress=False)   # 10 rows -> 8 per step: batches cut questions
    assert scored.scores.shape == (7, 4) and scored.predictions.tolist() == predict(scored.scores).tolist()
    blank = blank_image(view.num_rows, 16, view.num_locs)
    for q, row in zip(dataset.questions, scored.scores):
        sample = blank if q.image_id == "2002" else tuple(view[q.image_id][:3])
        np.testing.assert_allclose(row, _one_by_one(model, q, condition, tok, sample), atol=1e-5)
    if condition.startswith("en"):   # (the tiny vocabulary turns the local scripts into [UNK]: ties there)
        assert len(set(np.round(scored.scores.ravel(), 6))) > 20      # scores depend on image and text


def test_text_only_baseline_uses_the_blank_image(setup):
    dataset, model, view, tok = setup
    scorer = MatchingScorer(model)
    blind = score_condition(scorer, dataset.questions, "en-agnostic", tok, view, max_seq_length=24,
                            text_only=True, progress=False)
    seeing = score_condition(scorer, dataset.questions, "en-agnostic", tok, view, max_seq_length=24,
                             progress=False)
    blank = blank_image(view.num_rows, 16, view.num_locs)
    assert blank[2].tolist() == [1] + [0] * (view.num_rows - 1)
    np.testing.assert_allclose(blind.scores[0], _one_by_one(model, dataset.questions[0], "en-agnostic", tok, blank),
                               atol=1e-5)
    np.testing.assert_allclose(blind.scores[4], seeing.scores[4], atol=1e-6)     # 2002 has no features
    assert not np.allclose(blind.scores[0], seeing.scores[0])
