"""The transfer protocols as cells of train/eval commands, with IGLUE's settings.

Stages, in dependency order:
- pretrain:        `volta-ml pretrain` (train_concap.py) for models with `pretrain`; its last epoch's weights
                   are the `pretrained` checkpoint of the stages below;
- finetune:        English fine-tuning from `pretrained` (only for models without a `finetuned` checkpoint);
- zero_shot:       the English checkpoint on each target-language test file (plus English itself);
- translate_test:  the English checkpoint on the machine-translated (`_mt`) test files;
- few_shot_train:  from the English checkpoint, one run per (language, shots, learning rate, seed);
- few_shot_test:   picks the learning rate on the dev score (ties to the earlier rate), then tests it;
- translate_train: fine-tuning on machine-translated training data, then translate_train_test.

Each cell is a list of argv commands; the grid's `commands` give the entry-point prefixes (volta-ml's by
default, `python train_task.py` style works too) and `extra_flags` are appended, so any IGLUE default can
be overridden (argparse keeps the last value of a repeated flag).
"""
from __future__ import annotations

from pathlib import Path

from .cell import PRETRAINED, Cell, Command
from .cvqa import cvqa_cells
from .errors import GridError
from .grid import Grid, ModelSpec
from .hf_cells import (EXPORT, FINE_TUNED, HF_FEW_SHOT_FILES, engine_name, has_english, hf_argv, hf_tasks,
                       hf_train_argv)
from .iglue import ADAM_FLAGS, TASKS, TaskSpec, finetune_grad_acc, model_extra_flags
from .suite import suite_cells

STAGES = ("pretrain", "finetune", "zero_shot", "translate_test", "few_shot_train", "few_shot_test", "translate_train",
          "translate_train_test", "cvqa", "suite")


class Planner:
    def __init__(self, grid: Grid):
        self.grid = grid
        self.cells: dict[str, Cell] = {}

    # --- helpers -------------------------------------------------------------------------
    def spec(self, task: str, model: ModelSpec | None = None) -> TaskSpec:
        """IGLUE's settings of a task with the grid's `paths` overrides (and, for an HF model, the files it
        reads where the zoo reads preprocessed ones)."""
        overrides = dict(HF_FEW_SHOT_FILES.get(task, {}) if model and model.hf else {}, **self.grid.paths.get(task, {}))
        if not overrides:
            return TASKS[task]
        from dataclasses import replace
        return replace(TASKS[task], **overrides)

    def data(self, template: str | None, **fmt) -> str | None:
        if template is None:
            return None
        return str(self.grid.data_root / template.format(**fmt))

    def cell_dir(self, cell_id: str) -> Path:
        return self.grid.output_dir / cell_id

    def model_flags(self, model: ModelSpec) -> list[str]:
        flags = ["--config_file", model.config]
        if model.bert_model:
            flags += ["--bert_model", model.bert_model]
        if model.do_lower_case:
            flags.append("--do_lower_case")
        if model.is_m3p:
            flags.append("--is_m3p")
        if self.grid.pass_data_root:
            flags += ["--data_root", str(self.grid.data_root)]
        return flags

    def add(self, cell: Cell) -> Cell:
        cell.dir = str(self.cell_dir(cell.id))
        self.cells[cell.id] = cell
        return cell

    def record(self, cell_dir: Path) -> Command:
        log = str(cell_dir / "record.log")
        return Command(self.grid.step() + ["record", str(cell_dir)], log, log)

    # --- checkpoints ---------------------------------------------------------------------
    def pretrain_cell(self, model: ModelSpec) -> Cell:
        cell_id = f"pretrain/{model.name}"
        if cell_id in self.cells:
            return self.cells[cell_id]
        spec, d = model.pretrain, self.cell_dir(cell_id)
        log = str(d / "train.log")
        argv = self.grid.commands["pretrain"] + ["--config_file", model.config]
        if model.bert_model:
            argv += ["--bert_model", model.bert_model]
        if model.do_lower_case:
            argv.append("--do_lower_case")
        if "from_pretrained" in spec:
            argv += ["--from_pretrained", spec["from_pretrained"]]
        argv += ["--annotations_path", spec["annotations_path"], "--features_path", spec["features_path"],
                 "--num_train_epochs", str(spec["num_train_epochs"]), "--output_dir", str(d / "ckpt"),
                 "--logdir", str(d / "tb")] + list(spec["flags"]) + self.grid.extra_flags.get("pretrain", [])
        last = f"pytorch_model_{int(spec['num_train_epochs']) - 1}.bin"     # VOLTA runs int(N) epochs
        return self.add(Cell(id=cell_id, stage="pretrain", protocol="pretrain", model=model.name, task="concap",
                             scorer="pretrain", commands=[Command(argv, log, log), self.record(d)], logs=[log],
                             extra={"best": last}))

    def pretrained_checkpoint(self, model: ModelSpec) -> tuple[str | None, list[str]]:
        """(the checkpoint fine-tuning starts from, cell ids it depends on): the sweep's own pretraining, if any."""
        if model.pretrain:
            cell = self.pretrain_cell(model)
            return str(Path(cell.dir) / PRETRAINED), [cell.id]
        return model.pretrained, []

    def english_checkpoint(self, model: ModelSpec, task: str, seed: int,
                           as_published: bool = False) -> tuple[str, list[str], bool]:
        """(checkpoint path, cell ids it depends on, whether it varies with the seed). A Hugging Face model is
        evaluated as published unless it has `hf.train` (then: its English fine-tuning's export)."""
        if model.hf and (as_published or not model.hf["train"]):
            return model.hf["model"], [], False
        if model.hf:
            cell = self.finetune_cell(model, task, seed)
            return str(Path(cell.dir) / EXPORT), [cell.id], True
        if task in model.finetuned:
            spec = self.spec(task)
            cfg = Path(model.config).stem
            path = model.finetuned[task].format(task=task, model=model.name, name=spec.train_name, cfg=cfg,
                                                checkpoint_root=self.grid.checkpoint_root)
            return path, [], False
        cell = self.finetune_cell(model, task, seed)
        return str(Path(cell.dir) / "pytorch_model_best.bin"), [cell.id], True

    def finetune_cell(self, model: ModelSpec, task: str, seed: int) -> Cell:
        cell_id = f"finetune/{model.name}/{task}/seed{seed}"
        if cell_id in self.cells:
            return self.cells[cell_id]
        spec = self.spec(task)
        d = self.cell_dir(cell_id)
        log = str(d / "train.log")
        if model.hf:
            argv = hf_train_argv(self.grid, model, task, None, [], seed, d, "finetune")
            return self.add(Cell(id=cell_id, stage="finetune", protocol="finetune", model=model.name, task=task,
                                 seed=seed, scorer="train", commands=[Command(argv, log, log), self.record(d)],
                                 logs=[log], extra={"best": EXPORT}))
        pretrained, deps = self.pretrained_checkpoint(model)
        argv = (self.grid.commands["train"] + self.model_flags(model) +
                ["--from_pretrained", pretrained,
                 "--tasks_config_file", self.grid.task_configs_file("trainval", model), "--task", spec.task_id,
                 "--gradient_accumulation_steps", str(finetune_grad_acc(task, model.name)), "--seed", str(seed)]
                + list(spec.finetune_extra) + model_extra_flags(task, model.name, "train") + ADAM_FLAGS
                + ["--output_dir", str(d / "ckpt"), "--logdir", str(d / "tb")]
                + self.grid.extra_flags.get("train", []) + self.grid.extra_flags.get("finetune", []))
        return self.add(Cell(id=cell_id, stage="finetune", protocol="finetune", model=model.name, task=task,
                             seed=seed, scorer="train", commands=[Command(argv, log, log), self.record(d)],
                             logs=[log], depends_on=deps))

    # --- evaluation ----------------------------------------------------------------------
    def eval_cell(self, stage: str, model: ModelSpec, task: str, lang: str, checkpoint: str, deps: list[str],
                  cell_id: str, mt: bool, protocol: str, seed: int | None, extra: dict | None = None,
                  pre: list[Command] | None = None) -> Cell:
        spec = self.spec(task)
        d = self.cell_dir(cell_id)
        out, err = str(d / "test.out"), str(d / "test.err")
        fmt = {"lang": lang, "feat": model.features}
        if lang == "en" and spec.english_test is not None:
            ann = self.data(spec.english_test.get("file"), **fmt)
            split = spec.english_test.get("split")
            feats = self.data(spec.english_test.get("features"), **fmt)
        elif mt:
            ann, split = self.data(spec.mt_file, **fmt), spec.mt_split.format(**fmt)
            feats = self.data(spec.test_features, **fmt)
        else:
            ann, split = self.data(spec.test_file, **fmt), spec.test_split.format(**fmt)
            feats = self.data(spec.test_features, **fmt)
        kind = "eval_retrieval" if spec.scorer == "retrieval" else "eval"
        if model.hf:
            tuned = checkpoint if checkpoint != model.hf["model"] else None     # a training cell's export
            argv = hf_argv(self.grid, model, task, lang, mt, d, tuned)
            extra = dict(extra or {}, hf=model.hf, engine=engine_name(model.hf),
                         **({"variant": FINE_TUNED, "checkpoint": tuned} if tuned else {}))
            return self.add(Cell(id=cell_id, stage=stage, protocol=protocol, model=model.name, task=task, lang=lang,
                                 seed=seed, scorer="iglue_hf", depends_on=deps, logs=[out, err], extra=extra,
                                 commands=list(pre or []) + [Command(argv, out, err), self.record(d)]))
        argv = (self.grid.commands[kind] + self.model_flags(model) + ["--from_pretrained", checkpoint] +
                ["--tasks_config_file", self.grid.task_configs_file("test", model), "--task", spec.task_id])
        if split:
            argv += ["--split", split]
        if ann:
            argv += ["--val_annotations_jsonpath", ann]
        if feats:
            argv += ["--val_features_lmdbpath", feats]
        if spec.scorer == "retrieval":
            argv += ["--batch_size", "1", "--caps_per_image", "1"]
        argv += model_extra_flags(task, model.name, "eval") + ["--output_dir", str(d / "eval")]
        argv += self.grid.extra_flags.get(kind, [])
        commands = list(pre or []) + [Command(argv, out, err)]
        if spec.scorer == "gqa":
            result_json = str(d / "eval" / f"{Path(checkpoint).name}-" / f"{split}_result.json")
            commands.append(Command(self.grid.commands["gqa_score"] + ["--preds_file", result_json,
                                                                      "--truth_file", ann]
                                    + self.grid.extra_flags.get("gqa_score", []), out, err))
        commands.append(self.record(d))
        return self.add(Cell(id=cell_id, stage=stage, protocol=protocol, model=model.name, task=task, lang=lang,
                             seed=seed, scorer=spec.scorer, commands=commands, depends_on=deps,
                             logs=[out, err], extra=dict(extra or {}, checkpoint=checkpoint)))

    def transfer_cells(self, model: ModelSpec, task: str, mt: bool) -> None:
        if model.hf and model.hf["train"]:    # the HF model as published: its zero-shot row beside the fine-tuned one
            self.transfer_cells_from(model, task, mt, as_published=True)
        self.transfer_cells_from(model, task, mt)

    def transfer_cells_from(self, model: ModelSpec, task: str, mt: bool, as_published: bool = False) -> None:
        stage = "translate_test" if mt else "zero_shot"
        langs = list(self.grid.languages[task])
        if self.grid.include_english and (not model.hf or has_english(task)):
            langs = ["en"] + [l for l in langs if l != "en"]
        for seed in self.grid.seeds:
            checkpoint, deps, per_seed = self.english_checkpoint(model, task, seed, as_published)
            for lang in langs:
                if mt and lang == "en":
                    continue          # the English row of a translate-test table is the zero-shot English test
                suffix = f"/seed{seed}" if per_seed else ""
                self.eval_cell(stage, model, task, lang, checkpoint, deps, f"{stage}/{model.name}/{task}/{lang}{suffix}",
                               mt=mt, protocol=stage, seed=seed if per_seed else None)
            if not per_seed:
                break

    # --- few-shot ------------------------------------------------------------------------
    def few_shot_cells(self, model: ModelSpec, task: str) -> None:
        spec = self.spec(task, model)
        best = EXPORT if model.hf else "pytorch_model_best.bin"
        if not spec.few_shot_train_file:
            raise GridError(f"{self.grid.path}: task '{task}' has no few-shot protocol in IGLUE")
        for seed in self.grid.seeds:
            start, deps, _ = self.english_checkpoint(model, task, seed)
            for lang in self.grid.few_shot_languages[task]:
                for shot in self.grid.shots[task]:
                    base = f"{model.name}/{task}/{lang}/{shot}/seed{seed}"
                    trains = [self.few_shot_train_cell(model, task, lang, shot, lr, seed, start, deps, base)
                              for lr in self.grid.learning_rates]
                    test_id = f"few_shot_test/{base}"
                    d = self.cell_dir(test_id)
                    selected = d / "selected" / best
                    log = str(d / "select.log")
                    select = Command(self.grid.step() + ["select", str(d)], log, log)
                    cell = self.eval_cell("few_shot_test", model, task, lang, str(selected), [c.id for c in trains],
                                          test_id, mt=False, protocol="few_shot", seed=seed, pre=[select],
                                          extra={"train_cells": [c.dir for c in trains], "best": best,
                                                 "learning_rates": list(self.grid.learning_rates)})
                    cell.shot = shot
                    cell.logs.append(log)

    def few_shot_train_cell(self, model, task, lang, shot, lr, seed, start, deps, base) -> Cell:
        spec = self.spec(task, model)
        cell_id = f"few_shot_train/{base}/lr{lr}"
        d = self.cell_dir(cell_id)
        fmt = {"lang": lang, "shot": shot, "feat": model.features}
        log = str(d / "train.log")
        if model.hf:      # IGLUE's files, rates, epochs and batch schedule; the HF model's own validation
            settings = ["--train_annotations_jsonpath", self.data(spec.few_shot_train_file, **fmt),
                        "--num_epoch", str(self.grid.num_epoch), "--optim_train_epochs", str(self.grid.num_epoch),
                        "--lr", lr, *spec.schedule(shot).flags(False), "--num_workers", "0", "--hf_lang", lang]
            if spec.few_shot_val_file:
                settings += ["--val_annotations_jsonpath", self.data(spec.few_shot_val_file, **fmt)]
            argv = hf_train_argv(self.grid, model, task, start, settings, seed, d, "few_shot_train")
            return self.add(Cell(id=cell_id, stage="few_shot_train", protocol="few_shot_train", model=model.name,
                                 task=task, lang=lang, shot=shot, lr=lr, seed=seed, scorer="train", logs=[log],
                                 commands=[Command(argv, log, log), self.record(d)], depends_on=list(deps),
                                 extra={"best": EXPORT}))
        argv = (self.grid.commands["train"] + self.model_flags(model) + ["--from_pretrained", start] +
                ["--tasks_config_file", self.grid.task_configs_file("fewshot", model), "--task", spec.task_id,
                 "--num_epoch", str(self.grid.num_epoch), "--optim_train_epochs", str(self.grid.num_epoch),
                 "--train_split", spec.few_shot_train_split.format(**fmt),
                 "--train_annotations_jsonpath", self.data(spec.few_shot_train_file, **fmt)])
        if spec.few_shot_train_features:
            argv += ["--train_features_lmdbpath", self.data(spec.few_shot_train_features, **fmt)]
        if spec.few_shot_val_split:
            argv += ["--val_split", spec.few_shot_val_split.format(**fmt)]
        if spec.few_shot_val_file:
            argv += ["--val_annotations_jsonpath", self.data(spec.few_shot_val_file, **fmt)]
        argv += ["--lr", lr] + spec.schedule(shot).flags(model.is_m3p)
        argv += ["--num_workers", "0", "--save_every_num_epochs", "5", "--seed", str(seed)]
        argv += list(spec.few_shot_eval_flags_m3p if model.is_m3p and spec.few_shot_eval_flags_m3p
                     else spec.few_shot_eval_flags)
        argv += model_extra_flags(task, model.name, "train") + ADAM_FLAGS
        argv += ["--output_dir", str(d / "ckpt"), "--logdir", str(d / "tb")]
        argv += self.grid.extra_flags.get("train", []) + self.grid.extra_flags.get("few_shot_train", [])
        return self.add(Cell(id=cell_id, stage="few_shot_train", protocol="few_shot_train", model=model.name,
                             task=task, lang=lang, shot=shot, lr=lr, seed=seed, scorer="train",
                             commands=[Command(argv, log, log), self.record(d)], depends_on=list(deps), logs=[log]))

    # --- translate-train -----------------------------------------------------------------
    def translate_train_cells(self, model: ModelSpec, task: str) -> None:
        spec = self.spec(task)
        if not spec.translate_train_file:
            raise GridError(f"{self.grid.path}: task '{task}' has no translate-train data in IGLUE")
        pretrained, deps = self.pretrained_checkpoint(model)
        if not pretrained:
            raise GridError(f"{self.grid.path}: models.{model.name}: translate-train starts from the pretrained "
                             f"checkpoint; set 'pretrained' (or 'pretrain')")
        langs = [l for l in self.grid.languages[task] if l in spec.translate_train_languages] or \
            list(spec.translate_train_languages)
        for seed in self.grid.seeds:
            for lang in langs:
                cell_id = f"translate_train/{model.name}/{task}/{lang}/seed{seed}"
                d = self.cell_dir(cell_id)
                argv = (self.grid.commands["train"] + self.model_flags(model) +
                        ["--from_pretrained", pretrained,
                         "--tasks_config_file", self.grid.task_configs_file("trainval", model),
                         "--task", spec.task_id, "--gradient_accumulation_steps", "4", "--seed", str(seed),
                         "--train_annotations_jsonpath", self.data(spec.translate_train_file, lang=lang)]
                        + model_extra_flags(task, model.name, "train") + ADAM_FLAGS
                        + ["--output_dir", str(d / "ckpt"), "--logdir", str(d / "tb")]
                        + self.grid.extra_flags.get("train", []) + self.grid.extra_flags.get("translate_train", []))
                log = str(d / "train.log")
                train = self.add(Cell(id=cell_id, stage="translate_train", protocol="translate_train_train",
                                      model=model.name, task=task, lang=lang, seed=seed, scorer="train",
                                      commands=[Command(argv, log, log), self.record(d)], logs=[log],
                                      depends_on=list(deps)))
                self.eval_cell("translate_train_test", model, task, lang, str(d / "pytorch_model_best.bin"),
                               [train.id], f"translate_train_test/{model.name}/{task}/{lang}/seed{seed}",
                               mt=False, protocol="translate_train", seed=seed)

    # --- all -----------------------------------------------------------------------------
    def plan(self) -> list[Cell]:
        for model in self.grid.models.values():
            if model.pretrain:
                self.pretrain_cell(model)
            for task in hf_tasks(model, self.grid) if model.hf else self.grid.tasks:
                if "zero_shot" in self.grid.protocols:
                    self.transfer_cells(model, task, mt=False)
                if "translate_test" in self.grid.protocols:
                    self.transfer_cells(model, task, mt=True)
                if "few_shot" in self.grid.protocols:
                    self.few_shot_cells(model, task)
                if "translate_train" in self.grid.protocols:
                    self.translate_train_cells(model, task)
        if self.grid.cvqa:
            cvqa_cells(self)
        if self.grid.suite:
            suite_cells(self)
        order = {s: i for i, s in enumerate(STAGES)}
        return sorted(self.cells.values(), key=lambda c: order[c.stage])   # stable: grid order within a stage


def plan_cells(grid: Grid) -> list[Cell]:
    return Planner(grid).plan()


def cells_by_stage(cells: list[Cell]) -> dict[str, list[Cell]]:
    out: dict[str, list[Cell]] = {}
    for cell in cells:
        out.setdefault(cell.stage, []).append(cell)
    return out
