"""RegionView builds VOLTA's per-sample region inputs (models.md §3.6, pipeline.md padding)
and works under DataLoader workers (fork and spawn)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from volta_ml.features import RegionView, box_locations, open_store, open_writer
from volta_ml.features.convert import convert_store
from volta_ml.testing import legacy_layouts as L

W, H = 100, 50
BOXES = np.array([[10, 5, 60, 45], [0, 0, 100, 50]], np.float32)
FEATS = np.array([[3, 4, 0, 0], [1, 1, 1, 1]], np.float32)


@pytest.fixture()
def store(tmp_path):
    path = tmp_path / "s"
    rng = np.random.default_rng(0)
    with open_writer(path, "native") as w:
        w.put("two", FEATS, BOXES, W, H)
        w.put("five", rng.random((5, 4), dtype=np.float32),
              np.tile(BOXES[:1], (5, 1)) + np.arange(5, dtype=np.float32)[:, None], W, H)
    return open_store(path)


@pytest.mark.parametrize("num_locs,expected", [
    (4, [0.1, 0.1, 0.6, 0.9]),
    (5, [0.1, 0.1, 0.6, 0.9, 0.4]),  # area fraction (40 * 50) / (100 * 50) last
    (7, [0.1, 0.1, 0.6, 0.9, 0.5, 0.8, 0.4]),  # UC2: x1 y1 x2 y2 w h area
])
def test_box_locations(num_locs, expected):
    loc = box_locations(BOXES[:1], W, H, num_locs)
    assert loc.dtype == np.float32 and loc.shape == (1, num_locs)
    np.testing.assert_allclose(loc[0], expected, rtol=1e-6)


def test_no_global_padding_and_mask(store):
    s = RegionView(store, num_locs=5, max_region_num=4)["two"]
    assert s.features.shape == (4, 4) and s.image_loc.shape == (4, 5) and s.image_mask.shape == (4,)
    assert s.features.dtype == torch.float32 and s.image_loc.dtype == torch.float32
    assert s.image_mask.dtype == torch.int64
    assert s.image_mask.tolist() == [1, 1, 0, 0] and s.num_boxes == 2
    np.testing.assert_array_equal(s.features[:2].numpy(), FEATS)
    assert not s.features[2:].any() and not s.image_loc[2:].any()
    np.testing.assert_allclose(s.image_loc[1].numpy(), [0, 0, 1, 1, 1])


@pytest.mark.parametrize("mode", ["first", "last"])
@pytest.mark.parametrize("num_locs", [4, 5, 7])
def test_global_feature(store, mode, num_locs):
    s = RegionView(store, num_locs=num_locs, add_global_imgfeat=mode, max_region_num=3)["two"]
    assert s.features.shape == (4, 4)  # max_region_num + 1
    g_row = 0 if mode == "first" else 2
    np.testing.assert_allclose(s.features[g_row].numpy(), FEATS.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(s.image_loc[g_row].numpy(), [0, 0, 1, 1] + [1] * (num_locs - 4))
    regions = [1, 2] if mode == "first" else [0, 1]
    np.testing.assert_array_equal(s.features[regions].numpy(), FEATS)
    assert s.image_mask.tolist() == [1, 1, 1, 0] and s.num_boxes == 3


def test_truncation_keeps_first_rows(store):
    view = RegionView(store, add_global_imgfeat="first", max_region_num=3)
    s = view["five"]
    raw = store["five"]
    assert s.features.shape == (4, 4) and s.image_mask.tolist() == [1, 1, 1, 1] and s.num_boxes == 4
    np.testing.assert_allclose(s.features[0].numpy(), raw.features.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(s.features[1:].numpy(), raw.features[:3])
    # VE/XVNLI's loader adds no row for the global feature: passing max_region_num - 1
    # keeps the same rows VOLTA keeps there (global + first boxes, last box dropped).
    ve = RegionView(store, add_global_imgfeat="first", max_region_num=4)["five"]
    assert ve.features.shape == (5, 4)


def test_norm_embeddings(store):
    s = RegionView(store, num_locs=5, norm_embeddings=True, add_global_imgfeat="first",
                   max_region_num=2)["two"]
    np.testing.assert_allclose(s.features[1].numpy(), [0.6, 0.8, 0, 0], rtol=1e-6)
    loc = np.array([0.1, 0.1, 0.6, 0.9, 0.4])
    np.testing.assert_allclose(s.image_loc[1].numpy(), loc / np.linalg.norm(loc), rtol=1e-6)
    # global = mean of the *normalised* rows, location [0, 0, 1, 1, 1] (not normalised)
    np.testing.assert_allclose(s.features[0].numpy(), ([0.6, 0.8, 0, 0] + np.full(4, 0.5)) / 2,
                               rtol=1e-6)
    np.testing.assert_allclose(s.image_loc[0].numpy(), [0, 0, 1, 1, 1])


def test_zero_feature_row_under_norm_embeddings_stays_finite(tmp_path):
    path = tmp_path / "z"
    with open_writer(path, "native") as w:
        w.put("z", np.zeros((2, 4), np.float32), BOXES, W, H)
    s = RegionView(open_store(path), norm_embeddings=True)["z"]
    assert torch.isfinite(s.features).all() and torch.isfinite(s.image_loc).all()


def test_same_sample_from_every_layout(tmp_path):
    images = L.random_images(3, boxes=(5, 40), dim=16, seed=5)
    paths = [L.write_boxes36_h5(tmp_path / "a.h5", images),
             L.write_volta_lmdb(tmp_path / "a.lmdb", images),
             L.write_volta_lmdb(tmp_path / "b.lmdb", images, base64_fields=True),
             L.write_npy_dir(tmp_path / "a.npy", images)]
    views = [RegionView(open_store(p), num_locs=7, add_global_imgfeat="last") for p in paths]
    for image_id in images:
        ref = views[0][image_id]
        for view in views[1:]:
            other = view[image_id]
            for a, b in zip(ref[:3], other[:3]):
                assert torch.equal(a, b)


def test_bad_arguments(store):
    with pytest.raises(ValueError, match="num_locs"):
        RegionView(store, num_locs=6)
    with pytest.raises(ValueError, match="add_global_imgfeat"):
        RegionView(store, add_global_imgfeat="middle")


class _Samples(torch.utils.data.Dataset):
    def __init__(self, view, ids):
        self.view, self.ids = view, ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.view[self.ids[i]]


@pytest.mark.parametrize("fmt", ["native", "volta-lmdb", "h5"])
def test_dataloader_workers_fork(tmp_path, fmt):
    images = L.random_images(8, boxes=(4, 12), dim=16, seed=2)
    src = L.write_boxes36_h5(tmp_path / "a.h5", images)
    path = src if fmt == "h5" else str(tmp_path / f"s.{fmt}")
    if fmt != "h5":
        convert_store(src, path, to=fmt, progress=False)
    view = RegionView(open_store(path), max_region_num=12)
    ids = list(images)
    expected = torch.stack([view[i].features for i in ids])  # handle opened in the parent
    loader = DataLoader(_Samples(view, ids), batch_size=4, num_workers=2,
                        multiprocessing_context="fork")
    got = torch.cat([batch.features for batch in loader])
    assert torch.equal(got, expected)


def test_store_pickles_without_handles_for_spawn(tmp_path):
    images = L.random_images(4, boxes=6, dim=8, seed=4)
    path = tmp_path / "s"
    convert_store(L.write_boxes36_h5(tmp_path / "a.h5", images), path, progress=False)
    view = RegionView(open_store(path))
    first = next(iter(images))
    view[first]
    clone = pickle.loads(pickle.dumps(view))
    assert clone.store._handle is None
    assert torch.equal(clone[first].features, view[first].features)
    loader = DataLoader(_Samples(view, list(images)), batch_size=2, num_workers=1,
                        multiprocessing_context="spawn")
    assert sum(b.image_mask.sum().item() for b in loader) == 4 * 6


def _volta_reference(features, boxes, w, h, num_locs, add_global, norm, max_region_num):
    """The spec's description of VOLTA's reader + dataset padding, step by step (float64 detours
    included), written independently of RegionView."""
    num_boxes = features.shape[0]
    loc = np.zeros((num_boxes, num_locs), dtype=np.float32)
    loc[:, :4] = boxes
    if num_locs >= 5:
        loc[:, num_locs - 1] = ((loc[:, 3] - loc[:, 1]) * (loc[:, 2] - loc[:, 0])
                                / (float(w) * float(h)))
    loc[:, 0] /= float(w)
    loc[:, 2] /= float(w)
    loc[:, 1] /= float(h)
    loc[:, 3] /= float(h)
    if num_locs > 5:
        loc[:, 4] = loc[:, 2] - loc[:, 0]
        loc[:, 5] = loc[:, 3] - loc[:, 1]
    if norm:
        features = features / np.linalg.norm(features, 2, 1, keepdims=True)
        loc = loc / np.linalg.norm(loc, 2, 1, keepdims=True)
    if add_global:
        g_feat = np.sum(features, axis=0) / num_boxes
        g_loc = np.array([[0, 0, 1, 1] + [1] * (num_locs - 4)])  # int64: concat makes float64
        num_boxes += 1
        if add_global == "first":
            features = np.concatenate([g_feat[None], features])
            loc = np.concatenate([g_loc, loc])
        else:
            features = np.concatenate([features, g_feat[None]])
            loc = np.concatenate([loc, g_loc])
    rows_budget = max_region_num + (1 if add_global else 0)
    keep = min(num_boxes, rows_budget)
    feat_pad = np.zeros((rows_budget, features.shape[1]))  # float64 as in the datasets
    loc_pad = np.zeros((rows_budget, num_locs))
    mask = [1] * keep + [0] * (rows_budget - keep)
    feat_pad[:keep] = features[:keep]
    loc_pad[:keep] = loc[:keep]
    return (torch.tensor(feat_pad).float(), torch.tensor(loc_pad).float(),
            torch.tensor(mask).long())


@pytest.mark.parametrize("num_locs", [4, 5, 7])
@pytest.mark.parametrize("add_global", [None, "first", "last"])
@pytest.mark.parametrize("norm", [False, True])
def test_matches_volta_reference_exactly(tmp_path, num_locs, add_global, norm):
    images = L.random_images(4, boxes=(3, 12), dim=32, seed=11)
    view = RegionView(open_store(L.write_boxes36_h5(tmp_path / "a.h5", images)),
                      num_locs=num_locs, add_global_imgfeat=add_global,
                      norm_embeddings=norm, max_region_num=8)
    for image_id, img in images.items():
        ref = _volta_reference(img["features"], img["boxes"], img["img_w"], img["img_h"],
                               num_locs, add_global, norm, 8)
        got = view[image_id]
        for a, b in zip(got[:3], ref):
            assert a.dtype == b.dtype and torch.equal(a, b), image_id
