"""Bad input, each its own test: code-running pickles, corrupt records, missing ids,
wrong dimensions, empty and half-written stores."""
from __future__ import annotations

import os
import pickle
import subprocess

import lmdb
import numpy as np
import pytest

from volta_ml.features import (FeatureDimError, FeatureStoreError, IncompleteStoreError,
                               MissingImageError, RegionView, UnsafePickleError, open_store,
                               open_writer)
from volta_ml.features.convert import convert_store
from volta_ml.testing import legacy_layouts as L

DIM = 32


@pytest.fixture()
def images():
    return L.random_images(4, boxes=12, dim=DIM, seed=3)


class _Evil:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _put(path, key: bytes, value: bytes):
    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(key, value)
    env.close()


def test_pickled_code_in_volta_lmdb_value_is_refused(tmp_path, images):
    marker = tmp_path / "pwned"
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", images)
    _put(path, b"evil", pickle.dumps({"features": _Evil(marker)}))
    store = open_store(path)
    with pytest.raises(UnsafePickleError) as err:
        store["evil"]
    assert "x.lmdb" in str(err.value) and "'evil'" in str(err.value) and "posix.system" in str(err.value)
    assert not marker.exists()
    assert store[next(iter(images))].num_boxes == 12  # the other records still read


def test_pickled_code_in_keys_list_is_refused(tmp_path, images):
    marker = tmp_path / "pwned"
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", images)
    _put(path, b"keys", pickle.dumps([_Evil(marker)]))
    with pytest.raises(UnsafePickleError, match="keys"):
        list(open_store(path))
    assert not marker.exists()


def test_pickled_code_in_info_npy_is_refused(tmp_path, images):
    marker = tmp_path / "pwned"
    path = L.write_npy_dir(tmp_path / "x.npy", images)
    first = next(iter(images))
    np.save(os.path.join(path, f"{first}_info.npy"), np.array(_Evil(marker), dtype=object),
            allow_pickle=True)
    with pytest.raises(UnsafePickleError) as err:
        open_store(path)[first]
    assert first in str(err.value)
    assert not marker.exists()


def test_pickled_code_in_td_record_is_refused(tmp_path, images):
    marker = tmp_path / "pwned"
    records = L.h5_style_td_records(images)
    records[1]["entry"] = _Evil(marker)
    path = L.write_td_lmdb(tmp_path / "td.lmdb", records, serializer="pickle")
    with pytest.raises(UnsafePickleError, match="00000001"):
        list(open_store(path))
    assert not marker.exists()


def test_numpy_subclass_and_other_globals_refused(tmp_path, images):
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", images)
    _put(path, b"rec", pickle.dumps({"features": np.rec.array([(1, 2)])}))
    _put(path, b"mod", pickle.dumps({"features": subprocess.Popen}))  # a class global
    store = open_store(path)
    for key in ("rec", "mod"):
        with pytest.raises(UnsafePickleError, match=key):
            store[key]


def test_truncated_volta_lmdb_record_names_store_and_key(tmp_path, images):
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", images)
    first = next(iter(images))
    env = lmdb.open(path, map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(first.encode(), txn.get(first.encode())[:200])
    env.close()
    with pytest.raises(FeatureStoreError) as err:
        open_store(path)[first]
    assert "x.lmdb" in str(err.value) and repr(first) in str(err.value)


def test_corrupt_base64_record_names_store_and_key(tmp_path, images):
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", images, base64_fields=True)
    first = next(iter(images))
    bad = {"features": b"!!not base64!!", "boxes": b"AAAAAAAAAAAAAAAAAAAAAA==", "img_w": 5, "img_h": 5}
    _put(path, first.encode(), pickle.dumps(bad))
    with pytest.raises(FeatureStoreError, match=f"'{first}'.*base64"):
        open_store(path)[first]


def test_corrupt_native_record_names_store_and_key(tmp_path, images):
    path = tmp_path / "n"
    convert_store(L.write_boxes36_h5(tmp_path / "a.h5", images), path, progress=False)
    first = next(iter(images))
    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(first.encode(), txn.get(first.encode())[:500])
    env.close()
    with pytest.raises(FeatureStoreError, match=f"n \\[key '{first}'\\].*truncated"):
        open_store(path)[first]


def test_truncated_npy_and_msgpack_records(tmp_path, images):
    first = next(iter(images))
    npy = L.write_npy_dir(tmp_path / "x.npy", images)
    feat = os.path.join(npy, f"{first}.npy")
    with open(feat, "r+b") as f:
        f.truncate(os.path.getsize(feat) - 100)
    with pytest.raises(FeatureStoreError, match=f"'{first}'.*truncated"):
        open_store(npy)[first]
    td = L.write_td_lmdb(tmp_path / "td.lmdb", L.h5_style_td_records(images))
    env = lmdb.open(td, map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(b"00000002", txn.get(b"00000002")[:300])
    env.close()
    with pytest.raises(FeatureStoreError, match="00000002"):
        list(open_store(td).iter_records())


def test_missing_image_id_is_keyerror_with_near_matches(tmp_path, images):
    for path in (L.write_volta_lmdb(tmp_path / "x.lmdb", images),
                 L.write_boxes36_h5(tmp_path / "x.h5", images)):
        store = open_store(path)
        with pytest.raises(KeyError) as err:
            store["100001x"]
        assert isinstance(err.value, MissingImageError)
        msg = str(err.value)
        assert "'100001x'" in msg and str(path) in msg and "'100001'" in msg
        assert "100001x" not in store and store.get("nope") is None


def test_wrong_feature_dimension(tmp_path, images):
    path = L.write_boxes36_h5(tmp_path / "x.h5", images)
    with pytest.raises(FeatureDimError, match="32 but 2048"):
        open_store(path, feature_dim=2048)[next(iter(images))]
    native = tmp_path / "n"
    convert_store(path, native, progress=False)
    with pytest.raises(FeatureDimError, match="32-d features but 2048"):
        open_store(native, feature_dim=2048)
    view = RegionView(open_store(native), feature_dim=2048)
    with pytest.raises(FeatureDimError, match="v_feature_size"):
        view[next(iter(images))]
    with open_writer(tmp_path / "w", "native") as w:
        w.put("a", np.zeros((3, DIM), np.float32), np.zeros((3, 4), np.float32), 10, 10)
        with pytest.raises(FeatureDimError, match="'b'"):
            w.put("b", np.zeros((3, DIM + 1), np.float32), np.zeros((3, 4), np.float32), 10, 10)


def test_mismatched_rows_and_bad_shapes_refused(tmp_path):
    with open_writer(tmp_path / "w", "native") as w:
        with pytest.raises(FeatureStoreError, match="3 feature rows but 2 boxes"):
            w.put("a", np.zeros((3, 8), np.float32), np.zeros((2, 4), np.float32), 10, 10)
        w.put("ok", np.zeros((2, 8), np.float32), np.zeros((2, 4), np.float32), 10, 10)


def test_empty_stores_are_refused(tmp_path):
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(IncompleteStoreError, match="empty"):
        open_store(tmp_path / "emptydir")
    lmdb.open(str(tmp_path / "empty.lmdb")).close()
    with pytest.raises(IncompleteStoreError, match="empty"):
        open_store(tmp_path / "empty.lmdb")
    open_writer(tmp_path / "n0", "native").close()
    with pytest.raises(IncompleteStoreError, match="empty"):
        open_store(tmp_path / "n0")
    (tmp_path / "e.tsv").write_text("")
    with pytest.raises(IncompleteStoreError, match="empty"):
        open_store(tmp_path / "e.tsv")


def test_half_written_native_store_refused_then_resumed(tmp_path, images):
    path = tmp_path / "n"
    items = list(images.items())
    with pytest.raises(RuntimeError):
        with open_writer(path, "native") as w:
            for image_id, img in items[:2]:
                w.put(image_id, img["features"], img["boxes"], img["img_w"], img["img_h"])
            raise RuntimeError("extractor crashed")
    with pytest.raises(IncompleteStoreError, match="half-written"):
        open_store(path)
    w = open_writer(path, "native")  # resume: what was written survived the crash
    assert items[0][0] in w and items[1][0] in w and items[2][0] not in w
    for image_id, img in items[2:]:
        w.put(image_id, img["features"], img["boxes"], img["img_w"], img["img_h"])
    w.close()
    assert sorted(open_store(path)) == sorted(images)
    with pytest.raises(FileExistsError):
        open_writer(path, "native")


def test_half_written_legacy_layouts_refused(tmp_path, images):
    no_keys = L.write_volta_lmdb(tmp_path / "x.lmdb", images, write_keys=False)
    with pytest.raises(IncompleteStoreError, match="b'keys'"):
        open_store(no_keys)
    td = L.write_td_lmdb(tmp_path / "td.lmdb", L.h5_style_td_records(images), write_keys=False)
    with pytest.raises(IncompleteStoreError, match="__keys__"):
        open_store(td)
    for fmt in ("h5", "npy", "volta-lmdb", "td-lmdb"):
        dst = tmp_path / f"out.{fmt}"
        w = open_writer(dst, fmt)
        w.put("a", np.zeros((2, 8), np.float32), np.zeros((2, 4), np.float32), 10, 10)
        w.abort()  # a crash: close() never ran
        with pytest.raises(IncompleteStoreError):
            open_store(dst)


def _damaged_store(tmp_path, fmt: str) -> tuple[str, list[str]]:
    """160 one-region images written by the project's writer (small records: many leaf pages), the live leaf
    holding image `img0100` (td-LMDB: its record `00000100`) zeroed, LMDB's header left valid; the store and the
    keys that leaf held."""
    from helpers_lmdb_pages import damage_page, live_leaf_holding

    path = str(tmp_path / f"{fmt}.lmdb")
    with open_writer(path, fmt) as writer:
        for i, (image_id, img) in enumerate(L.random_images(160, boxes=1, dim=4, seed=1).items()):
            writer.put(f"img{i:04d}", img["features"], img["boxes"], img["img_w"], img["img_h"])
    data = os.path.join(path, "data.mdb")
    page, keys = live_leaf_holding(data, b"00000100" if fmt == "td-lmdb" else b"img0100")
    damage_page(data, page)
    return path, [k.decode() for k in keys]


def test_a_branch_page_pointing_outside_itself_is_named_not_followed(tmp_path):
    """A damaged branch page whose header still reads right but whose node table points past the page: the tree
    check names the page (it read past the page before, or failed with a struct error at the file's end)."""
    import struct

    from helpers_lmdb_pages import DB_SIZE, META_DB, P_BRANCH, PAGE_HEADER
    from volta_ml.features.lmdb_values import damaged_page

    path = str(tmp_path / "native.lmdb")
    with open_writer(path, "native") as writer:
        for i, (_, img) in enumerate(L.random_images(160, boxes=1, dim=4, seed=1).items()):
            writer.put(f"img{i:04d}", img["features"], img["boxes"], img["img_w"], img["img_h"])
    data, psize = os.path.join(path, "data.mdb"), 4096
    assert damaged_page(data, psize) is None
    blob = bytearray(open(data, "rb").read())
    metas = [(struct.unpack_from("<Q", blob, m * psize + META_DB + 2 * DB_SIZE + 8)[0],
              struct.unpack_from("<Q", blob, m * psize + META_DB + DB_SIZE + 40)[0]) for m in (0, 1)]
    root = max(metas)[1]
    assert struct.unpack_from("<H", blob, root * psize + 10)[0] & P_BRANCH, "160 records: the root is a branch"
    struct.pack_into("<H", blob, root * psize + PAGE_HEADER, psize - 2)      # node 0 past the page's end
    with open(data, "wb") as f:
        f.write(bytes(blob))
    assert damaged_page(data, psize) == f"page {root} is damaged: its node 0 lies at {psize - 2}, outside the page"


def test_damaged_lmdb_data_pages_are_one_line_naming_store_and_key(tmp_path, capsys):
    """A store whose LMDB header is valid but one of whose data pages is damaged (lmdb.CorruptedError at read
    time): `volta-ml features verify` ends with one line naming the store and the key (native: the page; listing
    its keys steps through every leaf, and LMDB aborts the process on a damaged one, so the tree is checked
    first: in a subprocess), exit 2, no traceback; a VOLTA LMDB's verify lists the unreadable record among its
    errors; a read in a DataLoader worker ends the run with the same one line, exit 2."""
    import sys

    import torch

    from volta_ml.cli import main
    from volta_ml.engine.failures import describe

    native, _ = _damaged_store(tmp_path, "native")
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "features", "verify", native], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"volta-ml features verify: error: {native}: cannot read the LMDB while listing its records (page "
        f"{proc.stderr.split('(page ')[1].split(' ')[0]} is not the tree page it should be: it reads as page 0, "
        "flags 0x0): its data pages are damaged (an interrupted copy or a failing disk): copy or rebuild the store"]
    td, keys = _damaged_store(tmp_path, "td-lmdb")
    assert main(["features", "verify", td]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"volta-ml features verify: error: {td} [key '{keys[0]}']: cannot read the LMDB "
                                        "(CorruptedError: mdb_get: MDB_CORRUPTED: Located page was wrong type): its "
                                        "data pages are damaged (an interrupted copy or a failing disk): copy or "
                                        "rebuild the store"]
    volta, keys = _damaged_store(tmp_path, "volta-lmdb")
    assert main(["features", "verify", volta]) == 1
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.startswith("error: ")]
    assert listed == [f"error: {volta} [key '{k}']: cannot read the LMDB (CorruptedError: mdb_get: MDB_CORRUPTED: Located "
                      "page was wrong type): its data pages are damaged (an interrupted copy or a failing disk): copy "
                      "or rebuild the store" for k in keys] and out.endswith("FAILED\n"), out

    view = RegionView(volta)
    loader = torch.utils.data.DataLoader([f"img{i:04d}" for i in range(95, 105)], num_workers=2, batch_size=2,
                                         collate_fn=lambda ids: [view.arrays(i)[0].sum() for i in ids])
    with pytest.raises(Exception) as caught:
        list(loader)
    code, line = describe(caught.value)
    assert code == 2 and "MDB_CORRUPTED" in line and "\n" not in line, line
    assert any(line.startswith(f"{volta} [key '{k}']: cannot read the LMDB") for k in keys), line
