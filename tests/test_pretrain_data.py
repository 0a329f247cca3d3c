"""Pretraining data (volta_ml/pretrain): VOLTA's Conceptual Captions batches and Wikipedia text-only batches.

Each rule is checked against a plain computation written the obvious way here (VOLTA's loops: token and region
masking, IoU > 0.4 overlaps, spatial features, the global feature, the [CLS]/[SEP] layout, language sampling),
the masking rates against their statistics over many samples (fixed seeds: the counts are always the same),
and the reading paths (VOLTA's td-LMDB layout, its per-rank part files, any project store) against each other.
"""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from helpers_pretrain import CC_FIELDS, load_tiny_tokenizer, make_feature_store, make_pretrain_data
from volta_ml.engine.failures import user_errors
from volta_ml.features import MissingImageError
from volta_ml.features.td_lmdb import pack_value, unpack_value
from volta_ml.pretrain.data import ConceptCapData, collate_concap, epoch_order, zero_copy_unpack
from volta_ml.pretrain.masking import CONCAP_STREAM, box_iou, ignore_mismatched_labels, sample_uniforms
from volta_ml.pretrain.text import PretrainDataError
from volta_ml.pretrain.wiki import LineIndex, WikiData, sampling_probs

SEQ = 16
FIELDS = ("input_ids", "input_mask", "segment_ids", "lm_label_ids", "is_next", "image_feat", "image_loc",
          "image_cls", "obj_labels", "obj_confs", "attr_labels", "attr_confs", "image_attrs", "image_label",
          "image_mask")


@pytest.fixture(scope="session")
def pdata(tmp_path_factory):
    return make_pretrain_data(tmp_path_factory.mktemp("pretrain"), n_images=24, n_val=8, feature_dim=8, n_parts=3,
                              langs=("en", "de", "fr"), wiki_lines=40)


@pytest.fixture(scope="session")
def tok(pdata):
    return load_tiny_tokenizer(pdata.tokenizer)


def cc(pdata, tok, **kw):
    kw.setdefault("seq_len", SEQ)
    return ConceptCapData(pdata.annotations, pdata.features, tok, **kw)


def batch_of(ds, indices=None):
    return dict(zip(FIELDS + ("image_ids",), collate_concap(ds.__getitems__(range(len(ds)) if indices is None
                                                                             else indices))))


def epochs(ds, n):
    """Every sample of `n` epochs: (examples, batches)."""
    out = []
    for epoch in range(n):
        ds.set_epoch(epoch)
        examples = ds.__getitems__(range(len(ds)))
        out.append((examples, dict(zip(FIELDS, collate_concap(examples)))))
    return out


# --- plain computations (VOLTA's loops) --------------------------------------------------------------------------
def plain_iou(a, b):
    """VOLTA's iou() for one pair, in float32 scalars."""
    one = np.float32(1)
    area_a = (a[2] - a[0] + one) * (a[3] - a[1] + one)
    area_b = (b[2] - b[0] + one) * (b[3] - b[1] + one)
    iw = max(min(a[2], b[2]) - max(a[0], b[0]) + one, np.float32(0))
    ih = max(min(a[3], b[3]) - max(a[1], b[1]) + one, np.float32(0))
    return iw * ih / (area_a + area_b - iw * ih)


def plain_locations(boxes, w, h, num_locs, rows=36):
    loc = np.zeros((rows, num_locs), dtype=np.float32)
    loc[:len(boxes), :4] = boxes
    if num_locs >= 5:
        loc[:, -1] = (loc[:, 3] - loc[:, 1]) * (loc[:, 2] - loc[:, 0]) / (float(w) * float(h))
    loc[:, 0] = loc[:, 0] / float(w)
    loc[:, 1] = loc[:, 1] / float(h)
    loc[:, 2] = loc[:, 2] / float(w)
    loc[:, 3] = loc[:, 3] / float(h)
    if num_locs > 5:
        loc[:, 4] = loc[:, 2] - loc[:, 0]
        loc[:, 5] = loc[:, 3] - loc[:, 1]
    return loc


def caption_layout(tok, caption, seq_len):
    """[CLS] caption[:seq_len - 2] [SEP] then zeros, as VOLTA builds it before masking."""
    ids = tok.encode(caption, add_special_tokens=False)[:seq_len - 2]
    ids = [tok.cls_token_id] + ids + [tok.sep_token_id]
    return ids + [0] * (seq_len - len(ids)), len(ids)


# --- batch layout ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", [None, "first", "last"])
def test_batch_shapes_and_dtypes_are_volta_s(pdata, tok, where):
    b = batch_of(cc(pdata, tok, add_global_imgfeat=where), range(5))
    g = int(where is not None)
    expected = {"input_ids": ((5, SEQ), torch.int64), "input_mask": ((5, SEQ), torch.int64),
                "segment_ids": ((5, SEQ), torch.int64), "lm_label_ids": ((5, SEQ), torch.int64),
                "is_next": ((5,), torch.int64), "image_feat": ((5, 36 + g, 8), torch.float32),
                "image_loc": ((5, 36 + g, 5), torch.float32), "image_cls": ((5, 36, 1601), torch.float32),
                "obj_labels": ((5, 36), torch.int64), "obj_confs": ((5, 36), torch.float32),
                "attr_labels": ((5, 36), torch.int64), "attr_confs": ((5, 36), torch.float32),
                "image_attrs": ((5, 36, 401), torch.float32), "image_label": ((5, 36), torch.int64),
                "image_mask": ((5, 36 + g), torch.int64)}
    assert {k: (tuple(b[k].shape), b[k].dtype) for k in expected} == expected
    assert b["image_ids"] == pdata.train_ids[:5]
    if where:
        row = 0 if where == "first" else 36
        assert b["image_loc"][:, row].tolist() == [[0, 0, 1, 1, 1]] * 5
        assert (b["image_mask"] == 1).all()
    for k, image_id in enumerate(b["image_ids"]):   # the record's own fields, padded rows: none (36 boxes)
        rec = pdata.records[image_id]
        assert np.array_equal(b["image_cls"][k].numpy(), rec["cls_prob"])
        assert np.array_equal(b["image_attrs"][k].numpy(), rec["attr_scores"])
        assert np.array_equal(b["obj_labels"][k].numpy(), rec["objects_id"])
        assert np.array_equal(b["attr_confs"][k].numpy(), rec["attrs_conf"])


def test_caption_tokens_follow_volta_s_layout_and_masking(pdata, tok):
    ds = cc(pdata, tok, objective=2, seq_len=10)      # objective 2: the record's own caption, always
    mask_id = tok.convert_tokens_to_ids("[MASK]")
    for examples, b in epochs(ds, 3):
        for k, image_id in enumerate(pdata.train_ids):
            expected, length = caption_layout(tok, pdata.records[image_id]["caption"], 10)
            ids, labels = b["input_ids"][k].tolist(), b["lm_label_ids"][k].tolist()
            assert b["input_mask"][k].tolist() == [1] * length + [0] * (10 - length)
            assert b["segment_ids"][k].tolist() == [0] * 10
            assert labels[0] == -1 and labels[length - 1:] == [-1] * (10 - length + 1)   # [CLS], [SEP], padding
            for i in range(10):
                if labels[i] == -1:
                    assert ids[i] == expected[i]
                else:
                    assert labels[i] == expected[i]
                    assert ids[i] in (mask_id, expected[i]) or 0 <= ids[i] < len(tok)


def test_token_masking_rates_are_15_percent_then_80_10_10(pdata, tok):
    ds = cc(pdata, tok, objective=2, seed=3)
    mask_id = tok.convert_tokens_to_ids("[MASK]")
    content = picked = masked = randomised = kept = 0
    for _, b in epochs(ds, 40):
        real = (b["input_mask"] == 1)
        real[:, 0] = False
        real[torch.arange(len(real)), b["input_mask"].sum(1) - 1] = False   # [SEP]
        labels, ids = b["lm_label_ids"], b["input_ids"]
        sel = labels != -1
        content += int(real.sum())
        picked += int(sel.sum())
        masked += int((ids[sel] == mask_id).sum())
        kept += int((ids[sel] == labels[sel]).sum())
        randomised += int(((ids[sel] != mask_id) & (ids[sel] != labels[sel])).sum())
    assert content > 8000
    assert abs(picked / content - 0.15) < 0.015
    # a random id equal to the token itself (1 in 87 here) counts as kept: 10% + 10% / 87
    assert abs(masked / picked - 0.80) < 0.04
    assert abs(randomised / picked - 0.10 * (1 - 1 / len(tok))) < 0.03
    assert abs(kept / picked - 0.10 * (1 + 1 / len(tok))) < 0.03


def test_region_masking_against_volta_s_loops(pdata, tok):
    """image_label, the zeroed rows and masked_label (IoU > 0.4 with a picked region) from a plain loop."""
    ds = cc(pdata, tok, add_global_imgfeat="first")
    seen_overlap = 0
    for examples, b in epochs(ds, 4):
        for k, ex in enumerate(examples):
            rec = pdata.records[ex.image_id]
            picked = [i for i in range(36) if ex.image_label[i] == 1]
            assert set(np.flatnonzero(ex.image_label == -1)) == set(range(36)) - set(picked)
            masked = [any(plain_iou(rec["boxes"][i], rec["boxes"][j]) > 0.4 for i in picked) for j in range(36)]
            assert ex.masked_label.tolist() == masked
            seen_overlap += sum(masked) - len(picked)
            feat = b["image_feat"][k, 1:].numpy()
            for i in range(36):
                zero = bool(ex.zeroed[i])
                assert not zero or i in picked
                assert np.array_equal(feat[i], np.zeros(8) if zero else rec["features"][i])
            # the global row: sum of the 36 region rows / number of regions outside masked_label (VOLTA)
            count = max(1, 36 - sum(masked))
            expected = (feat.astype(np.float64).sum(0) / count).astype(np.float32)
            np.testing.assert_allclose(b["image_feat"][k, 0].numpy(), expected, rtol=1e-6)
    assert seen_overlap > 0    # the jittered boxes of helpers_pretrain do overlap


def test_records_with_fewer_regions_are_padded(tmp_path, tok):
    """Fewer than 36 regions (VOLTA's own loader needs exactly 36): padded rows carry nothing, the global row
    divides by the real regions outside masked_label, at least 1 (both boxes picked happens here)."""
    small = make_pretrain_data(tmp_path, n_images=40, n_val=2, n_regions=2, feature_dim=4, n_parts=0, langs=())
    ds = ConceptCapData(small.annotations, small.features, tok, SEQ, add_global_imgfeat="last")
    all_masked = 0
    for examples, b in epochs(ds, 10):
        assert b["image_mask"][:, :2].eq(1).all() and b["image_mask"][:, 2:36].eq(0).all()
        assert b["image_mask"][:, 36].eq(1).all() and b["image_label"][:, 2:].eq(-1).all()
        assert not b["image_feat"][:, 2:36].any() and not b["image_cls"][:, 2:].any()
        assert not b["obj_labels"][:, 2:].any() and not b["image_loc"][:, 2:36].any()
        for k, ex in enumerate(examples):
            count = max(1, int((~ex.masked_label[:2]).sum()))
            all_masked += count == 1 and bool(ex.masked_label[:2].all())
            expected = (b["image_feat"][k, :2].double().sum(0) / count).float()
            assert torch.allclose(b["image_feat"][k, 36], expected, rtol=1e-6)
    assert all_masked > 0


def test_region_masking_rates_are_15_percent_then_90_percent_zeroed(pdata, tok):
    ds = cc(pdata, tok, seed=5)
    regions = picked = zeroed = 0
    for examples, _ in epochs(ds, 40):
        for ex in examples:
            regions += 36
            picked += int((ex.image_label == 1).sum())
            zeroed += int(ex.zeroed.sum())
    assert abs(picked / regions - 0.15) < 0.01
    assert abs(zeroed / picked - 0.90) < 0.02


@pytest.mark.parametrize("num_locs", [4, 5, 6, 7])
def test_spatial_features_are_volta_s(pdata, tok, num_locs):
    b = batch_of(cc(pdata, tok, num_locs=num_locs), range(6))
    for k, image_id in enumerate(b["image_ids"]):
        rec = pdata.records[image_id]
        assert np.array_equal(b["image_loc"][k].numpy(), plain_locations(rec["boxes"], 640, 480, num_locs))


def test_box_iou_is_volta_s_formula():
    rng = np.random.default_rng(1)
    boxes = np.sort(rng.uniform(0, 100, (12, 2, 2)), axis=1).transpose(0, 2, 1).reshape(12, 4).astype(np.float32)
    boxes = boxes[:, [0, 2, 1, 3]]
    got = box_iou(boxes[:, None], boxes[None])
    assert got.dtype == np.float32
    assert got.tolist() == [[plain_iou(a, b) for b in boxes] for a in boxes]


# --- negatives and objectives -----------------------------------------------------------------------------------------
def test_negative_captions_half_the_time_from_the_captions_file(pdata, tok):
    ds = cc(pdata, tok, objective=0, seed=11, seq_len=40)
    captions = list(json.loads((pdata.annotations / "caption_train.json").read_text()).values())
    pool = {tuple(caption_layout(tok, c, 40)[0]) for c in captions}
    for examples, b in epochs(ds, 10):
        unmasked = torch.where(b["lm_label_ids"] == -1, b["input_ids"], b["lm_label_ids"])
        for k, ex in enumerate(examples):
            if ex.is_next:
                assert tuple(unmasked[k].tolist()) in pool
            else:
                assert unmasked[k].tolist() == caption_layout(tok, pdata.records[ex.image_id]["caption"], 40)[0]
        assert b["is_next"].tolist() == [ex.is_next for ex in examples]
    drawn = []
    for epoch in range(200):
        ds.set_epoch(epoch)
        drawn += [ex.is_next for ex in ds.__getitems__(range(len(ds)))]
    assert abs(np.mean(drawn) - 0.5) < 0.025       # 4800 draws: sd 0.007


def test_a_rank_draws_negatives_from_the_first_captions_of_the_file_as_volta(pdata, tok):
    """VOLTA draws randint(0, num_dataset - 1) into the captions file's values: with a part file of 8
    records, only the file's first 8 captions are ever negatives."""
    ds = cc(pdata, tok, objective=0, rank=2, seq_len=40)
    captions = list(json.loads((pdata.annotations / "caption_train.json").read_text()).values())
    first = {tuple(caption_layout(tok, c, 40)[0]) for c in captions[:len(ds)]}
    seen = set()
    for examples, b in epochs(ds, 30):
        unmasked = torch.where(b["lm_label_ids"] == -1, b["input_ids"], b["lm_label_ids"])
        seen |= {tuple(unmasked[k].tolist()) for k, ex in enumerate(examples) if ex.is_next}
    assert seen <= first and len(seen) == len(first)


def replay(ex, u, caption, tok, C):
    """A sample decided by hand from its uniforms with VOLTA's thresholds."""
    V, mask_id = len(tok), tok.convert_tokens_to_ids("[MASK]")
    assert ex.is_next == int(u[0] > 0.5)
    for t, token in enumerate(tok.encode(caption, add_special_tokens=False)[:C]):
        p = u[2 + t]
        if p < 0.15:
            expected = mask_id if p / 0.15 < 0.8 else int(u[2 + C + t] * V) if p / 0.15 < 0.9 else token
            assert (ex.input_ids[1 + t], ex.lm_label_ids[1 + t]) == (expected, token)
        else:
            assert (ex.input_ids[1 + t], ex.lm_label_ids[1 + t]) == (token, -1)
    for r in range(36):
        p = u[2 + 2 * C + r]
        assert ex.image_label[r] == (1 if p < 0.15 else -1)
        assert ex.zeroed[r] == (p < 0.15 and p / 0.15 < 0.9)


def test_each_draw_decides_as_volta_s_thresholds(pdata, tok):
    """The documented draw layout of a sample ([negative coin, negative caption, C token picks, C random ids,
    R region picks] from its own stream), replayed by hand: VOLTA's thresholds decide every outcome."""
    ds = cc(pdata, tok, objective=0, seed=4, rank=1, seq_len=12)
    captions = list(json.loads((pdata.annotations / "caption_train.json").read_text()).values())
    for epoch in range(5, 35):
        ds.set_epoch(epoch)
        for i, ex in enumerate(ds.__getitems__(range(len(ds)))):
            u = sample_uniforms(4, CONCAP_STREAM, i, 2 + 2 * 10 + 36, epoch=epoch, rank=1)
            own = pdata.records[ex.image_id]["caption"]
            replay(ex, u, captions[int(u[1] * len(ds))] if u[0] > 0.5 else own, tok, 10)


def test_objective_2_has_no_negatives_and_objective_1_the_same_data_as_0(pdata, tok):
    two = cc(pdata, tok, objective=2)
    assert sum(b["is_next"].sum().item() for _, b in epochs(two, 10)) == 0
    zero, one = batch_of(cc(pdata, tok, objective=0)), batch_of(cc(pdata, tok, objective=1))
    assert all(torch.equal(zero[k], one[k]) for k in FIELDS)


def test_objective_1_drops_the_targets_of_mismatched_pairs():
    lm = torch.tensor([[-1, 5, -1, 0], [7, -1, 3, -1]])
    image = torch.tensor([[1, -1, 1], [-1, 1, -1]])
    is_next = torch.tensor([0, 1])
    lm_out, image_out = ignore_mismatched_labels(lm, image, is_next)
    plain_lm = [[-1 if (n or v == 0) else v for v in row] for row, n in zip(lm.tolist(), is_next.tolist())]
    plain_image = [[-1 if n else v for v in row] for row, n in zip(image.tolist(), is_next.tolist())]
    assert lm_out.tolist() == plain_lm and image_out.tolist() == plain_image
    assert lm.tolist()[0] == [-1, 5, -1, 0]     # inputs untouched


# --- determinism, ranks, splits, stores ------------------------------------------------------------------------------
def test_samples_depend_only_on_seed_epoch_rank_and_index(pdata, tok):
    ds = cc(pdata, tok, seed=7)
    ds.set_epoch(2)
    whole = batch_of(ds)
    picked = batch_of(ds, [5, 1, 9])                        # any batch composition, any order
    single = dict(zip(FIELDS, collate_concap([ds[9], ds[5]])))
    for k in FIELDS:
        assert torch.equal(picked[k][0], whole[k][5]) and torch.equal(single[k][0], whole[k][9])
    again = pickle.loads(pickle.dumps(ds))                  # a spawned DataLoader worker's copy
    assert all(torch.equal(batch_of(again)[k], whole[k]) for k in FIELDS)
    ds.set_epoch(3)
    other_epoch = batch_of(ds)
    other_seed = cc(pdata, tok, seed=8)
    other_seed.set_epoch(2)
    for other in (other_epoch, batch_of(other_seed)):
        assert not torch.equal(other["lm_label_ids"], whole["lm_label_ids"])
        assert not torch.equal(other["image_label"], whole["image_label"])
    loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collate_concap)   # uses __getitems__
    first = dict(zip(FIELDS, next(iter(loader))))
    assert torch.equal(first["input_ids"], other_epoch["input_ids"][:8])


def test_dataloader_workers_give_the_same_batches(pdata, tok):
    ds = cc(pdata, tok, seed=2, add_global_imgfeat="first")
    ds.set_epoch(1)
    here = [dict(zip(FIELDS, b)) for b in torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collate_concap)]
    there = [dict(zip(FIELDS, b)) for b in torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collate_concap,
                                                                       num_workers=2)]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(here, there) for k in FIELDS) and len(there) == 3


def test_text_encoder_matches_the_tokenizer(tmp_path):
    """The Rust fast path gives `tokenizer.encode`'s ids; special tokens around a sequence for BERT and XLM-R."""
    from helpers_tasks import bert_uncased_dir, xlmr_dir
    from transformers import AutoTokenizer
    from volta_ml.pretrain.text import TextEncoder
    texts = ["A man riding a bike near the river.", "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u6771\u4eac",
             "  spaces   and\ttabs ", "x" * 300]
    bert = AutoTokenizer.from_pretrained(str(bert_uncased_dir(tmp_path)), do_lower_case=True)
    xlmr = AutoTokenizer.from_pretrained(str(xlmr_dir(tmp_path, texts * 20, vocab_size=60)))
    for tokenizer, prefix, suffix in ((bert, [101], [102]), (xlmr, [0], [2])):
        text = TextEncoder(tokenizer)
        assert (text.prefix, text.suffix, text.mask_id) == (prefix, suffix, tokenizer.mask_token_id)
        for t in texts:
            assert text.encode(t) == tokenizer.encode(t, add_special_tokens=False)
            assert text.encode(t, special=True) == tokenizer.encode(t)
        assert text.encode_many(texts) == [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def test_each_rank_reads_its_part_file_and_draws_its_own_masks(pdata, tok, tmp_path):
    for rank, ids in enumerate(pdata.parts):
        ds = cc(pdata, tok, rank=rank)
        assert ds.sharded and ds.features_path.endswith(f"training_feat_part_{rank}.lmdb")
        assert batch_of(ds)["image_ids"] == ids
    assert not cc(pdata, tok).sharded and len(cc(pdata, tok)) == 24
    store = make_feature_store(tmp_path / "all.store", pdata)
    r0, r1 = (batch_of(ConceptCapData(pdata.annotations, store, tok, SEQ, rank=r)) for r in (0, 1))
    assert r0["image_ids"] == r1["image_ids"]
    assert not torch.equal(r0["image_label"], r1["image_label"])
    with pytest.raises(PretrainDataError, match=r"no training_feat_part_5\.lmdb \(rank 5's part"):
        cc(pdata, tok, rank=5)


def test_validation_split_puts_the_global_feature_first_as_volta_s_val_loader(pdata, tok):
    for where, g in (("last", 1), ("first", 1), (None, 0)):
        ds = cc(pdata, tok, split="val", add_global_imgfeat=where)
        b = batch_of(ds)
        assert b["image_ids"] == pdata.val_ids and b["image_feat"].shape[1] == 36 + g
        if g:
            assert b["image_loc"][:, 0].tolist() == [[0, 0, 1, 1, 1]] * len(pdata.val_ids)
    assert epoch_order(10, 0, 1).tolist() == epoch_order(10, 0, 1).tolist() != epoch_order(10, 0, 2).tolist()
    blocks = epoch_order(10, 0, 1, block=4)
    assert sorted(blocks.tolist()) == list(range(10))
    assert np.count_nonzero(np.diff(blocks // 4)) == 2      # three blocks, each visited in one stretch


@pytest.mark.parametrize("fmt", ["native", "h5", "volta-lmdb"])
def test_a_project_store_gives_the_same_batches_as_volta_s_layout(pdata, tok, tmp_path, fmt):
    store = make_feature_store(tmp_path / f"cc.{fmt}", pdata, fmt=fmt)
    ours = batch_of(ConceptCapData(pdata.annotations, store, tok, SEQ, add_global_imgfeat="first"))
    volta = batch_of(cc(pdata, tok, add_global_imgfeat="first"))
    assert ours["image_ids"] == volta["image_ids"]
    assert all(torch.equal(ours[k], volta[k]) for k in FIELDS)


def test_pickled_and_msgpack_td_lmdbs_read_the_same(pdata, tok, tmp_path):
    from volta_ml.features.td_lmdb import TdLmdbWriter
    folder = tmp_path / "feats"
    folder.mkdir()
    writer = TdLmdbWriter(str(folder / "training_feat_all.lmdb"), serializer="pickle")
    for image_id in pdata.train_ids:
        writer.put_record([pdata.records[image_id][name] for name in CC_FIELDS])
    writer.close()
    ours = batch_of(ConceptCapData(pdata.annotations, folder, tok, SEQ))
    assert all(torch.equal(ours[k], batch_of(cc(pdata, tok))[k]) for k in FIELDS)


def test_zero_copy_unpack_matches_the_general_decoder():
    rng = np.random.default_rng(0)
    cases = [
        [rng.random((36, 8), dtype=np.float32), np.arange(36), "36", "a caption", np.float32(2.5)],
        [np.zeros((196, 4), np.float32), "\u00c4 data", {"x": np.ones(3, np.float16)}, [np.int64(4), None]],
        [b"\xc4\x04data\xc6\x00\x00\x00\x08", np.ones(2)],    # a bin that merely contains the key: decoded the
    ]                                                        # general way (None), never misread
    for record in cases:
        value = memoryview(pack_value(record))
        fast = zero_copy_unpack(value)
        slow = unpack_value(value, "s", "k")
        if fast is None:
            assert record is cases[2]
            continue
        assert repr(fast) == repr(slow)
        assert not fast[0].flags.owndata and not fast[0].flags.writeable     # a view of the value


def test_encoded_captions_are_kept_in_the_token_cache(pdata, tok, tmp_path, monkeypatch):
    from volta_ml.data.cache import TokenCache
    from volta_ml.pretrain.text import TextEncoder
    cache = TokenCache(tmp_path / "tokens")
    first = batch_of(cc(pdata, tok, token_cache=cache))
    assert len(list((tmp_path / "tokens").glob("captions-*.npz"))) == 1

    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded again")
    monkeypatch.setattr(TextEncoder, "encode_many", no_encoding)
    again = batch_of(cc(pdata, tok, token_cache=cache))       # the cached ids, not the tokenizer
    assert all(torch.equal(first[k], again[k]) for k in FIELDS)
    monkeypatch.undo()
    ann = tmp_path / "ann"
    ann.mkdir()
    captions = json.loads((pdata.annotations / "caption_train.json").read_text())
    (ann / "caption_train.json").write_text(json.dumps({k: v + " dog" for k, v in captions.items()}))
    ConceptCapData(ann, pdata.features, tok, SEQ, token_cache=cache)   # another file: another entry
    assert len(list((tmp_path / "tokens").glob("captions-*.npz"))) == 2


# --- bad input: one line, a usage error (exit code 2) ------------------------------------------------------------------
def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, user_errors())
    return message


def test_a_store_lacking_what_a_visual_target_needs_is_named(pdata, tok, tmp_path):
    bare = make_feature_store(tmp_path / "bare.store", pdata, fields=())
    with pytest.raises(PretrainDataError) as err:
        ConceptCapData(pdata.annotations, bare, tok, SEQ)                       # VOLTA's default target "0"
    assert "bare.store" in one_line(err) and "cls_prob" in str(err.value) and "KL-1601" in str(err.value)
    with pytest.raises(PretrainDataError) as err:
        ConceptCapData(pdata.annotations, bare, tok, SEQ, visual_target_weights={"3": 6.667, "0": 0})
    assert "objects_id/obj_id/objects" in one_line(err) and "visual target 3" in str(err.value)
    b = batch_of(ConceptCapData(pdata.annotations, bare, tok, SEQ, visual_target_weights={"1": 1.0, "0": 0.0}))
    assert not b["image_cls"].any() and not b["obj_labels"].any() and not b["image_attrs"].any()
    narrow = make_feature_store(tmp_path / "narrow.store", pdata, fields=("cls_prob",),
                                ids=pdata.train_ids[:1])
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "caption_train.json").write_text(json.dumps({pdata.train_ids[0]: "a dog"}))
    ConceptCapData(tmp_path / "ann", narrow, tok, SEQ)


def test_captions_and_images_that_do_not_match_are_named(pdata, tok, tmp_path):
    store = make_feature_store(tmp_path / "some.store", pdata, ids=pdata.train_ids[:3])
    with pytest.raises(MissingImageError) as err:      # the captions file names images the store lacks
        ConceptCapData(pdata.annotations, store, tok, SEQ)
    assert "21 image(s) of" in one_line(err) and "caption_train.json" in str(err.value)
    # VOLTA's layout with records that carry no caption (12 fields): the captions file must have them
    folder = tmp_path / "nocap"
    folder.mkdir()
    records = [dict(pdata.records[i]) for i in pdata.train_ids[:4]]
    from volta_ml.features.td_lmdb import TdLmdbWriter
    writer = TdLmdbWriter(str(folder / "training_feat_all.lmdb"))
    for r in records:
        writer.put_record([r[name] for name in CC_FIELDS[:-1]])
    writer.close()
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "caption_train.json").write_text(json.dumps({r["image_id"]: r["caption"] for r in records}))
    ds = ConceptCapData(tmp_path / "ann", folder, tok, SEQ, objective=2)
    expected = caption_layout(tok, records[2]["caption"], SEQ)[0]
    b = batch_of(ds)
    assert torch.where(b["lm_label_ids"] == -1, b["input_ids"], b["lm_label_ids"])[2].tolist() == expected
    (tmp_path / "ann" / "caption_train.json").write_text(json.dumps({records[0]["image_id"]: "x"}))
    with pytest.raises(PretrainDataError) as err:
        ConceptCapData(tmp_path / "ann", folder, tok, SEQ, objective=2)[1]
    assert f"no caption for image id '{records[1]['image_id']}'" in one_line(err)


def test_bad_settings_are_one_line_usage_errors(pdata, tok, tmp_path):
    cases = [({"objective": 3}, "--objective 3: VOLTA's objectives are 0"),
             ({"visual_target_weights": {"9": 1}}, "unknown visual target '9'"),
             ({"add_global_imgfeat": "middle"}, "add_global_imgfeat 'middle'"),
             ({"seq_len": 2}, "seq_len 2 leaves no room")]
    for kw, match in cases:
        with pytest.raises(PretrainDataError, match=match) as err:
            cc(pdata, tok, **kw)
        one_line(err)
    with pytest.raises(PretrainDataError, match="captions file not found") as err:
        ConceptCapData(tmp_path, pdata.features, tok, SEQ)
    one_line(err)


# --- Wikipedia -------------------------------------------------------------------------------------------------------
def wiki(pdata, tok, **kw):
    kw.setdefault("batch_size", 16)
    kw.setdefault("max_seq_length", 20)
    return WikiData(pdata.wiki, kw.pop("langs", "en-de-fr"), kw.pop("factor", -1), tok, **kw)


def nonempty_lines(pdata, lang):
    return [l for l in (pdata.wiki / f"{lang}.20180201.txt").read_text(encoding="utf-8").split("\n") if l]


def test_wiki_rows_are_volta_s(pdata, tok):
    """[CLS] + (encode(line) + encode(next line) + ..., with special tokens)[:L - 2] + [SEP], masked as VOLTA."""
    w = wiki(pdata, tok, add_global_imgfeat="first")
    b = w.sample(3)
    assert [tuple(t.shape) for t in b] == [(16, 20)] * 4 + [(16, 38, 2048), (16, 38, 5), (16, 38)]
    assert [t.dtype for t in b] == [torch.int64] * 4 + [torch.float32, torch.float32, torch.int64]
    assert (b[1] == 1).all() and (b[2] == 0).all() and not b[4].any() and not b[5].any() and not b[6].any()
    langs, lines = w.rows(3)
    for k in range(16):
        corpus = nonempty_lines(pdata, langs[k])
        tokens, i = [], int(lines[k])
        while len(tokens) < 18:
            tokens += tok.encode(corpus[i % len(corpus)])
            i += 1
        expected = [tok.cls_token_id] + tokens[:18] + [tok.sep_token_id]
        labels, ids = b[3][k].tolist(), b[0][k].tolist()
        assert labels[0] == labels[-1] == -1 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        assert [ids[j] if labels[j] == -1 else labels[j] for j in range(20)] == expected
    assert wiki(pdata, tok).sample(0)[4].shape[1] == 36
    assert torch.equal(w.sample(3)[0], b[0]) and not torch.equal(w.sample(4)[0], b[0])
    assert not torch.equal(wiki(pdata, tok, rank=1, add_global_imgfeat="first").sample(3)[0], b[0])


def test_wiki_language_sampling_is_volta_s(pdata, tok, tmp_path):
    sizes = [10, 100, 1000]
    for factor in (0.3, 0.7, 1.0):
        p = np.array(sizes) / sum(sizes)
        p = p ** factor
        assert np.allclose(sampling_probs(sizes, factor), p / p.sum())
    assert sampling_probs(sizes, -1) is None
    folder = tmp_path / "wiki"
    folder.mkdir()
    for lang, n in (("en", 300), ("de", 30), ("fr", 3)):
        (folder / f"{lang}.20180201.txt").write_text("\n".join(["a man near the river"] * n) + "\n")
    w = WikiData(folder, "en-de-fr", 0.5, tok, batch_size=500, max_seq_length=8)
    expected = sampling_probs([300, 30, 3], 0.5)
    assert np.allclose([w.lg2prob[lang] for lang in ("en", "de", "fr")], expected)
    drawn = [lang for step in range(6) for lang in w.rows(step)[0]]
    for lang, p in zip(("en", "de", "fr"), expected):
        assert abs(drawn.count(lang) / len(drawn) - p) < 0.03
    uniform = [lang for step in range(6) for lang in
               WikiData(folder, ["en", "de", "fr"], -1, tok, batch_size=500, max_seq_length=8).rows(step)[0]]
    assert all(abs(uniform.count(lang) / len(uniform) - 1 / 3) < 0.03 for lang in ("en", "de", "fr"))
    assert WikiData(folder, ["ALL"], -1, tok, batch_size=2, max_seq_length=8).lgs == ["de", "en", "fr"]


def test_wiki_line_index(tmp_path):
    path = tmp_path / "xx.20180201.txt"
    path.write_bytes("first\r\n\r\n\nsecond line \u00e9\n\n  \nlast".encode())
    index = LineIndex(path, chunk=5)
    assert [index.line(i) for i in range(len(index))] == ["first", "second line \u00e9", "  ", "last"]
    assert len(pickle.loads(pickle.dumps(index))) == 4
    path.write_bytes(b"")
    assert len(LineIndex(path)) == 0


def test_wiki_bad_inputs(pdata, tok, tmp_path):
    with pytest.raises(PretrainDataError, match=r"xx\.20180201\.txt: no Wikipedia text for language 'xx'") as err:
        wiki(pdata, tok, langs="en-xx")
    one_line(err)
    with pytest.raises(PretrainDataError, match="--lg_sampling_factor 0") as err:
        wiki(pdata, tok, factor=0)
    one_line(err)
    (tmp_path / "en.20180201.txt").write_text("\n\n")
    with pytest.raises(PretrainDataError, match="no non-empty line"):
        WikiData(tmp_path, "en", -1, tok)
