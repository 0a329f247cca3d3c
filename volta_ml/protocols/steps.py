"""Small steps that run inside a cell, between and after the train/eval commands.

    python -m volta_ml.protocols.steps record CELL_DIR    # read the cell's logs, write result.json
    python -m volta_ml.protocols.steps select CELL_DIR    # few-shot: pick the learning rate, link its checkpoint
    python -m volta_ml.protocols.steps is-done CELL_DIR   # exit 0 when the cell is finished

They are separate commands (not code inside the sweep runner) so that a Slurm job script holds the same
command list as a local run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .cell import PRETRAINED, RESULT_FILE, is_done, load_cell, read_result, write_json_atomic
from .results import LogError, best_validation, cell_items, iglue_hf_results, pretrain_validation, scorer_metrics


BEST = "pytorch_model_best.bin"   # a training run's best model; an HF model's cells name theirs (`best`: hf_best)


def link(target: Path, link_path: Path) -> None:
    """Point `link_path` at `target`, a file or a folder (a symlink; a hard link or copy where symlinks are not
    allowed)."""
    link_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = link_path.with_name(f".{link_path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(os.path.realpath(target), tmp)
    except OSError:
        import shutil
        if Path(target).is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(target, tmp)
            shutil.rmtree(link_path, ignore_errors=True)
        else:
            try:
                os.link(os.path.realpath(target), tmp)
            except OSError:
                shutil.copyfile(target, tmp)
    os.replace(tmp, link_path)


def find_best_checkpoint(ckpt_dir: Path, name: str = BEST) -> Path:
    """`<output_dir>/<Name>_<cfg>/<name>` of a train_task run (one run per output dir)."""
    found = sorted(Path(ckpt_dir).glob(f"*/{name}"))
    if len(found) != 1:
        raise LogError(f"{ckpt_dir}: expected one <run>/{name}, found {len(found)}")
    return found[0]


def record(cell_dir: Path) -> int:
    cell = load_cell(cell_dir)
    base = {k: getattr(cell, k) for k in ("id", "stage", "protocol", "model", "task", "lang", "shot", "lr", "seed")}
    try:
        if cell.scorer == "pretrain":      # the last epoch's weights are what fine-tuning starts from
            metrics = pretrain_validation(cell_dir / "train.log")
            last = find_best_checkpoint(cell_dir / "ckpt", cell.extra["best"])
            link(last, cell_dir / PRETRAINED)
            extra = {"metrics": metrics, "checkpoint": str(last)}
        elif cell.scorer == "train":
            score = best_validation(cell_dir / "train.log")
            name = cell.extra.get("best", BEST)
            best = find_best_checkpoint(cell_dir / "ckpt", name)
            link(best, cell_dir / name)
            extra = {"metrics": {"dev": score}, "checkpoint": str(best)}
        else:
            metrics = scorer_metrics(cell.scorer, cell_dir / "test.out", cell_dir / "test.err",
                                     first_validation=(cell.stage == "few_shot_test" and cell.task == "xvnli"))
            checkpoint = cell.extra.get("checkpoint")
            extra = {"metrics": metrics, "checkpoint": os.path.realpath(checkpoint) if checkpoint else None}
            if cell.scorer in ("iglue_hf", "suite"):   # a Hugging Face model: its rule (and variant) keep their rows
                extra.update({k: v for k, v in iglue_hf_results(cell_dir, cell.scorer).items() if k != "metrics"})
                if cell.extra.get("engine"):       # the plan's name (openai/vllm-serve: the cell started vLLM)
                    extra["engine"] = cell.extra["engine"]
                if cell.extra.get("variant"):
                    extra["variant"] = cell.extra["variant"]
            items, why = cell_items(cell_dir, metrics) if cell.scorer != "cvqa" else (None, "")
            if items:
                extra["items"] = items
            elif why:
                print(f"record {cell.id}: no per-item scores ({why}); the report shows this cell without an "
                      f"interval", file=sys.stderr)
            selection = cell_dir / "selection.json"
            if selection.exists():
                import json
                extra["selected_lr"] = json.loads(selection.read_text(encoding="utf-8"))["lr"]
    except LogError as error:
        print(f"record {cell.id}: {error}", file=sys.stderr)
        return 1
    write_json_atomic(cell_dir / RESULT_FILE, {**base, **extra, "status": "done",
                                               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    print(f"recorded {cell.id}: {extra['metrics']}")
    return 0


def select(cell_dir: Path) -> int:
    """IGLUE's few-shot model selection (user-scripts spec E7): for each learning rate in grid order, the
    dev score from the last line of its training log; the strictly greater one wins, so ties go to the
    earlier rate. Its best checkpoint is linked as `selected/pytorch_model_best.bin` (an HF model's export as
    `selected/hf_best`)."""
    cell = load_cell(cell_dir)
    name = cell.extra.get("best", BEST)
    best, best_lr, best_dir = -1.0, None, None
    scores = {}
    for lr, train_dir in zip(cell.extra["learning_rates"], cell.extra["train_cells"]):
        train_dir = Path(train_dir)
        if read_result(train_dir) is None:
            print(f"select {cell.id}: lr {lr} has no finished training run ({train_dir}); skipped", file=sys.stderr)
            continue
        try:
            score = best_validation(train_dir / "train.log")
        except LogError as error:
            print(f"select {cell.id}: {error}; skipped", file=sys.stderr)
            continue
        scores[lr] = score
        if score > best:
            best, best_lr, best_dir = score, lr, train_dir
    if best_dir is None:
        print(f"select {cell.id}: no learning rate has a finished training run", file=sys.stderr)
        return 1
    link(best_dir / name, cell_dir / "selected" / name)
    write_json_atomic(cell_dir / "selection.json", {"lr": best_lr, "dev": best, "scores": scores,
                                                    "train_cell": str(best_dir)})
    print("Best lr: ", best_lr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m volta_ml.protocols.steps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["record", "select", "is-done"])
    parser.add_argument("cell_dir", type=Path)
    args = parser.parse_args(argv)
    if args.step == "is-done":
        return 0 if is_done(args.cell_dir) else 1
    return record(args.cell_dir) if args.step == "record" else select(args.cell_dir)


if __name__ == "__main__":
    sys.exit(main())
