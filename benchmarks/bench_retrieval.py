#!/usr/bin/env python3
"""Retrieval scoring throughput: VOLTA's scheme vs volta-ml's, in scored (caption, image) pairs per second.

VOLTA's scheme: one caption repeated against a chunk of ceil(n_img / 2) images per forward, text padded to
max_seq_length, fp32 (`volta_scheme_scores`). volta-ml: `compute_score_matrix` (batches of many pairs,
padding trimmed, dual-stream prefixes computed once per caption / image, optional bf16), 1 or more ranks.

Inputs mimic xFlickr&CO: captions of 10-25 tokens padded to 80, images with 36 regions + the global feature.
Weights are random (throughput does not depend on them). Rank runs use `--threads` threads per rank on CPU,
so 1 vs 2 ranks compares one core against two. Example:

    python benchmarks/bench_retrieval.py --sizes tiny,base --families ctrl_uniter_base,ctrl_vilbert_base
    python benchmarks/bench_retrieval.py --device cuda --precision bf16 --captions 64 --images 1000
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from volta_ml.engine.distributed import init_distributed, shutdown  # noqa: E402
from volta_ml.engine.retrieval import compute_score_matrix  # noqa: E402
from volta_ml.engine.retrieval_scorer import volta_scheme_scores  # noqa: E402
from volta_ml.models import build_model, load_config  # noqa: E402

TASK8 = {"TASK8": {"name": "RetrievalxFlickrCO", "type": "VL-logit", "num_labels": 1}}


def make_config(family: str, size: str):
    if size == "base":
        return load_config(family)
    base = load_config(family).to_dict()   # tiny: the family's layout at width 64
    base.update(hidden_size=64, v_hidden_size=64, num_attention_heads=4, v_num_attention_heads=4,
                intermediate_size=128, v_intermediate_size=128, pooler_size=64, v_pooler_size=64,
                clf_hidden_size=128, sublayer2attn_hidden_size={}, sublayer2num_attention_heads={},
                sublayer2intermediate_size={}, sublayer2v_attn_hidden_size={}, sublayer2v_num_attention_heads={},
                sublayer2v_intermediate_size={})
    return load_config(base)


def make_inputs(config, n_captions: int, n_images: int, seq_len: int = 80, regions: int = 37, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(10, 26, (n_captions,), generator=g)
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    ids = torch.randint(1000, config.vocab_size, (n_captions, seq_len), generator=g) * mask
    captions = {"input_txt": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    gallery = {"input_imgs": torch.rand(n_images, regions, config.v_feature_size, generator=g),
               "image_loc": torch.rand(n_images, regions, config.num_locs, generator=g),
               "image_attention_mask": torch.ones(n_images, regions, dtype=torch.long)}
    return captions, gallery


def build(config, device):
    torch.manual_seed(0)
    return build_model(config, TASK8, ["TASK8"]).to(device).eval()


def warm_up(model, captions, gallery) -> None:
    """One small forward first, so one-off start-up costs (kernel selection, allocator) are not timed."""
    volta_scheme_scores(model, {k: v[:1] for k, v in captions.items()}, {k: v[:2] for k, v in gallery.items()},
                        "TASK8", num_subiters=1)


def _rank_worker(rank, world, port, family, size, n_captions, n_images, device, precision, threads, pair_batch,
                 reuse_prefix, result_file):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    info = init_distributed(-1, device)
    config = make_config(family, size)
    model = build(config, info.device)
    captions, gallery = make_inputs(config, n_captions, n_images)
    warm_up(model, captions, gallery)
    torch.distributed.barrier()
    started = time.perf_counter()
    compute_score_matrix(model, captions, gallery, task_id="TASK8", info=info, precision=precision,
                         pair_batch=pair_batch, captions_per_chunk=max(1, n_captions // (4 * world)),
                         reuse_prefix=reuse_prefix, progress=False)
    if info.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    if rank == 0:
        Path(result_file).write_text(str(elapsed))
    shutdown(info)


def time_ours(family, size, n_captions, n_images, device, precision, ranks, threads, pair_batch,
              reuse_prefix=True) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "seconds")
        port = 29500 + (os.getpid() % 1000)
        mp.spawn(_rank_worker, nprocs=ranks, args=(ranks, port, family, size, n_captions, n_images, device,
                                                    precision, threads, pair_batch, reuse_prefix, result))
        return float(Path(result).read_text())


def time_volta(family, size, n_captions, n_images, device, threads) -> float:
    torch.set_num_threads(threads)
    config = make_config(family, size)
    model = build(config, device)
    captions, gallery = make_inputs(config, n_captions, n_images)
    warm_up(model, captions, gallery)
    started = time.perf_counter()
    volta_scheme_scores(model, captions, gallery, "TASK8", num_subiters=2)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="ctrl_uniter_base,ctrl_vilbert_base")
    parser.add_argument("--sizes", default="tiny,base")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", help="precision(s) of our scheme, e.g. fp32,bf16")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--captions", type=int, default=0, help="default: 32 tiny, 2 base")
    parser.add_argument("--images", type=int, default=0, help="default: 64 tiny, 16 base")
    parser.add_argument("--pair_batch", type=int, default=256)
    parser.add_argument("--ablate_prefix", action="store_true",
                        help="also time 1 rank without the dual-stream prefix reuse")
    args = parser.parse_args()

    header = f"{'family':<18} {'size':<5} {'device':<6} {'scheme':<22} {'ranks':>5} {'pairs':>7} {'sec':>8} " \
             f"{'pairs/s':>9} {'vs VOLTA':>8}"
    print(header)
    print("-" * len(header))
    for family in args.families.split(","):
        for size in args.sizes.split(","):
            n_cap = args.captions or (32 if size == "tiny" else 2)
            n_img = args.images or (64 if size == "tiny" else 16)
            pairs = n_cap * n_img
            volta = time_volta(family, size, n_cap, n_img, args.device, args.threads)
            rows = [("VOLTA (1 cap/fwd, fp32)", 1, volta)]
            for precision in args.precision.split(","):
                for ranks in (int(r) for r in args.ranks.split(",")):
                    if args.device.startswith("cuda") and ranks > torch.cuda.device_count():
                        print(f"(skipping {ranks} ranks: only {torch.cuda.device_count()} GPU(s), one rank per GPU)")
                        continue
                    rows.append((f"volta-ml ({precision})", ranks,
                                 time_ours(family, size, n_cap, n_img, args.device, precision, ranks, args.threads,
                                           args.pair_batch)))
            if args.ablate_prefix and make_config(family, size).image_embeddings in ("vilbert", "lxmert"):
                precision = args.precision.split(",")[0]
                rows.append(("  same, no prefix reuse", 1,
                             time_ours(family, size, n_cap, n_img, args.device, precision, 1, args.threads,
                                       args.pair_batch, reuse_prefix=False)))
            for scheme, ranks, seconds in rows:
                print(f"{family:<18} {size:<5} {args.device:<6} {scheme:<22} {ranks:>5} {pairs:>7} {seconds:>8.2f} "
                      f"{pairs / seconds:>9.1f} {volta / seconds:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
