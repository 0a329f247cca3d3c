"""Pretraining step (train_concap.py) side by side with VOLTA's own BertForVLPreTraining step.

    python benchmarks/bench_pretrain.py [--configs ctrl_vilbert_base ctrl_xuniter_base] [--batch 8] [--steps 6]
                                        [--device cpu|cuda] [--amp none|bf16] [--threads 2]
                                        [--volta_src /tmp/volta_src]

One step = forward with the three losses (masked tokens, masked regions, image-text matching) + backward +
AdamW, on a Conceptual Captions-shaped batch: 38 text slots with ~15% of the caption tokens masked, 36 regions of
2048-d features plus the global slot, ~15% of the regions masked, detector class distributions over 1601 classes,
half the captions mismatched (objective 1, as the ctrl_* train.sh files). Randomly initialised weights at the
config's real size.

- volta-ml: `volta_ml.pretrain.job.forward_and_loss` (the heads run on the masked slots only) and `VoltaAdamW` over
  the pretraining parameter groups: what `train_concap.py` runs.
- VOLTA (with `--volta_src DIR`, a folder holding VOLTA's `volta/` package, e.g. from
  `git -C <volta checkout> archive HEAD volta | tar -x -C DIR`; pytorch-transformers 1.2.0 importable): its
  `BertForVLPreTraining` with the same weights (VOLTA's key names) and batch, train_concap.py's objective-1
  relabelling, and pytorch-transformers' `AdamW` over one group per tensor, as train_concap.py builds them. Nothing
  of VOLTA's is in this repository; the harness only calls it. The first step's losses of the two sides (eval mode,
  so no dropout) are printed as a parity check.

The sides alternate step by step (the same machine load for both); the table shows the median seconds of the
steps after the first (warm-up), split into forward / backward / optimizer.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TEXT, REGIONS = 38, 36


def make_batch(config, batch: int, seed: int = 0):
    """VOLTA's batch tuple (train_concap.py's order) with its masking statistics."""
    import torch
    g = torch.Generator().manual_seed(seed)
    B, L, R = batch, TEXT, REGIONS
    lengths = torch.randint(8, L - 2, (B,), generator=g)
    ids = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.long)
    lm = torch.full((B, L), -1)
    for b in range(B):
        n = int(lengths[b])
        ids[b, 1:n + 1] = torch.randint(min(1000, config.vocab_size // 2), config.vocab_size, (n,), generator=g)
        ids[b, 0], ids[b, n + 1] = 101 % config.vocab_size, 102 % config.vocab_size
        mask[b, :n + 2] = 1
        picked = torch.rand(n, generator=g) < 0.15
        picked[0] = True
        lm[b, 1:n + 1][picked] = ids[b, 1:n + 1][picked]
        ids[b, 1:n + 1][picked] = 103 % config.vocab_size
    is_next = (torch.rand(B, generator=g) < 0.5).long()
    label = torch.where(torch.rand(B, R, generator=g) < 0.15, 1, -1)
    label[:, 0] = 1
    feat = torch.rand(B, R, config.v_feature_size, generator=g)
    feat[label == 1] = 0.0
    glob = config.add_global_imgfeat in ("first", "last")
    feats = torch.cat([feat.mean(1, keepdim=True), feat], 1) if glob else feat
    loc = torch.rand(B, R + glob, config.num_locs, generator=g)
    image_mask = torch.ones(B, R + glob, dtype=torch.long)
    image_cls = torch.softmax(torch.randn(B, R, 1601, generator=g), -1)
    return (ids, mask, torch.zeros_like(ids), lm, is_next, feats, loc, image_cls,
            torch.randint(0, 1600, (B, R), generator=g), torch.rand(B, R, generator=g),
            torch.randint(0, 400, (B, R), generator=g), torch.rand(B, R, generator=g),
            torch.rand(B, R, 401, generator=g), label, image_mask)


class Ours:
    name = "volta-ml"

    def __init__(self, config, device, amp: str):
        import torch
        from volta_ml.engine.optim import VoltaAdamW
        from volta_ml.models import build_model
        from volta_ml.pretrain.job import pretrain_param_groups

        torch.manual_seed(0)
        self.config, self.amp, self.device = config, amp, device
        self.model = build_model(config, kind="pretraining").to(device).train()
        self.optimizer = VoltaAdamW(pretrain_param_groups(self.model, 1e-4, 0.01, None, 0.1), lr=1e-4,
                                    betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, correct_bias=True)

    def state_dict(self):
        return self.model.state_dict()

    def losses(self, batch):
        from volta_ml.pretrain.losses import concap_losses
        return concap_losses(self.model, batch, self.config, objective=1)

    def forward(self, batch):
        import torch
        from volta_ml.pretrain.job import forward_and_loss
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.amp == "bf16"):
            return forward_and_loss(self.model, batch, "TASK0", config=self.config, objective=1)[0]

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class Volta:
    """VOLTA's model and optimizer as train_concap.py sets them up, imported from --volta_src."""
    name = "VOLTA"

    def __init__(self, config_path: str, state_dict, device, amp: str, bert_model: str):
        import torch
        from pytorch_transformers.optimization import AdamW
        from volta.config import BertConfig
        from volta.encoders import BertForVLPreTraining

        config = BertConfig.from_json_file(config_path)
        if not hasattr(config, "bert_model"):         # IGLUE-style configs name the text model elsewhere
            config.bert_model = bert_model
        if not hasattr(config, "model"):              # VOLTA's loader needs it (ctrl_uniter_base lacks it)
            config.model = "bert"
        self.model = BertForVLPreTraining(config)
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            raise SystemExit(f"VOLTA's model does not take volta-ml's keys: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        self.model.to(device).train()
        self.amp, self.device = amp, device
        no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
        groups = [{"params": [p], "lr": 1e-4, "weight_decay": 0.0 if any(nd in n for nd in no_decay) else 0.01}
                  for n, p in self.model.named_parameters() if p.requires_grad]
        self.optimizer = AdamW(groups, lr=1e-4, eps=1e-6, betas=(0.9, 0.999))

    def _call(self, batch):
        (ids, mask, seg, lm, is_match, feat, loc, cls, obj, objc, attr, attrc, attrs, label, image_mask) = batch
        if self.model.training:   # train_concap.py's objective-1 relabelling
            label = label * (is_match == 0).long().unsqueeze(1)
            label[label == 0] = -1
            lm = lm * (is_match == 0).long().unsqueeze(1)
            lm[lm == 0] = -1
        return self.model(ids, feat, loc, seg, mask, image_mask, lm, label, cls, obj, objc, attr, attrc, attrs,
                          is_match)

    def losses(self, batch):
        return [x.sum() for x in self._call(batch)]

    def forward(self, batch):
        import torch
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.amp == "bf16"):
            t, v, m = self._call(batch)
        return (t + v + m).sum()

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()


def timed_step(side, batch, sync) -> tuple[float, float, float]:
    sync()
    t0 = time.perf_counter()
    loss = side.forward(batch)
    sync()
    t1 = time.perf_counter()
    loss.backward()
    sync()
    t2 = time.perf_counter()
    side.step()
    sync()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def run_config(name: str, args) -> list[dict]:
    import torch
    from volta_ml.models import load_config

    config_path = REPO / "config_models" / f"{name}.json"
    config = load_config(str(config_path))
    device = args.device
    batch = tuple(t.to(device) for t in make_batch(config, args.batch))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sides = [Ours(config, device, args.amp)]
    if args.volta_src:
        bert_model = "roberta-base" if config.text_model == "roberta" else "bert-base-uncased"
        sides.append(Volta(str(config_path), sides[0].state_dict(), device, args.amp, bert_model))
        for side in sides:
            side.model.eval()
        with torch.no_grad():
            values = [[float(x) for x in side.losses(batch)] for side in sides]
        for side in sides:
            side.model.train()
        print(f"{name}: first-step losses (masked_t, masked_v, NSP) volta-ml {values[0]}, VOLTA {values[1]}",
              flush=True)
    times = {side.name: [] for side in sides}
    for _ in range(args.steps):
        for side in sides:
            times[side.name].append(timed_step(side, batch, sync))
    rows = []
    params = sum(p.numel() for p in sides[0].model.parameters())
    for side in sides:
        kept = times[side.name][1:] or times[side.name]
        parts = [statistics.median(t[i] for t in kept) for i in range(3)]
        step = statistics.median(sum(t) for t in kept)
        rows.append({"config": name, "side": side.name, "params_m": params / 1e6, "forward": parts[0],
                     "backward": parts[1], "optimizer": parts[2], "step": step, "samples_per_s": args.batch / step})
    volta = next((r["step"] for r in rows if r["side"] == "VOLTA"), None)
    for row in rows:
        row["vs_volta"] = volta / row["step"] if volta else None
    return rows


def measure(config_source, device: str, amp: str, batch: int, steps: int) -> dict:
    """volta-ml's pretraining step alone (gpu_check's `pretrain` row): median step seconds after the first,
    samples/s, peak device memory, and whether every loss was finite."""
    import math

    import torch
    from volta_ml.models import load_config

    config = load_config(config_source)
    ours = Ours(config, device, amp)
    data = tuple(t.to(device) for t in make_batch(config, batch))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, finite = [], True
    for _ in range(steps + 1):
        with torch.no_grad():
            finite &= all(math.isfinite(float(x)) for x in ours.losses(data))
        times.append(sum(timed_step(ours, data, sync)))
    step = statistics.median(times[1:])
    return {"step_s": step, "samples_per_s": batch / step, "finite": finite,
            "params_m": sum(p.numel() for p in ours.model.parameters()) / 1e6,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["ctrl_vilbert_base", "ctrl_uniter_base", "ctrl_xuniter_base"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", choices=["none", "bf16"], default="none", help="autocast on both sides")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--volta_src", default="", help="folder holding VOLTA's volta/ package (outside this repo)")
    args = parser.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.volta_src:
        sys.path.insert(0, str(Path(args.volta_src).resolve()))
    rows = []
    for name in args.configs:
        rows += run_config(name, args)
        print(rows[-1], flush=True)
    print(f"\nbatch {args.batch}, {args.device}, amp {args.amp}, {torch.get_num_threads()} threads; seconds per step, "
          f"median of steps 2-{args.steps}")
    print("| config | params | side | forward | backward | optimizer | step | samples/s | vs VOLTA |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['vs_volta']:.2f}x" if r["vs_volta"] else "-"
        print(f"| {r['config']} | {r['params_m']:.1f}M | {r['side']} | {r['forward']:.2f} | {r['backward']:.2f} | "
              f"{r['optimizer']:.2f} | {r['step']:.2f} | {r['samples_per_s']:.2f} | {ratio} |")
    return rows


if __name__ == "__main__":
    main()
