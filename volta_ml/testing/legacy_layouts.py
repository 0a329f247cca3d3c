"""Write small feature stores in VOLTA/IGLUE's legacy layouts, the way their scripts do.

Used by tests and benchmarks to check volta-ml's readers against files laid out
exactly as spec features.md §4 describes, written *without* volta-ml's writers
(plain h5py / numpy / pickle / msgpack / lmdb calls), so a writer bug cannot
hide a reader bug.  Each function takes a dict image_id -> fields and returns the path.
"""
from __future__ import annotations

import base64
import os
import pickle

import h5py
import lmdb
import msgpack
import numpy as np


def random_images(n: int, boxes=36, dim=2048, seed=0, with_scores=True) -> dict:
    """image_id -> dict(features, boxes, img_w, img_h, obj_id, obj_conf, attr_id, attr_conf)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        nb = boxes if isinstance(boxes, int) else int(rng.integers(boxes[0], boxes[1] + 1))
        w, h = int(rng.integers(200, 1000)), int(rng.integers(200, 1000))
        x1 = rng.uniform(0, w / 2, nb).astype(np.float32)
        y1 = rng.uniform(0, h / 2, nb).astype(np.float32)
        x2 = (x1 + rng.uniform(1, w / 2, nb)).astype(np.float32)
        y2 = (y1 + rng.uniform(1, h / 2, nb)).astype(np.float32)
        img = {"features": rng.random((nb, dim), dtype=np.float32),
               "boxes": np.stack([x1, y1, x2, y2], axis=1), "img_w": w, "img_h": h}
        if with_scores:
            img.update(obj_id=rng.integers(0, 1600, nb), obj_conf=rng.random(nb, dtype=np.float32),
                       attr_id=rng.integers(0, 400, nb), attr_conf=rng.random(nb, dtype=np.float32))
        out[f"{100000 + i}"] = img
    return out


def write_boxes36_h5(path, images: dict) -> str:
    """Group per image; datasets as detectron2_proposal_maxnms.py writes them."""
    with h5py.File(path, "w") as f:
        for image_id, img in images.items():
            g = f.create_group(image_id)
            for name, value in img.items():
                g[name] = np.int64(value) if name in ("img_w", "img_h") else value
    return str(path)


def write_npy_dir(path, images: dict) -> str:
    """<stem>.npy features + <stem>_info.npy pickled dict, as extract_features_vmb.py writes."""
    os.makedirs(path, exist_ok=True)
    for image_id, img in images.items():
        np.save(os.path.join(path, f"{image_id}.npy"), img["features"])
        n = img["features"].shape[0]
        info = {"bbox": img["boxes"], "num_boxes": n,
                "objects": np.asarray(img.get("obj_id", np.zeros(n)), dtype=np.int64),
                "cls_prob": np.full((n, 1600), 1 / 1600, dtype=np.float32),
                "image_width": img["img_w"], "image_height": img["img_h"]}
        np.save(os.path.join(path, f"{image_id}_info.npy"), info, allow_pickle=True)
    return str(path)


def write_volta_lmdb(path, images: dict, base64_fields=False, write_keys=True,
                     writemap=False, subdir=True) -> str:
    """VOLTA's keyed LMDB: pickled dict per image + pickled b'keys' list.

    base64_fields=False mirrors h5_to_lmdb.py (raw arrays, int64 sizes, img_id);
    True mirrors npy_to_lmdb.py (base64 features/boxes, int sizes, num_boxes).
    subdir=False writes LMDB's one-file layout (`path` itself is the data file).
    """
    env = lmdb.open(str(path), map_size=1 << 36, writemap=writemap, subdir=subdir)
    keys = []
    with env.begin(write=True) as txn:
        for image_id, img in images.items():
            if base64_fields:
                n = img["features"].shape[0]
                item = {"feature_path": f"{image_id}.npy",
                        "features": base64.b64encode(img["features"]),
                        "boxes": base64.b64encode(img["boxes"]),
                        "img_h": int(img["img_h"]), "img_w": int(img["img_w"]), "num_boxes": n,
                        "objects": np.asarray(img.get("obj_id", np.zeros(n)), dtype=np.int64),
                        "cls_prob": np.full((n, 16), 0.5, dtype=np.float32)}
            else:
                item = {k: (np.int64(v) if k in ("img_w", "img_h") else v) for k, v in img.items()}
                item["img_id"] = image_id
            txn.put(image_id.encode(), pickle.dumps(item))
            keys.append(image_id.encode())
        if write_keys:
            txn.put(b"keys", pickle.dumps(keys))
    env.close()
    return str(path)


def msgpack_numpy_dumps(obj) -> bytes:
    """msgpack + msgpack-numpy 0.4.4.3 encoding, as tensorpack 0.9.4's dumps writes it."""
    def encode(o):
        if isinstance(o, np.ndarray):
            return {b"nd": True, b"type": o.dtype.str, b"kind": b"", b"shape": o.shape,
                    b"data": o.tobytes()}
        if isinstance(o, np.generic):
            return {b"nd": False, b"type": o.dtype.str, b"data": o.tobytes()}
        raise TypeError(type(o))
    return msgpack.packb(obj, use_bin_type=True, default=encode)


def write_td_lmdb(path, records: list, serializer="msgpack", write_keys=True, subdir=True) -> str:
    """tensorpack LMDBSerializer.save: keys 00000000..., then __keys__. subdir=False is what LMDBSerializer.save
    (and so VOLTA's h5_to_td-lmdb.py) writes to a path that does not exist yet: one file, `path` itself."""
    dumps = msgpack_numpy_dumps if serializer == "msgpack" else (lambda o: pickle.dumps(o, -1))
    env = lmdb.open(str(path), map_size=1 << 36, subdir=subdir)
    keys = []
    with env.begin(write=True) as txn:
        for i, rec in enumerate(records):
            key = f"{i:08d}".encode("ascii")
            txn.put(key, dumps(rec))
            keys.append(key)
        if write_keys:
            txn.put(b"__keys__", dumps(keys))
    env.close()
    return str(path)


def h5_style_td_records(images: dict) -> list:
    """One record per image, as h5_to_td-lmdb.py builds them (H5 fields + img_id)."""
    return [{**{k: (np.int64(v) if k in ("img_w", "img_h") else v) for k, v in img.items()},
             "img_id": image_id} for image_id, img in images.items()]


def write_lxmert_tsv(path, images: dict, caffe=False) -> str:
    """LXMERT 10-column TSV (or Caffe generate_tsv.py's 6 columns)."""
    def b64(a):
        return base64.b64encode(np.ascontiguousarray(a)).decode()
    with open(path, "w") as f:
        for image_id, img in images.items():
            n = img["features"].shape[0]
            if caffe:
                cells = [image_id, str(img["img_w"]), str(img["img_h"]), str(n),
                         b64(img["boxes"]), b64(img["features"])]
            else:
                cells = [image_id, str(img["img_h"]), str(img["img_w"]),
                         b64(np.asarray(img["obj_id"], np.int64)), b64(img["obj_conf"]),
                         b64(np.asarray(img["attr_id"], np.int64)), b64(img["attr_conf"]), str(n),
                         b64(img["boxes"]), b64(img["features"])]
            f.write("\t".join(cells) + "\n")
    return str(path)
