"""The training job of train_concap.py / train_concap_wiki.py on the engine (`volta_ml.engine.train`).

`build_pretrain_job(args, info)` turns the normalised flags (`volta_ml.pretrain.cli`) into an engine `TrainJob`:
the pretraining model (`build_model(kind="pretraining")`, VOLTA's `bert.*` + `cls.*` keys) initialised from a
text checkpoint, the Conceptual Captions data (`volta_ml.pretrain.data`), `forward_and_loss` with VOLTA's three
losses (`volta_ml.pretrain.losses`), VOLTA's optimizer groups and, for the wiki script, the interleaved
Wikipedia MLM step. Run directory `<output_dir>/<cfg>` and TensorBoard `<logdir>/<cfg>`, as VOLTA names them.
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from torch import nn

from volta_ml.engine.distributed import DistInfo, barrier
from volta_ml.engine.failures import UsageError
from volta_ml.engine.optim import NO_DECAY_MARKERS
from volta_ml.engine.preflight import check_text_fits
from volta_ml.engine.run_setup import model_setup, token_cache
from volta_ml.engine.task_job import config_label
from volta_ml.engine.train import Interleaved, TrainJob, per_step_batch_size
from volta_ml.models import build_model, load_checkpoint, read_state_dict
from volta_ml.pretrain.data import check_objective
from volta_ml.pretrain.losses import VISUAL_CRITERIA, active_targets, concap_losses, wiki_loss
from volta_ml.pretrain.masking import OBJECTIVES

logger = logging.getLogger("volta_ml.pretrain")

# (log label, TensorBoard key) of the three losses, as VOLTA's tbLogger names them
LOSS_PARTS = (("masked_t", "masked_loss_t"), ("masked_v", "masked_loss_v"), ("NSP", "next_sentence_loss"))
TOKEN_TYPES = "bert.embeddings.token_type_embeddings.weight"


def forward_and_loss(model, batch, task_id, *, config, objective: int):
    """The engine's contract: (loss, per-example sums of (masked_t, masked_v, NSP), examples, no logits)."""
    masked_t, masked_v, matching = concap_losses(model, batch, config, objective)
    n = batch[0].shape[0] if not isinstance(batch, dict) else batch["input_ids"].shape[0]
    parts = torch.stack([masked_t.detach(), masked_v.detach(), matching.detach()]).double() * n
    return masked_t + masked_v + matching, parts, n, None


# ---- initialisation -------------------------------------------------------------------------------------------

def resolve_checkpoint(name: str, flag: str) -> Path:
    """A checkpoint file or folder on disk, or a hub id already in the local Hugging Face cache (never
    downloaded)."""
    if os.path.exists(name):
        return Path(name)
    try:
        from huggingface_hub import try_to_load_from_cache
        for filename in ("model.safetensors", "pytorch_model.bin"):
            found = try_to_load_from_cache(name, filename)
            if isinstance(found, str):
                return Path(found)
    except Exception:  # noqa: BLE001 - not a valid repo id, no cache: the message below says what to do
        pass
    raise UsageError(f"{flag} {name}: not a file or folder, and not in the local Hugging Face cache (volta-ml "
                     f"never downloads weights; pass the folder of a BERT checkpoint, or {flag} '' to start from "
                     f"random weights)")


def init_from_text_model(model: nn.Module, path: Path) -> set[int]:
    """Load a text-only BERT / XLM-R checkpoint (Hugging Face names, or a VOLTA checkpoint) into the pretraining
    model as VOLTA's `from_pretrained(..., from_hf=True)` does, the token-type table resized as train_concap.py
    resizes it (the checkpoint's rows copied, further rows kept at their initialisation). Returns the ids of the
    `bert.*` tensors the checkpoint initialised."""
    state = read_state_dict(path)
    table = model.state_dict().get(TOKEN_TYPES)      # UC2 names its table differently: nothing to resize
    for key in [k for k in state if table is not None and k.endswith("embeddings.token_type_embeddings.weight")]:
        rows = state[key]
        if rows.dim() == 2 and rows.shape[1] == table.shape[1] and rows.shape[0] != table.shape[0]:
            resized = table.detach().clone()
            n = min(rows.shape[0], table.shape[0])
            resized[:n] = rows[:n]
            state[key] = resized
    report = load_checkpoint(model, state, from_hf=True)
    logger.info("initialised from %s: %d tensors (%d of the model's not in it)", path, len(report.loaded_keys),
                len(report.missing_keys))
    tensors = model.state_dict(keep_vars=True)
    return {id(tensors[k]) for k in report.loaded_keys if k.startswith("bert.")}


def load_vision_checkpoint(model: nn.Module, path: str, config) -> None:
    """`--x_pretrained`: tensors of a VOLTA checkpoint over the text initialisation, those whose name starts with
    an entry of the config's `v_layers` (every tensor the model has when the config lists none)."""
    state = read_state_dict(resolve_checkpoint(path, "--x_pretrained"))
    prefixes = tuple(getattr(config, "v_layers", None) or ())
    if prefixes:
        state = {k: v for k, v in state.items() if k.startswith(prefixes)}
    report = load_checkpoint(model, state)
    logger.info("--x_pretrained %s: %d tensors loaded", path, len(report.loaded_keys))


def pretrain_param_groups(model: nn.Module, lr: float, weight_decay: float, bert_tensors: set[int] | None,
                          bert_lr_scale: float) -> list[dict]:
    """VOLTA's groups: no weight decay for names containing bias / LayerNorm.bias / LayerNorm.weight; with a text
    initialisation, `bert_lr_scale` x lr for the tensors it provided (VOLTA: 0.1). Tensors of one (lr, decay)
    pair share a group (VOLTA makes one group per tensor: the same updates)."""
    groups: dict[tuple[float, float], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        rate = lr * bert_lr_scale if bert_tensors and id(param) in bert_tensors else lr
        decay = 0.0 if any(marker in name for marker in NO_DECAY_MARKERS) else weight_decay
        groups.setdefault((rate, decay), []).append(param)
    return [{"params": params, "lr": rate, "weight_decay": decay} for (rate, decay), params in groups.items()]


def _collate():
    from volta_ml.pretrain.data import collate_concap
    return collate_concap


# ---- the job ----------------------------------------------------------------------------------------------------

def build_model_from_flags(args, setup) -> tuple[nn.Module, set[int] | None]:
    config = setup.config
    if config.image_embeddings == "m3p":
        raise UsageError(f"{args.config_file}: M3P has no pretraining heads in VOLTA's port; pretrain a BERT-class "
                         f"config (ctrl_*, uc2_base, ...)")
    try:
        active_targets(config)
    except ValueError as error:
        raise UsageError(str(error)) from None
    wide = [k for k in active_targets(config) if VISUAL_CRITERIA[k].width == 2048 and
            "image_feat" in VISUAL_CRITERIA[k].needs]
    if wide and config.v_feature_size != 2048:
        raise UsageError(f"{args.config_file}: visual target {wide[0]} ({VISUAL_CRITERIA[wide[0]].name}) predicts "
                         f"2048-wide region features (as VOLTA), but v_feature_size is {config.v_feature_size}")
    model = build_model(config, kind="pretraining")
    check_text_fits(model, args.max_seq_length, args.config_file, "pretraining")
    bert_tensors = None
    if args.init_checkpoint:
        bert_tensors = init_from_text_model(model, resolve_checkpoint(args.init_checkpoint, args.init_flag))
    if getattr(args, "x_pretrained", ""):
        load_vision_checkpoint(model, args.x_pretrained, config)
    return model, bert_tensors


def concap_sets(args, tokenizer, config, info: DistInfo):
    """(train, validation) Conceptual Captions data sets of VOLTA's layout (`volta_ml.pretrain.data`).

    Under DDP the training records come from `training_feat_all.lmdb` through the sharded sampler (N processes
    then see what one process sees); only when that file is absent does each rank read its own
    `training_feat_part_<rank>.lmdb`, as VOLTA's distributed runs did, cut to the shortest part's length so every
    rank runs the same number of steps."""
    from volta_ml.pretrain.data import ConceptCapData, is_volta_layout

    rank = None
    folder = Path(args.features_path)
    if info.world_size > 1 and is_volta_layout(str(folder)) and not (folder / "training_feat_all.lmdb").exists():
        rank = info.rank
    common = dict(annotations_path=args.annotations_path, features_path=args.features_path, tokenizer=tokenizer,
                  seq_len=args.max_seq_length, objective=args.objective, num_locs=config.num_locs,
                  add_global_imgfeat=getattr(config, "add_global_imgfeat", None), seed=args.seed,
                  visual_target_weights=config.visual_target_weights, token_cache=token_cache(args),
                  feature_dim=config.v_feature_size, feature_dim_from=f"v_feature_size of {args.config_file}")
    train = ConceptCapData(split="train", rank=rank, **common)
    if rank is not None:
        shortest = all_reduce_min(len(train), info)
        train = RankPart(train, shortest)
    return train, ConceptCapData(split="val", **common)


def all_reduce_min(value: int, info: DistInfo) -> int:
    import torch.distributed as dist
    tensor = torch.tensor([value], dtype=torch.long, device=info.device)
    if info.initialized and info.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


class RankPart(torch.utils.data.Dataset):
    """The first `length` records of this rank's part file (the engine does not shard it again)."""
    rank_shard = True

    def __init__(self, dataset, length: int):
        self.dataset, self.length = dataset, length

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self.dataset[index]

    def __getitems__(self, indices):
        return self.dataset.__getitems__(indices)


class WikiBatches:
    """The Wikipedia MLM batches of train_concap_wiki.py (`volta_ml.pretrain.wiki`): batch i of this rank, the same
    for the same i."""

    def __init__(self, args, tokenizer, config, info: DistInfo):
        from volta_ml.pretrain.wiki import WikiData

        per_step = args.train_m_batch_size // args.grad_acc_steps // info.world_size
        if per_step < 1:
            raise UsageError(f"--train_m_batch_size {args.train_m_batch_size} is smaller than "
                             f"gradient_accumulation_steps ({args.grad_acc_steps}) x processes ({info.world_size})")
        self.per_step, self.langs = per_step, args.lgs
        self.data = WikiData(args.dataroot, args.lgs, args.lg_sampling_factor, tokenizer, batch_size=per_step,
                             max_seq_length=args.max_m_seq_length, seed=args.seed,
                             rank=info.rank if info.world_size > 1 else None, num_locs=config.num_locs,
                             add_global_imgfeat=getattr(config, "add_global_imgfeat", None),
                             feature_dim=config.v_feature_size)

    def batch(self, index: int):
        return self.data.sample(index)

    def describe(self) -> str:
        return f"{self.per_step} Wikipedia sentences ({self.langs}) per micro-batch, one optimizer step before each"


def build_pretrain_job(args, info: DistInfo, datasets=None, wiki_batches=None) -> TrainJob:
    """`datasets(args, tokenizer, config, info) -> (train, val)` and `wiki_batches(...)` replace the readers of
    VOLTA's files (tests: generated batches)."""
    objective = check_objective(args.objective)
    setup = model_setup(args.config_file, bert_model=args.bert_model, do_lower_case=args.do_lower_case)
    config, tokenizer = setup.config, setup.tokenizer
    model, bert_tensors = build_model_from_flags(args, setup)
    train_set, val_set = (datasets or concap_sets)(args, tokenizer, config, info)
    wiki = (wiki_batches or WikiBatches)(args, tokenizer, config, info) if args.wiki else None
    args.eval_batch_size = per_step_batch_size(args, info.world_size)      # VOLTA validates with the train batch

    label = config_label(args.config_file)
    run_dir = Path(args.output_dir) / label
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "command.txt").write_text(f"{args!r}\n\n\n{config!r}\n", encoding="utf-8")
    barrier(info)
    targets = ", ".join(f"{VISUAL_CRITERIA[k].name} x{w:g}" for k, w in active_targets(config).items()) or "none"
    return TrainJob(
        model=model, train_dataset=train_set, val_dataset=val_set,
        forward_and_loss=functools.partial(forward_and_loss, config=config, objective=objective),
        task_id="TASK00" if args.wiki else "TASK0",
        task_name="Conceptual_CaptionplusWikipedia" if args.wiki else "Conceptual_Caption",
        run_dir=run_dir, tb_dir=Path(args.logdir) / label,
        collate_fn=getattr(train_set, "collate_fn", None) or _collate(),
        fixed_layers=list(getattr(config, "fixed_layers", None) or []),
        loss_parts=LOSS_PARTS, rank_shard=bool(getattr(train_set, "rank_shard", False)),
        param_groups=functools.partial(pretrain_param_groups, lr=args.lr, weight_decay=args.weight_decay,
                                       bert_tensors=bert_tensors, bert_lr_scale=args.bert_lr_scale),
        interleaved=Interleaved(batch=wiki.batch, loss=wiki_loss) if wiki is not None else None,
        summary={"objective": f"{objective}: {OBJECTIVES[objective]}",
                 "visual":
                     f"{targets}; global image feature {getattr(config, 'add_global_imgfeat', None)}",
                 "init": (f"{args.init_checkpoint} (x{args.bert_lr_scale:g} lr for its {len(bert_tensors or ())} "
                          f"tensors)" if args.init_checkpoint else "random weights"),
                 "tokenizer": f"{setup.bert_model} (do_lower_case={setup.do_lower_case})",
                 **({"wiki": wiki.describe()} if wiki is not None else {})},
    )
