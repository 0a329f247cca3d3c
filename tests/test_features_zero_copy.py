"""Zero-copy reads from LMDB stores (volta_ml/features/lmdb_values.py): records are views of the
store file that stay valid after the store closes or is replaced, across threads and forks."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from volta_ml.features import lmdb_values, open_store, open_writer
from volta_ml.features.base import release_shared_env
from volta_ml.testing import legacy_layouts as L

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="zero-copy needs /proc/self/maps (Linux)")


def _native(path, images, **kw):
    with open_writer(path, "native", **kw) as w:
        for image_id, img in images.items():
            w.put(image_id, img["features"], img["boxes"], img["img_w"], img["img_h"])
    return str(path)


@pytest.fixture()
def images():
    return L.random_images(6, boxes=(3, 10), dim=24, seed=5)


def test_native_records_are_read_only_views_of_the_file(tmp_path, images):
    store = open_store(_native(tmp_path / "s", images))
    for image_id, img in images.items():
        rec = store[image_id]
        np.testing.assert_array_equal(rec.features, img["features"])
        np.testing.assert_array_equal(rec.boxes, img["boxes"])
        assert not rec.features.flags.owndata and not rec.features.flags.writeable
    assert store._values.zero_copy  # the fast path was taken, not the copying fallback


def test_records_outlive_close_and_replacement_of_the_store(tmp_path, images):
    path = _native(tmp_path / "s", images)
    store = open_store(path)
    first = next(iter(images))
    kept = store[first]
    store.close()
    release_shared_env(path)
    np.testing.assert_array_equal(kept.features, images[first]["features"])
    # Rewrite the store in this process: the old record keeps the old data, a new read sees
    # the new data (a fresh environment, transaction and file map).
    changed = {k: dict(v, features=v["features"] + 1) for k, v in images.items()}
    _native(path, changed, overwrite=True)
    np.testing.assert_array_equal(kept.features, images[first]["features"])
    np.testing.assert_array_equal(open_store(path)[first].features, changed[first]["features"])


def test_appended_records_are_visible_to_a_store_opened_before(tmp_path, images):
    ids = list(images)
    path = _native(tmp_path / "s", {k: images[k] for k in ids[:3]})
    store = open_store(path)
    store[ids[0]]  # starts this process's long read transaction
    _native(path, {k: images[k] for k in ids[3:]}, append=True)
    np.testing.assert_array_equal(store[ids[5]].features, images[ids[5]]["features"])


def test_copying_fallback_gives_the_same_records(tmp_path, images, monkeypatch):
    path = _native(tmp_path / "s", images)
    monkeypatch.setattr(lmdb_values, "_mapping_base", lambda address, data_file: None)
    store = open_store(path)
    for image_id, img in images.items():
        np.testing.assert_array_equal(store[image_id].features, img["features"])
    assert not store._values.zero_copy


def test_concurrent_threads_read_correct_records(tmp_path):
    images = L.random_images(40, boxes=8, dim=64, seed=6)
    store = open_store(_native(tmp_path / "s", images))
    errors = []

    def work(offset):
        for i in range(200):
            image_id = list(images)[(i * 7 + offset) % len(images)]
            if not np.array_equal(store[image_id].features, images[image_id]["features"]):
                errors.append(image_id)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


class _Sums(Dataset):
    def __init__(self, store, ids):
        self.store, self.ids = store, ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.store[self.ids[i]].features.sum(0)))


def test_forked_workers_and_records_read_before_the_fork(tmp_path, images):
    store = open_store(_native(tmp_path / "s", images))
    ids = list(images)
    before = {k: store[k] for k in ids}  # views mapped in the parent, used again in workers
    loader = DataLoader(_Sums(store, ids), batch_size=2, num_workers=2,
                        multiprocessing_context="fork")
    got = torch.cat([b for b in loader])
    expected = torch.stack([torch.from_numpy(images[k]["features"].sum(0)) for k in ids])
    assert torch.equal(got, expected)
    for k in ids:
        np.testing.assert_array_equal(before[k].features, images[k]["features"])


def test_sparse_volta_lmdb_maps_only_the_pages_in_use(tmp_path, images):
    # VOLTA's converters open LMDB with writemap=True: data.mdb is a sparse file of map_size bytes.
    path = L.write_volta_lmdb(tmp_path / "v.lmdb", images, writemap=True)
    store = open_store(path)
    first = next(iter(images))
    np.testing.assert_array_equal(store[first].features, images[first]["features"])
    assert store._values.zero_copy
    assert store._values._size < 2 << 20 < (tmp_path / "v.lmdb" / "data.mdb").stat().st_size
