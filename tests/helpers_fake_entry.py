"""A stand-in for the train/eval entry points in the sweep-runner tests: it takes the same flags and writes
VOLTA's output files and log lines, with scores that are a known function of its inputs, in milliseconds.
(The real entry points run in test_protocols_e2e.py.)

    helpers_fake_entry.py train|eval|eval-retrieval|gqa-score|cvqa-score [VOLTA / volta-ml cvqa flags]

Scores: training's dev score comes from FAKE_DEV (JSON lr -> score, default 50); a checkpoint stores its
learning rate, and evaluation scores = 40 + 10 * lr * 1e4 + the number of lines of the annotation file
mod 7, so a test can tell which checkpoint was evaluated on which file. FAKE_SLEEP slows every command.
CVQA: `cvqa-score` answers `cvqa_right(model, rule, condition)` of 4 questions right and writes
`cvqa_results.json`, `predictions_<condition>.csv` and `argv.json` into --output_dir.
"""
import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path


def annotation_lines(path: str) -> int:
    try:
        return sum(1 for line in open(path, encoding="utf-8") if line.strip())
    except (OSError, UnicodeDecodeError):
        return 0


def checkpoint_lr(path: str) -> float:
    try:
        return float(json.loads(Path(path).read_text())["lr"])
    except (OSError, ValueError, KeyError):
        return 0.0      # an English "fine-tuned" checkpoint made by the test


def eval_score(args) -> float:
    return round(40 + 10 * checkpoint_lr(args.from_pretrained) * 1e4 + annotation_lines(args.val_annotations_jsonpath) % 7, 3)


CVQA_CONDITIONS = ("en-aware", "en-agnostic", "loc-aware", "loc-agnostic")
CVQA_PAIRS = ("India-Telugu", "India-Telugu", "Brazil-Portuguese", "Kenya-Swahili")


def cvqa_right(model: str, rule: str, condition: str) -> int:
    return (len(model) + CVQA_CONDITIONS.index(condition) + (rule == "open")) % 5


def cvqa_score(args) -> None:
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    right = cvqa_right(args.model, args.rule, args.conditions)
    with open(out / f"predictions_{args.conditions}.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["ID", "Prediction", "Label", "pair", "category", "image_type", "condition", "revision",
                         "question_en"])
        for i, pair in enumerate(CVQA_PAIRS):
            writer.writerow([f"{i}_0", i if i < right else (i + 1) % 4, i, pair, "Cooking and Food", "Self",
                             args.conditions, "datarev", "What is this?"])
    micro = 25.0 * right
    (out / "cvqa_results.json").write_text(json.dumps({
        "backend": args.backend, "model": args.model, "model_revision": args.model_revision,
        "revision": "datarev", "rule": args.rule or None,
        "runs": {args.conditions: {"micro": micro, "macro": micro}}}))
    (out / "argv.json").write_text(json.dumps(sys.argv[2:]))


def main() -> int:
    mode = sys.argv[1]
    p = argparse.ArgumentParser()
    for flag in ("--output_dir", "--val_annotations_jsonpath", "--split", "--from_pretrained", "--lr",
                 "--preds_file", "--truth_file", "--task", "--config_file", "--backend", "--model", "--model-revision",
                 "--rule", "--data", "--conditions"):
        p.add_argument(flag, default="")
    args, _ = p.parse_known_args(sys.argv[2:])
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in " ".join(sys.argv):
        print("Traceback: simulated failure", file=sys.stderr)
        return 1
    if mode == "train":
        run = Path(args.output_dir) / f"Task{args.task}_tiny"
        run.mkdir(parents=True, exist_ok=True)
        (run / "pytorch_model_best.bin").write_text(json.dumps({"lr": args.lr or "0"}))
        dev = json.loads(os.environ.get("FAKE_DEV", "{}")).get(args.lr, 50.0)
        print(f"Validation [Task{args.task}]: loss 0.500 score {dev:.3f} ", file=sys.stderr)
        print(f"Best Validation score: {dev:.3f} ")
    elif mode == "eval":
        out = Path(args.output_dir) / (Path(args.from_pretrained).name + "-")
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.split}_result.json").write_text("[]")
        print(f"Validation [Task{args.task}]: loss 0.700 score {eval_score(args):.3f} ", file=sys.stderr)
    elif mode == "gqa-score":
        print(f"{eval_score(argparse.Namespace(from_pretrained='', val_annotations_jsonpath=args.truth_file)) + 0.5}")
    elif mode == "cvqa-score":
        cvqa_score(args)
    elif mode == "eval-retrieval":
        s = eval_score(args)
        for _ in range(2):
            print(f"Final r1:{s:.3f}, r5:{s + 10:.3f}, r10:{s + 20:.3f}, mder:2.000, meanr:9.000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
