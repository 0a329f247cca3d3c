"""Feature-store read rates: native store vs VOLTA-layout LMDB vs the raw-LMDB limit.

    python benchmarks/bench_features.py [--images 20000] [--boxes 36] [--dim 2048]

Builds, in --workdir (default: a temp dir, removed afterwards unless --keep):
  native   volta-ml native store (open_writer(fmt="native"))
  volta    VOLTA-layout keyed LMDB as h5_to_lmdb.py writes it (pickled dicts, raw arrays, b"keys")
  volta64  (with --stores ... volta64) the npy_to_lmdb.py layout: base64 features/boxes
  raw      an LMDB of plain little-endian bytes (features ‖ boxes) per image id
and prints records/s for random and sequential access with 0 and 2 DataLoader workers:
  volta-ml native      open_store(native)[id]
  volta-ml on VOLTA    open_store(volta)[id]   (restricted unpickler, O(1) get)
  VOLTA reader*        *a re-implementation, written for this benchmark, of the reading scheme
                       the spec describes for VOLTA's ImageFeaturesH5Reader: pickled keys list,
                       keys.index(id) per access (O(N)), pickle.loads, base64-first guess with a
                       raw fallback on exception. Not VOLTA's code.
  raw limit            txn.get + np.frombuffer on the raw store
Each DataLoader sample returns a tiny checksum so the numbers measure reading, not the
inter-process copy of 300 KB tensors (identical for every reader).
"""
from __future__ import annotations

import argparse
import base64
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import lmdb
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from volta_ml.features import open_store, open_writer  # noqa: E402
from volta_ml.features.base import shared_readonly_env  # noqa: E402


def synthetic_images(n, boxes, dim, seed=0):
    """Yields (id, features, boxes, w, h); a pool of arrays keeps generation cheap."""
    rng = np.random.default_rng(seed)
    pool = [rng.random((boxes, dim), dtype=np.float32) for _ in range(16)]
    box_pool = [np.sort(rng.uniform(0, 500, (boxes, 4)).astype(np.float32), axis=1) for _ in range(16)]
    for i in range(n):
        feats = pool[i % 16].copy()
        feats[0, 0] = i  # records differ
        yield f"{1000000 + i}", feats, box_pool[i % 16], 640, 480


STORE_KINDS = ("native", "volta", "volta64", "raw")


def _legacy_value(kind, image_id, f, b, iw, ih) -> bytes:
    if kind == "volta":  # h5_to_lmdb.py: pickled dict of raw arrays
        return pickle.dumps({"features": f, "boxes": b, "img_w": np.int64(iw),
                             "img_h": np.int64(ih), "img_id": image_id})
    if kind == "volta64":  # npy_to_lmdb.py: pickled dict, base64 features/boxes
        return pickle.dumps({"feature_path": image_id + ".npy", "features": base64.b64encode(f),
                             "boxes": base64.b64encode(b), "img_h": ih, "img_w": iw,
                             "num_boxes": len(b)})
    return f.tobytes() + b.tobytes()  # raw


def build_store(kind, path, n, boxes, dim):
    stamp = Path(path + f".built-{n}x{boxes}x{dim}")
    if stamp.exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    if kind == "native":
        with open_writer(path, "native") as w:
            for image_id, f, b, iw, ih in tqdm(synthetic_images(n, boxes, dim), total=n, desc=kind):
                w.put(image_id, f, b, iw, ih)
    else:
        env = lmdb.open(path, map_size=1 << 40)
        keys, txn = [], env.begin(write=True)
        for i, (image_id, f, b, iw, ih) in enumerate(tqdm(synthetic_images(n, boxes, dim), total=n,
                                                         desc=kind)):
            txn.put(image_id.encode(), _legacy_value(kind, image_id, f, b, iw, ih))
            keys.append(image_id.encode())
            if i % 256 == 255:
                txn.commit()
                txn = env.begin(write=True)
        if kind != "raw":
            txn.put(b"keys", pickle.dumps(keys))
        txn.commit()
        env.close()
    stamp.touch()


def make_readers(kind, path, boxes, dim):
    if kind == "native":
        return {"volta-ml native": open_store(path)}
    if kind == "raw":
        return {"raw lmdb get + frombuffer": RawReader(path, boxes, dim)}
    label = "VOLTA layout" if kind == "volta" else "VOLTA base64 layout"
    return {f"volta-ml on {label}": open_store(path),
            f"VOLTA reader* on {label}": VoltaSchemeReader(path, dim)}


class VoltaSchemeReader:
    """Re-implementation (for this benchmark only) of VOLTA's LMDB reading scheme."""

    def __init__(self, path, dim):
        self.path, self.dim = os.path.realpath(path), dim
        with shared_readonly_env(path).begin() as txn:
            self.keys = pickle.loads(txn.get(b"keys"))

    def __getitem__(self, image_id):
        image_id = str(image_id).encode()
        index = self.keys.index(image_id)  # O(N) list search on every access
        with shared_readonly_env(self.path).begin() as txn:
            item = pickle.loads(txn.get(self.keys[index]))
        try:  # base64 guess first, raw arrays on any exception
            features = np.frombuffer(base64.b64decode(item["features"]),
                                     dtype=np.float32).reshape(-1, self.dim)
            boxes = np.frombuffer(base64.b64decode(item["boxes"]), dtype=np.float32).reshape(-1, 4)
        except Exception:
            features = item["features"].reshape(-1, self.dim)
            boxes = item["boxes"].reshape(-1, 4)
        return features, boxes, int(item["img_w"]), int(item["img_h"])


class RawReader:
    def __init__(self, path, boxes, dim):
        self.path, self.n_feat = os.path.realpath(path), boxes * dim
        self.boxes, self.dim = boxes, dim

    def __getitem__(self, image_id):
        with shared_readonly_env(self.path).begin() as txn:
            value = txn.get(str(image_id).encode())
        features = np.frombuffer(value, np.float32, self.n_feat).reshape(self.boxes, self.dim)
        boxes = np.frombuffer(value, np.float32, offset=self.n_feat * 4).reshape(-1, 4)
        return features, boxes


def _checksum(out):
    features = out.features if hasattr(out, "features") else out[0]
    return float(features[0, 1])


class ReadDataset(Dataset):
    def __init__(self, reader, ids):
        self.reader, self.ids = reader, ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return _checksum(self.reader[self.ids[i]])


def rate(reader, ids, workers):
    if workers == 0:
        reader[ids[0]]  # open lazily outside the timing
        start = time.perf_counter()
        for image_id in ids:
            _checksum(reader[image_id])
        return len(ids) / (time.perf_counter() - start)
    loader = DataLoader(ReadDataset(reader, ids), batch_size=64, num_workers=workers,
                        multiprocessing_context="fork", persistent_workers=True)
    for _ in loader:  # start the workers and let them open their stores outside the timing
        pass
    start = time.perf_counter()
    count = sum(len(batch) for batch in loader)
    elapsed = time.perf_counter() - start
    del loader
    return count / elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--boxes", type=int, default=36)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--reads", type=int, default=3000, help="reads per measurement")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--stores", nargs="+", choices=STORE_KINDS, default=["native", "volta", "raw"],
                        help="volta = h5_to_lmdb.py layout (raw arrays); volta64 = npy_to_lmdb.py "
                        "layout (base64)")
    parser.add_argument("--repeat", type=int, default=3, help="report the best of N runs per cell")
    parser.add_argument("--keep", action="store_true", help="keep the stores; a later run with "
                        "the same --workdir and sizes reuses them")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_features_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        paths = {kind: str(workdir / kind) for kind in args.stores}
        readers = {}
        for kind, path in paths.items():
            build_store(kind, path, args.images, args.boxes, args.dim)
            readers.update(make_readers(kind, path, args.boxes, args.dim))
        sizes = {k: sum(f.stat().st_blocks * 512 for f in Path(p).iterdir()) / 2**20
                 for k, p in paths.items()}
        ids = [f"{1000000 + i}" for i in range(args.images)]
        rng = random.Random(0)
        # "sequential" is a run of consecutive ids centred in the store: its per-read cost is
        # that of a full pass (VOLTA's keys.index costs grow with the position in the list).
        reads = min(args.reads, len(ids))
        first = (len(ids) - reads) // 2
        patterns = {"random": rng.sample(ids, reads), "sequential": ids[first:first + reads]}
        # warm the page cache evenly for every store
        for reader in readers.values():
            for image_id in patterns["random"] + patterns["sequential"]:
                reader[image_id]
        print(f"\n{args.images} images x {args.boxes}x{args.dim} float32; {args.reads} reads per "
              f"cell, best of {args.repeat}; store sizes on disk (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in sizes.items()))
        cols = [(p, w) for p in patterns for w in args.workers]
        header = f"{'reader (records/s)':36}" + "".join(f"{p[:4]} w={w}".rjust(13) for p, w in cols)
        print(header)
        print("-" * len(header))
        # Best of --repeat rounds, every reader measured once per round: load from other work
        # on a shared machine only ever slows a run down, and rounds spread it across readers.
        table = {name: [0.0] * len(cols) for name in readers}
        for _ in tqdm(range(args.repeat), desc="rounds"):
            for name, reader in readers.items():
                for i, (p, w) in enumerate(cols):
                    table[name][i] = max(table[name][i], rate(reader, patterns[p], w))
        for name in readers:
            print(f"{name:36}" + "".join(f"{r:13.0f}" for r in table[name]))
        print("-" * len(header))
        ratios = [("volta-ml native / VOLTA reader*", "volta-ml native", "VOLTA reader* on VOLTA layout"),
                  ("native / VOLTA reader* (base64)", "volta-ml native",
                   "VOLTA reader* on VOLTA base64 layout"),
                  ("volta-ml / VOLTA reader*, same store", "volta-ml on VOLTA layout",
                   "VOLTA reader* on VOLTA layout"),
                  ("same, base64 store", "volta-ml on VOLTA base64 layout",
                   "VOLTA reader* on VOLTA base64 layout"),
                  ("volta-ml native / raw limit", "volta-ml native", "raw lmdb get + frombuffer")]
        for label, a, b in ratios:
            if a in table and b in table:
                print(f"{label:36}" + "".join(f"{x / y:12.2f}x" for x, y in zip(table[a], table[b])))
        print("targets: native >= 20x VOLTA reader*; native within 2x of the raw limit (ratio >= 0.5)")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
