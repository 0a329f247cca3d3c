"""Generated Conceptual Captions / Wikipedia batches for the engine-side pretraining tests (the readers of VOLTA's
files are tested in test_pretrain_data.py), and a runnable entry point:

    python tests/helpers_pretrain_train.py [--wiki] [--examples N] [--sleep S] <train_concap(_wiki).py flags>

runs `volta_ml.pretrain` (the real job, engine and CLI run function) on them. Every example is drawn from
(seed, epoch, index) only, as the real data sets are, so an interrupted run can be resumed exactly.
"""
from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

L, R = 12, 6        # text slots, regions (the global feature comes on top)


def _generator(*key: int) -> torch.Generator:
    seed = 0
    for part in key:
        seed = (seed * 1_000_003 + part + 17) % (2 ** 62)
    return torch.Generator().manual_seed(seed)


class GeneratedConcap(Dataset):
    """VOLTA's per-example fields: 15% of the caption tokens masked (80/10/10), 15% of the regions (90% zeroed),
    half the captions replaced (is_next 1) unless objective 2, detector outputs over 1601 / 400 classes."""

    def __init__(self, config, count: int, seed: int, objective: int, split_key: int, sleep: float = 0.0):
        self.config, self.count, self.seed, self.objective = config, count, seed, objective
        self.split_key, self.sleep, self.epoch = split_key, sleep, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        if self.sleep:
            time.sleep(self.sleep)
        c = self.config
        g = _generator(self.seed, self.split_key, self.epoch, index)
        vocab, dim = c.vocab_size, c.v_feature_size
        n = int(torch.randint(3, L - 2, (1,), generator=g))
        ids = torch.zeros(L, dtype=torch.long)
        ids[1:n + 1] = torch.randint(5, vocab, (n,), generator=g)
        mask = torch.zeros(L, dtype=torch.long)
        mask[:n + 2] = 1
        lm = torch.full((L,), -1)
        picked = torch.rand(n, generator=g) < 0.15
        lm[1:n + 1][picked] = ids[1:n + 1][picked]
        ids[1:n + 1][picked] = 4
        is_next = int(self.objective != 2 and float(torch.rand(1, generator=g)) > 0.5)
        feat = torch.rand(R, dim, generator=g)
        label = torch.where(torch.rand(R, generator=g) < 0.15, 1, -1)
        feat[(label == 1) & (torch.rand(R, generator=g) < 0.9)] = 0.0
        glob = getattr(c, "add_global_imgfeat", None)
        loc = torch.rand(R, c.num_locs, generator=g)
        if glob in ("first", "last"):
            g_feat, g_loc = feat.mean(0, keepdim=True), torch.ones(1, c.num_locs)
            feat = torch.cat([g_feat, feat]) if glob == "first" else torch.cat([feat, g_feat])
            loc = torch.cat([g_loc, loc]) if glob == "first" else torch.cat([loc, g_loc])
        image_mask = torch.ones(feat.shape[0], dtype=torch.long)
        image_cls = torch.softmax(torch.randn(R, 1601, generator=g), -1)
        return (ids, mask, torch.zeros_like(ids), lm, torch.tensor(is_next), feat, loc, image_cls,
                torch.randint(0, 1600, (R,), generator=g), torch.rand(R, generator=g),
                torch.randint(0, 400, (R,), generator=g), torch.rand(R, generator=g), torch.rand(R, 401, generator=g),
                label, image_mask, str(index))

    @staticmethod
    def collate_fn(examples):
        fields = list(zip(*examples))
        return tuple(torch.stack(f) for f in fields[:-1]) + (list(fields[-1]),)


def generated_sets(args, tokenizer, config, info, examples: int = 24, sleep: float = 0.0):
    return (GeneratedConcap(config, examples, args.seed, args.objective, 0, sleep),
            GeneratedConcap(config, max(4, examples // 3), args.seed, args.objective, 1))


class GeneratedWiki:
    def __init__(self, args, tokenizer, config, info):
        self.config, self.seed, self.rank = config, args.seed, info.rank
        self.per_step = args.train_m_batch_size // args.grad_acc_steps // info.world_size

    def batch(self, index: int):
        c, g = self.config, _generator(self.seed, 99, self.rank, index)
        ids = torch.randint(5, c.vocab_size, (self.per_step, L), generator=g)
        lm = torch.where(torch.rand(self.per_step, L, generator=g) < 0.15, ids, torch.full_like(ids, -1))
        slots = R + int(getattr(c, "add_global_imgfeat", None) in ("first", "last"))
        return (ids, torch.ones_like(ids), torch.zeros_like(ids), lm, torch.zeros(self.per_step, slots, c.v_feature_size),
                torch.zeros(self.per_step, slots, c.num_locs), torch.zeros(self.per_step, slots, dtype=torch.long))

    def describe(self) -> str:
        return f"{self.per_step} generated sentences per micro-batch"


def run(argv: list[str], wiki: bool = False, examples: int = 24, sleep: float = 0.0) -> int:
    from volta_ml.cli.train_task import run as run_job
    from volta_ml.pretrain.cli import parse_args
    from volta_ml.pretrain.job import build_pretrain_job

    args = parse_args(argv, wiki=wiki)
    job = functools.partial(build_pretrain_job, wiki_batches=GeneratedWiki,
                            datasets=functools.partial(generated_sets, examples=examples, sleep=sleep))
    return run_job(args, job, "train_concap_wiki.py" if wiki else "train_concap.py")


def main() -> int:
    argv = sys.argv[1:]
    wiki = "--wiki" in argv
    argv = [a for a in argv if a != "--wiki"]
    options = {}
    for name in ("--examples", "--sleep"):
        if name in argv:
            i = argv.index(name)
            options[name[2:]] = float(argv[i + 1])
            del argv[i:i + 2]
    return run(argv, wiki, int(options.get("examples", 24)), options.get("sleep", 0.0))


if __name__ == "__main__":
    sys.exit(main())
