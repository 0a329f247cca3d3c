"""The run setup every entry point shares: train_task.py, eval_task.py, eval_retrieval.py and CVQA's model zoo.

One order, IGLUE-VOLTA's: task config -> data paths (`--data_root`, `--path_map`) -> model config -> the task's
`fusion_method` override -> tokenizer (command line first, then the model config's `bert_model` /
`do_lower_case` keys) -> RoBERTa text-embedding switch -> token cache -> region view -> model with its
checkpoint. The switch is VOLTA's: train_task.py and eval_task.py set `config.model = "roberta"` whenever the
tokenizer path contains "roberta" (e.g. `xlm-roberta-base`), which changes UNITER's position ids and image
token type; volta-ml does it in every entry point, so one set of flags always builds one model.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

from volta_ml.data import TokenCache, default_cache_dir, load_tokenizer
from volta_ml.data.text import VOLTA_DEFAULT_TOKENIZER
from volta_ml.engine.preflight import check_text_fits
from volta_ml.models import LoadReport, VLConfig, build_model, load_checkpoint, load_config
from volta_ml.tasks import TaskFamily, family_for
from volta_ml.tasks.config import PathResolver, get_task_entry, load_task_config
from volta_ml.tasks.regions import open_region_view

logger = logging.getLogger("volta_ml.setup")


@dataclass
class ModelSetup:
    """A model config with the tokenizer that goes with it."""
    config: VLConfig
    bert_model: str
    do_lower_case: bool
    tokenizer: object


@dataclass
class TaskSetup:
    """Everything an IGLUE entry point derives from its flags before it reads data."""
    task_config: dict
    task_id: str
    entry: dict               # the task's config entry, paths resolved
    family: TaskFamily        # the task family module (volta_ml.tasks.FAMILIES)
    model: ModelSetup
    token_cache: TokenCache
    config_file: str = ""     # --config_file, named in errors

    def region_view(self, features_path: str):
        return open_region_view(features_path, self.model.config, self.entry)

    def load_model(self, checkpoint: str, *, kind: str = "tasks", head_expected: bool = True,
                   log: logging.Logger = logger) -> tuple:
        task_config, task_ids = (self.task_config, [self.task_id]) if kind == "tasks" else (None, None)
        fits = functools.partial(check_text_fits, max_seq_length=self.entry.get("max_seq_length", 80),
                                 config_file=self.config_file, task=self.task_id)
        return load_model(self.model.config, checkpoint, task_config, task_ids, kind=kind,
                          head_expected=head_expected, log=log, check=fits)


def resolve_tokenizer_args(bert_model: str | None, do_lower_case: bool | None, config) -> tuple[str, bool]:
    """(`bert_model`, `do_lower_case`): the command line first, then the model config JSON (VOLTA-HEAD style)."""
    bert_model = bert_model or getattr(config, "bert_model", None) or VOLTA_DEFAULT_TOKENIZER
    if do_lower_case is None:
        do_lower_case = getattr(config, "do_lower_case", False)
    return bert_model, bool(do_lower_case)


def model_setup(config_file, *, bert_model: str | None = None, do_lower_case: bool | None = None,
                is_m3p: bool = False, fusion_method: str | None = None) -> ModelSetup:
    """Model config, fusion override, tokenizer and the RoBERTa switch (see the module docstring)."""
    config = load_config(config_file, is_m3p=is_m3p or None)
    if fusion_method:
        config.fusion_method = fusion_method
    bert_model, do_lower_case = resolve_tokenizer_args(bert_model, do_lower_case, config)
    if "roberta" in bert_model:
        config.model = "roberta"
    return ModelSetup(config, bert_model, do_lower_case, load_tokenizer(bert_model, do_lower_case))


def token_cache(args) -> TokenCache:
    return TokenCache(None if args.no_cache else (args.cache_dir or default_cache_dir()))


def task_setup(args) -> TaskSetup:
    """The setup of a VOLTA entry point from its flags (`--tasks_config_file`, `--task`, `--config_file`,
    `--bert_model`, `--do_lower_case`, `--is_m3p`, `--data_root`, `--path_map`, `--cache_dir`, `--no_cache`)."""
    task_config = load_task_config(args.tasks_config_file)
    task_id, entry = get_task_entry(task_config, args.task)
    entry = PathResolver(args.data_root, args.path_map).resolve_entry(entry)
    family = family_for(entry)
    model = model_setup(args.config_file, bert_model=args.bert_model, do_lower_case=args.do_lower_case,
                        is_m3p=args.is_m3p, fusion_method=entry.get("fusion_method"))
    return TaskSetup(task_config, task_id, entry, family, model, token_cache(args), str(args.config_file))


def load_model(config: VLConfig, checkpoint: str, task_config: dict | None = None, task_ids=None,
               kind: str = "tasks", head_expected: bool = True, log: logging.Logger = logger,
               check=None) -> tuple:
    """(model in eval mode, LoadReport): `volta_ml.models.from_pretrained` (VOLTA's: tensors missing from the
    checkpoint keep their initialisation) with the missing and unused tensors logged.

    `head_expected`: evaluation needs the task heads from the checkpoint, so a missing one is a warning;
    fine-tuning starts new heads (logged at info level). `check(model)` runs on the built model before the
    checkpoint is read (`preflight.check_text_fits`: a too-short position table is a usage error naming the
    config, not a shape mismatch in the checkpoint or an IndexError in the first forward)."""
    if not os.path.isfile(checkpoint):
        raise FileNotFoundError(f"--from_pretrained {checkpoint}: checkpoint not found (volta-ml never "
                                f"downloads weights)")
    model = build_model(config, task_config, task_ids, kind)
    if check is not None:
        check(model)
    report = load_checkpoint(model, checkpoint)
    model.eval()
    _log_report(report, checkpoint, task_ids or [], head_expected, log)
    return model, report


def _log_report(report: LoadReport, checkpoint: str, task_ids: list[str], head_expected: bool,
                log: logging.Logger) -> None:
    missing, unexpected = list(report.missing_keys), list(report.unexpected_keys)
    for task_id in task_ids if head_expected else []:
        if any(key.startswith(f"clfs_dict.{task_id}.") for key in missing):
            present = sorted({k.split(".")[1] for k in unexpected if k.startswith("clfs_dict.")})
            log.warning("the checkpoint has no %s head: it is randomly initialised, so scores are meaningless "
                        "(heads in the checkpoint: %s). Check --task.", task_id, ", ".join(present) or "none")
    if missing:
        log.info("weights not in %s: %d (e.g. %s)", checkpoint, len(missing), ", ".join(missing[:5]))
    if unexpected:
        log.info("checkpoint weights not used: %d (e.g. %s)", len(unexpected), ", ".join(unexpected[:5]))
