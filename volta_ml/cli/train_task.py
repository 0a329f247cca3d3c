"""`train_task.py` / `volta-ml train`: start-up, the run, and the exit status.

Exit status: 0 when training finished (the last output line is then
`Best Validation score: X `), 128+signal after SIGTERM/SIGUSR1 saved the resume file
(143 / 138: schedulers treat it as "killed", so a requeued job resumes with the same
command when it passes --resume_file <run dir>/pytorch_ckpt_latest.tar), 3 when the
loss became NaN/inf, 2 for usage errors, 1 for a crash, 4 when a checkpoint could not be
written (`volta_ml.engine.failures.EXIT_CODES`). Any error ends the process at once, its
DataLoader workers too, with the cause as the last stderr line.
"""
from __future__ import annotations

import sys

from volta_ml.engine.distributed import DistInfo
from volta_ml.engine.failures import UsageError
from volta_ml.engine.run_job import run, seed_everything, setup_logging  # noqa: F401 (imported from here too)
from volta_ml.engine.sharding import check_flags
from volta_ml.engine.train import TrainJob
from volta_ml.cli.flags import VoltaArgumentParser
from volta_ml.cli.train_flags import add_train_flags, parse_train_args


def build_task_job(args, info: DistInfo) -> TrainJob:
    if check_flags(args) == "fsdp" and not args.hf_model:   # --sharding and its options, before anything is loaded
        raise UsageError("--sharding fsdp: Hugging Face models only (--hf_model); the zoo's models train with "
                         "--sharding ddp")
    if args.hf_model:  # a Hugging Face dual encoder or generative model (docs/hf_models.md)
        from volta_ml.iglue_hf.train import build_dual_encoder_job, model_spec, training_kind
        if training_kind(model_spec(args), args.hf_backend) == "generative":
            from volta_ml.iglue_hf.train_generative import build_generative_job
            return build_generative_job(args, info)
        return build_dual_encoder_job(args, info)
    from volta_ml.engine.task_job import build_task_job as build
    return build(args, info)


def main(argv: list[str] | None = None) -> int:
    return run(parse_train_args(argv), build_task_job)


def register(subparsers) -> None:
    parser = subparsers.add_parser("train", help="fine-tune on one task (train_task.py flags)",
                                   description="Fine-tune a VOLTA model on one task; same flags as train_task.py.")
    parser.__class__ = VoltaArgumentParser  # nearest-flag suggestions and the trailing 'deactivate' rule
    add_train_flags(parser)
    parser.set_defaults(func=lambda args: run(args, build_task_job, "volta-ml train"))


if __name__ == "__main__":
    sys.exit(main())
