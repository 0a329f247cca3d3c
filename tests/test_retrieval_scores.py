"""The batched, chunked score matrix equals VOLTA's one-caption-per-forward matrix; runs resume."""
import numpy as np
import pytest
import torch

from helpers_retrieval import tiny_captions, tiny_gallery, tiny_model
from helpers_tiny import tiny_config
from volta_ml.engine.retrieval import compute_score_matrix
from volta_ml.engine.retrieval_scorer import volta_scheme_scores

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ["ctrl_uniter_base", "ctrl_vilbert_base", "ctrl_lxmert_base", "ctrl_xuniter_base", "ctrl_visualbert_base",
            "ctrl_vl-bert_base", "uc2_base", "m3p_base"]


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_matrix_equals_one_caption_per_forward(family):
    config = tiny_config(family)
    model = tiny_model(config)
    captions, gallery = tiny_captions(config, 7), tiny_gallery(config, 5)
    reference = volta_scheme_scores(model, captions, gallery, "TASK8", num_subiters=2).numpy()
    ours = compute_score_matrix(model, captions, gallery, task_id="TASK8", captions_per_chunk=3, pair_batch=8,
                                progress=False)
    assert ours.shape == (7, 5) and ours.dtype == np.float32
    spread = np.ptp(reference)
    assert spread > 0
    # tiny random models give logits ~1e-4 apart: compare relative to the spread of the scores
    assert np.abs(ours - reference).max() <= 1e-4 * spread


@pytest.mark.parametrize("family", ["ctrl_uniter_base", "ctrl_vilbert_base"])
def test_zero_shot_uses_the_matching_head_class_0(family):
    config = tiny_config(family)
    model = tiny_model(config, kind="pretraining")
    captions, gallery = tiny_captions(config, 4), tiny_gallery(config, 3)
    ours = compute_score_matrix(model, captions, gallery, zero_shot=True, pair_batch=5, progress=False)
    with torch.no_grad():
        c, i = 2, 1
        out = model(captions["input_txt"][c:c + 1], gallery["input_imgs"][i:i + 1], gallery["image_loc"][i:i + 1],
                    captions["token_type_ids"][c:c + 1], captions["attention_mask"][c:c + 1],
                    gallery["image_attention_mask"][i:i + 1])
    expected = torch.softmax(out["itm_logits"], -1)[0, 0].item()
    assert ours[c, i] == pytest.approx(expected, rel=1e-4)
    assert ((ours > 0) & (ours < 1)).all()


def test_interrupted_run_resumes_to_the_same_matrix(tmp_path):
    config = tiny_config("ctrl_vilbert_base")
    model = tiny_model(config)
    captions, gallery = tiny_captions(config, 10), tiny_gallery(config, 4)
    kwargs = dict(task_id="TASK8", captions_per_chunk=3, pair_batch=5, progress=False,
                  fingerprint={"run": "a"}, work_dir=str(tmp_path / "scores"))
    full = compute_score_matrix(model, captions, gallery, task_id="TASK8", captions_per_chunk=3, pair_batch=5,
                                progress=False)

    class Preempted(Exception):
        pass

    def stop_after_two(chunk):
        if chunk == 1:
            raise Preempted

    with pytest.raises(Preempted):
        compute_score_matrix(model, captions, gallery, after_chunk=stop_after_two, **kwargs)
    assert sorted(p.name for p in (tmp_path / "scores").glob("chunk_*")) == ["chunk_000000.npz", "chunk_000001.npz"]
    computed = []
    resumed = compute_score_matrix(model, captions, gallery, after_chunk=computed.append, **kwargs)
    assert computed == [2, 3]          # the two saved chunks were skipped
    np.testing.assert_array_equal(resumed, full)
    # a different fingerprint (e.g. another checkpoint) never reuses the saved chunks
    computed.clear()
    kwargs["fingerprint"] = {"run": "b"}
    compute_score_matrix(model, captions, gallery, after_chunk=computed.append, **kwargs)
    assert computed == [0, 1, 2, 3]


def test_float16_storage_and_shortlist_mode():
    config = tiny_config("ctrl_uniter_base")
    model = tiny_model(config)
    captions, gallery = tiny_captions(config, 6), tiny_gallery(config, 8)
    full = compute_score_matrix(model, captions, gallery, task_id="TASK8", progress=False)
    half = compute_score_matrix(model, captions, gallery, task_id="TASK8", score_dtype="float16", progress=False)
    np.testing.assert_allclose(half, full, rtol=2e-3, atol=2e-3)
    fast = compute_score_matrix(model, captions, gallery, task_id="TASK8", shortlist=3, shortlist_regions=2,
                                captions_per_chunk=4, progress=False)
    for row_fast, row_full in zip(fast, full):
        top3 = np.argsort(-row_fast, kind="stable")[:3]
        np.testing.assert_allclose(row_fast[top3], row_full[top3], rtol=1e-5, atol=1e-6)  # re-scored in full
        rest = np.setdiff1d(np.arange(8), top3)
        assert row_fast[rest].max() < fast[np.arange(6)[:, None], np.argsort(-fast, 1)[:, :3]].min()


@pytest.mark.parametrize("family", ["ctrl_uniter_base", "ctrl_lxmert_base"])
def test_bf16_autocast_tracks_fp32(family):
    config = tiny_config(family)
    model = tiny_model(config)
    with torch.no_grad():   # a larger head gain so bf16 rounding is small against the score spread
        model.clfs_dict["TASK8"].weight.mul_(1000)
    captions, gallery = tiny_captions(config, 5), tiny_gallery(config, 6)
    fp32 = compute_score_matrix(model, captions, gallery, task_id="TASK8", progress=False)
    bf16 = compute_score_matrix(model, captions, gallery, task_id="TASK8", precision="bf16", progress=False)
    assert bf16.dtype == np.float32
    assert np.abs(bf16 - fp32).max() <= 0.05 * np.ptp(fp32)
