"""The per-sample feature path as a training dataset uses it: store read + VOLTA padding + tensors.

    python benchmarks/bench_samples.py [--images 20000] [--boxes 36] [--dim 2048] [--workers 0 2]

Builds (in --workdir, default a temp dir removed afterwards unless --keep) a native store and a
VOLTA-layout LMDB (h5_to_lmdb.py's pickled raw arrays) holding the same images, warms the page
cache with one pass over both, then reads every image once in random order per cell and prints
samples/s with 0 and N DataLoader workers (best of --repeat interleaved rounds):

  VOLTA reader* + padding     bench_features.VoltaSchemeReader (a re-implementation of VOLTA's
                              ImageFeaturesH5Reader.__getitem__ written from the spec) followed by
                              the padding VOLTA's datasets do (spec pipeline.md "Padding of regions":
                              float64 zero arrays, copy, torch.tensor(...).float(), list mask)
  RegionView[id]              volta-ml's per-sample inputs, fresh tensors per sample
  region_arrays (datasets)    what every task dataset's __getitem__ calls (tasks/common.region_arrays:
                              RegionView.arrays, fresh numpy arrays in VOLTA's key names)
  RegionView.read_into        the same written into one reused padded buffer
  read_into batch slots       the same written into slot i % B of a reused [B, R, F] batch (what
                              RegionView.read_batch does; pinned memory when CUDA is available)
and the same paths with the batch built as the task datasets build it (collate = np.stack):
  VOLTA ... + collate, RegionView[id] + collate.  Each DataLoader sample is a checksum: the IPC of
  300 KB tensors (identical for every reader) is not measured.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_features as bf  # noqa: E402

from volta_ml.features import RegionView, open_store  # noqa: E402
from volta_ml.tasks.common import region_arrays  # noqa: E402


class VoltaSamples:
    """VOLTA reader* output padded the way VOLTA's datasets pad it (written from the spec)."""

    def __init__(self, reader, max_region_num, num_locs, add_global, dim=2048):
        self.reader, self.num_locs, self.dim = reader, num_locs, dim
        self.rows = max_region_num + (1 if add_global else 0)

    def __getitem__(self, image_id):
        features, num_boxes, boxes, _ = self.reader[image_id]
        mix_num_boxes = min(int(num_boxes), self.rows)
        mix_boxes_pad = np.zeros((self.rows, self.num_locs))
        mix_features_pad = np.zeros((self.rows, self.dim))  # VOLTA hard-codes 2048
        image_mask = [1] * int(mix_num_boxes)
        while len(image_mask) < self.rows:
            image_mask.append(0)
        mix_boxes_pad[:mix_num_boxes] = boxes[:mix_num_boxes]
        mix_features_pad[:mix_num_boxes] = features[:mix_num_boxes]
        return (torch.tensor(mix_features_pad).float(), torch.tensor(mix_boxes_pad).float(),
                torch.tensor(image_mask).long())


class IntoReader:
    """RegionView.read_into one reused padded buffer (numpy arrays, as a batch builder holds them)."""

    def __init__(self, view, slots=1, pin=False):
        self.view, self.slots, self.pin, self.count, self.buf, self.slot_arrays = view, slots, pin, 0, None, None

    def __getitem__(self, image_id):
        if self.buf is None:  # allocated in the process that reads (DataLoader workers included)
            self.buf = self.view.batch_buffer(self.slots, pin_memory=self.pin)
            arrays = [t.numpy() for t in self.buf[:3]]
            self.slot_arrays = [tuple(a[slot] for a in arrays) for slot in range(self.slots)]
        slot = self.count % self.slots
        self.count += 1
        arrays = self.slot_arrays[slot]
        self.view.read_into(image_id, *arrays)
        return arrays[0]

    def __getstate__(self):
        return {**self.__dict__, "buf": None, "slot_arrays": None, "count": 0}


class DatasetPath:
    """tasks/common.region_arrays: the per-sample region inputs exactly as a task dataset builds them."""

    def __init__(self, view):
        self.view = view

    def __getitem__(self, image_id):
        return region_arrays(self.view, image_id)["input_imgs"]


class Collated:
    """Per-sample tensors gathered into batches of `size` with np.stack, as tasks/common.collate does."""

    def __init__(self, reader, size):
        self.reader, self.size, self.pending = reader, size, []

    def __getitem__(self, image_id):
        sample = self.reader[image_id]
        self.pending.append([np.asarray(t) for t in sample[:3]])
        if len(self.pending) == self.size:
            batch = [np.stack(column) for column in zip(*self.pending)]
            self.pending = []
            return batch
        return sample

    def __getstate__(self):
        return {**self.__dict__, "pending": []}


def _checksum(out):  # one value of the padded features: the sample is built, IPC not measured
    features = out if hasattr(out, "shape") else out[0]
    if isinstance(features, torch.Tensor):  # tensor indexing costs more than the numpy view's
        features = features.numpy()
    return float(features[(0,) * (features.ndim - 1) + (1,)])


def make_readers(native, volta, args):
    view = RegionView(open_store(native), num_locs=args.num_locs,
                      add_global_imgfeat=args.add_global_imgfeat, max_region_num=args.boxes)
    volta_samples = VoltaSamples(bf.VoltaSchemeReader(volta, args.dim, args.num_locs,
                                                      args.add_global_imgfeat),
                                 args.boxes, args.num_locs, args.add_global_imgfeat, args.dim)
    readers = {"VOLTA reader* + padding": volta_samples, "RegionView[id]": view,
               "region_arrays (task datasets)": DatasetPath(view)}
    if hasattr(view, "read_into"):
        readers["RegionView.read_into (reused buffer)"] = IntoReader(view)
        readers[f"read_into batch slots ({args.batch_size})"] = IntoReader(
            view, args.batch_size, pin=torch.cuda.is_available())
    readers[f"VOLTA reader* + padding + collate ({args.batch_size})"] = Collated(volta_samples,
                                                                               args.batch_size)
    readers[f"RegionView[id] + collate ({args.batch_size})"] = Collated(view, args.batch_size)
    return readers


RATIOS = [("RegionView[id] / VOLTA", "RegionView[id]", "VOLTA reader* + padding"),
          ("region_arrays / VOLTA", "region_arrays (task datasets)", "VOLTA reader* + padding"),
          ("read_into / VOLTA", "RegionView.read_into (reused buffer)", "VOLTA reader* + padding")]


def print_table(table, workers, batch_size):
    header = f"{'samples/s':46}" + "".join(f"w={w}".rjust(12) for w in workers)
    print(f"\n{header}\n" + "-" * len(header))
    for name, row in table.items():
        print(f"{name:46}" + "".join(f"{r:12.0f}" for r in row))
    print("-" * len(header))
    ratios = RATIOS + [
        ("batch slots / VOLTA + collate", f"read_into batch slots ({batch_size})",
         f"VOLTA reader* + padding + collate ({batch_size})"),
        ("RegionView + collate / VOLTA + collate", f"RegionView[id] + collate ({batch_size})",
         f"VOLTA reader* + padding + collate ({batch_size})")]
    for label, a, b in ratios:
        if a in table and b in table:
            print(f"{label:46}" + "".join(f"{x / y:11.2f}x" for x, y in zip(table[a], table[b])))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--boxes", type=int, default=36, help="boxes per image (= max_region_num)")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batch-size", type=int, default=64, help="training batch (collate rows)")
    parser.add_argument("--loader-batch", type=int, default=256, help="DataLoader batch (w > 0)")
    parser.add_argument("--num-locs", type=int, default=5, choices=(4, 5, 7))
    parser.add_argument("--add-global-imgfeat", default="first", choices=("first", "last"))
    parser.add_argument("--repeat", type=int, default=3, help="report the best of N rounds per cell")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the stores for a later run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_samples_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        native, volta = str(workdir / "native"), str(workdir / "volta")
        for kind, path in (("native", native), ("volta", volta)):
            bf.build_store(kind, path, args.images, args.boxes, args.dim)
        readers = make_readers(native, volta, args)
        ids = [f"{1000000 + i}" for i in range(args.images)]
        order = random.Random(0).sample(ids, len(ids))
        for path in (native, volta):  # warm page cache: every byte of both stores read once
            with open(Path(path) / "data.mdb", "rb") as f:
                while f.read(64 << 20):
                    pass
        for reader in readers.values():
            for image_id in order[:200]:
                reader[image_id]
        print(f"\n{args.images} images x {args.boxes}x{args.dim} float32, each read once per cell in "
              f"random order, warm page cache, best of {args.repeat}; num_locs {args.num_locs}, "
              f"global feature {args.add_global_imgfeat}; DataLoader batch {args.loader_batch}")
        table = {name: [0.0] * len(args.workers) for name in readers}
        for _ in tqdm(range(args.repeat), desc="rounds"):
            for name, reader in readers.items():
                for i, w in enumerate(args.workers):
                    start = time.perf_counter()
                    got = bf.rate(reader, order, w, args.loader_batch, _checksum)
                    table[name][i] = max(table[name][i], got)
                    tqdm.write(f"  {name} w={w}: {got:.0f}/s ({time.perf_counter() - start:.1f} s)")
        print_table(table, args.workers, args.batch_size)
        return table
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
