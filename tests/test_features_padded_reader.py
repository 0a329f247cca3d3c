"""The padded-buffer reader (RegionView.read_into into a reused dirty buffer, read_batch,
RegionView[id] through the native store's region_parts, and RegionView.arrays / region_arrays as the
task datasets call them) gives exactly VOLTA's reader + dataset
padding, for all 18 num_locs / global feature / norm_embeddings combinations, on every read path:
native float32 (copy from the zero-copy map), native float16 (cast copy), native without the
zero-copy map (copy from bytes), H5."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from test_features_region_view import _volta_reference
from volta_ml.features import RegionView, open_store
from volta_ml.features import lmdb_values
from volta_ml.features.base import release_shared_env
from volta_ml.features.convert import convert_store
from volta_ml.features.records import FeatureDimError
from volta_ml.tasks.common import region_arrays
from volta_ml.testing import legacy_layouts as L

MAX_REGIONS = 8  # images hold 3-12 boxes: some are padded, some truncated
FIRST = "100000"  # the first id legacy_layouts.random_images makes


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("padded")
    images = L.random_images(6, boxes=(3, 12), dim=32, seed=11)
    h5 = L.write_boxes36_h5(tmp / "a.h5", images)
    paths = {"h5": h5, "native": str(tmp / "a.vmlf"), "native-f16": str(tmp / "b.vmlf")}
    convert_store(h5, paths["native"], to="native", progress=False)
    convert_store(h5, paths["native-f16"], to="native", feature_dtype="float16", progress=False)
    return images, paths


def _expected(img, num_locs, add_global, norm, f16):
    features = img["features"].astype(np.float16).astype(np.float32) if f16 else img["features"]
    return _volta_reference(features, img["boxes"], img["img_w"], img["img_h"], num_locs,
                            add_global, norm, MAX_REGIONS)


def _view(path, num_locs, add_global, norm):
    return RegionView(open_store(path), num_locs=num_locs, add_global_imgfeat=add_global,
                      norm_embeddings=norm, max_region_num=MAX_REGIONS)


@pytest.mark.parametrize("num_locs", [4, 5, 7])
@pytest.mark.parametrize("add_global", [None, "first", "last"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("kind", ["native", "native-f16", "h5"])
def test_every_read_path_equals_volta(stores, kind, num_locs, add_global, norm):
    images, paths = stores
    view = _view(paths[kind], num_locs, add_global, norm)
    rows = view.num_rows
    # one reused buffer, dirty from the start and from the previous image
    buffer = [np.full((rows, 32), np.nan, np.float32), np.full((rows, num_locs), np.nan, np.float32),
              np.full(rows, 7, np.int64)]
    batch = view.read_batch(list(images))
    for slot, (image_id, img) in enumerate(images.items()):
        ref = _expected(img, num_locs, add_global, norm, kind == "native-f16")
        sample = view[image_id]
        num_boxes = view.read_into(image_id, *buffer)
        *arrays, arrays_boxes = view.arrays(image_id)  # what the task datasets read (region_arrays)
        dataset = region_arrays(view, image_id)
        for got in (sample[:3], [torch.from_numpy(b) for b in buffer],
                    [batch.features[slot], batch.image_loc[slot], batch.image_mask[slot]],
                    [torch.from_numpy(a) for a in arrays],
                    [torch.from_numpy(dataset[k]) for k in ("input_imgs", "image_loc", "image_attention_mask")]):
            for a, b in zip(got, ref):
                assert a.dtype == b.dtype and torch.equal(a, b), image_id
        assert num_boxes == sample.num_boxes == arrays_boxes == int(ref[2].sum()) == int(batch.num_boxes[slot])


def test_without_the_zero_copy_map_the_copy_path_gives_the_same(stores, monkeypatch):
    images, paths = stores
    expected = {i: _view(paths["native"], 7, "last", True)[i] for i in images}
    release_shared_env(paths["native"])
    monkeypatch.setattr(lmdb_values, "_mapping_base", lambda address, data_file: None)
    view = _view(paths["native"], 7, "last", True)
    try:
        assert isinstance(view.store.get_value(FIRST.encode()), bytes)  # no map: a copy
        for image_id, sample in expected.items():
            for a, b in zip(view[image_id][:3], sample[:3]):
                assert torch.equal(a, b)
    finally:
        release_shared_env(paths["native"])


def test_read_batch_reuses_its_buffer_and_pins_on_request(stores):
    images, paths = stores
    view = _view(paths["native"], 5, "first", False)
    ids = list(images)
    first = view.read_batch(ids[:3])
    again = view.read_batch(ids[3:], out=first)
    assert again.features.data_ptr() == first.features.data_ptr()  # written in place
    for slot, image_id in enumerate(ids[3:]):
        assert torch.equal(again.features[slot], view[image_id].features)
    smaller = view.read_batch(ids[:2], out=first)  # another shape: a new buffer
    assert smaller.features.shape[0] == 2
    if torch.cuda.is_available():
        assert view.read_batch(ids, pin_memory=True).features.is_pinned()


def test_read_into_refuses_a_wrong_buffer(stores):
    _, paths = stores
    view = _view(paths["native"], 5, None, False)
    ok = view.batch_buffer(1)
    with pytest.raises(ValueError, match=r"image_loc must be a C-contiguous float32 array of shape \(8, 5\)"):
        view.read_into(FIRST, ok.features[0], torch.zeros(8, 4), ok.image_mask[0])
    with pytest.raises(ValueError, match="features must be a C-contiguous"):
        view.read_into(FIRST, ok.features[0].t(), ok.image_loc[0], ok.image_mask[0])
    with pytest.raises(FeatureDimError, match="v_feature_size"):
        RegionView(open_store(paths["native"]), feature_dim=2048).read_into(FIRST, *ok[:3])
    with pytest.raises(KeyError, match="'nope'"):
        view.read_into("nope", *ok[:3])
