"""Build the training job of train_task.py from its flags: task config, model, tokenizer, datasets.

Value precedence is IGLUE-VOLTA's: a flag wins over the task config entry (`batch_size`, `lr`,
`num_epoch`, `train_split`, `val_split`, `loss`, annotation paths); the validation batch falls
back from `--eval_batch_size` to the config `eval_batch_size` to the per-step training batch.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

from volta_ml.engine.distributed import DistInfo, barrier
from volta_ml.engine.run_setup import task_setup
from volta_ml.engine.train import TrainJob

logger = logging.getLogger("volta_ml.train")


def config_label(config_file: str) -> str:
    """The `<cfg>` of the run directory name.

    VOLTA takes `config_file.split("/")[1]` without its extension, which is the file name for the
    usual `config/<cfg>.json` and a directory name for any other depth (`/abs/x.json` -> `abs`,
    and no slash -> IndexError). volta-ml keeps VOLTA's value for `dir/name.json` and uses the
    file name otherwise (a fix: nothing downstream can rely on the broken forms).
    """
    parts = config_file.split("/")
    name = parts[1] if len(parts) == 2 else Path(config_file).name
    return name.split(".")[0]


def run_name(task_name: str, config_file: str, save_name: str) -> str:
    return f"{task_name}_{config_label(config_file)}" + (f"-{save_name}" if save_name else "")


def resolve_hyperparameters(args, entry: dict, world_size: int) -> None:
    """Fill the flags left unset from the task config entry, in place."""
    def pick(flag_value, key):
        if flag_value not in (None, ""):
            return flag_value
        if key not in entry:
            raise KeyError(f"{entry.get('_source', 'task config')}: {entry.get('name')} has no {key!r} and the "
                           f"matching flag was not given")
        return entry[key]

    args.batch_size = int(pick(args.batch_size, "batch_size"))
    args.lr = float(pick(args.lr, "lr"))
    args.num_epoch = int(pick(args.num_epoch, "num_epoch"))
    args.train_split = pick(args.train_split, "train_split")
    args.val_split = pick(args.val_split, "val_split")
    if not args.eval_batch_size:
        per_step = max(1, args.batch_size // args.grad_acc_steps // world_size)
        args.eval_batch_size = int(entry.get("eval_batch_size") or per_step)


def build_task_job(args, info: DistInfo) -> TrainJob:
    from volta_ml.tasks.config import entry_path
    from volta_ml.tasks.regions import features_path

    setup = task_setup(args)
    entry, family, model_config = setup.entry, setup.family, setup.model.config
    resolve_hyperparameters(args, entry, info.world_size)
    if entry.get("embed_clf"):
        logger.warning("%s: embed_clf (VL-BERT answer-embedding initialisation) is not supported; the head "
                       "keeps its random initialisation", entry["name"])

    train_features = features_path(entry, "train", args.train_features_lmdbpath)
    val_features = features_path(entry, "val")
    train_view = setup.region_view(train_features)
    val_view = train_view if val_features == train_features else setup.region_view(val_features)
    train_set = family.build_dataset(entry, args.train_split, setup.model.tokenizer, train_view,
                                     token_cache=setup.token_cache,
                                     annotation_path=entry_path(entry, "train_annotations_jsonpath",
                                                                args.train_annotations_jsonpath), seed=args.seed)
    val_set = family.build_dataset(entry, args.val_split, setup.model.tokenizer, val_view,
                                   token_cache=setup.token_cache,
                                   annotation_path=entry_path(entry, "val_annotations_jsonpath",
                                                              args.val_annotations_jsonpath), seed=args.seed)

    # as VOLTA: tensors missing from the checkpoint are only logged; a new task head is expected to be missing
    model, report = setup.load_model(args.from_pretrained, head_expected=False, log=logger)
    missing = list(report.missing_keys)
    task_id = setup.task_id
    bert_model, do_lower_case = setup.model.bert_model, setup.model.do_lower_case

    name = run_name(entry["name"], args.config_file, args.save_name)
    run_dir = Path(args.output_dir) / name
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "command.txt").write_text(f"{args!r}\n\n{model_config!r}\n", encoding="utf-8")
    barrier(info)
    label = entry["name"].replace("+", "plus")
    return TrainJob(
        model=model, train_dataset=train_set, val_dataset=val_set,
        forward_and_loss=functools.partial(_forward_and_loss, family.forward_and_loss,
                                           loss_name=args.loss or entry.get("loss")),
        task_id=task_id, task_name=label, run_dir=run_dir, tb_dir=Path(args.logdir) / name,
        collate_fn=getattr(train_set, "collate_fn", None),
        fixed_layers=list(getattr(model_config, "fixed_layers", None) or []),
        summary={"tokenizer": f"{bert_model} (do_lower_case={do_lower_case})",
                 "splits": f"train {args.train_split!r}, val {args.val_split!r}",
                 "features": f"train {train_features}, val {val_features}",
                 "init": f"{args.from_pretrained} ({len(missing)} tensors not in it)"},
        origin={"model config": args.config_file, "task": f"{task_id} {entry['name']}"},
    )


def _forward_and_loss(family_forward, model, batch, task_id, loss_name=None):
    return family_forward(model, batch, task_id, loss_name)
