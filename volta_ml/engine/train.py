"""The training loop: one task, VOLTA's optimisation semantics, resumable at any optimizer step.

`train(job, args, info)` runs `args.num_epoch` epochs of `job.train_dataset` through
`job.forward_and_loss(model, batch, task_id) -> (loss, score_sum, n_examples, logits)`,
validates after every epoch and returns the best validation score (a fraction).
A job with `loss_parts` (pretraining, volta_ml/pretrain) returns the per-example sums of its loss parts in
place of `score_sum`; the log lines, TensorBoard and validation show those parts, and there is no score
(every epoch's weights are kept, as VOLTA's train_concap.py does).
`args` carries train_task.py's flags (see `volta_ml.cli.train_task`). docs/training.md
lists which VOLTA quirks are kept and which bugs are fixed.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.utils.data import Dataset
from tqdm import tqdm

from volta_ml.atomic import WriteError
from volta_ml.engine import checkpointing as ckpt
from volta_ml.engine import sharding
from volta_ml.engine.distributed import DistInfo, all_reduce_sum, barrier
from volta_ml.engine.failures import UsageError
from volta_ml.engine.optim import build_optimizer, build_scheduler, freeze_fixed_layers, schedule_lengths
from volta_ml.engine.evaluate import as_tensor, evaluate, loss_and_count, move_to_device
from volta_ml.engine.train_support import (NonFiniteLoss, Precision, Preempted, PreemptionFlag, train_loader,
                                           val_loader)

logger = logging.getLogger("volta_ml.train")


@dataclass
class TrainJob:
    model: nn.Module
    train_dataset: Dataset
    val_dataset: Dataset | None
    forward_and_loss: Callable
    task_id: str                      # "TASK19"
    task_name: str                    # "XVNLI": the log label and TensorBoard tag
    run_dir: Path                     # <output_dir>/<Name>_<cfg>[-<save_name>]
    tb_dir: Path | None = None        # <logdir>/<run name>; None disables TensorBoard
    collate_fn: Callable | None = None
    fixed_layers: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)  # extra lines for the start summary
    # rank 0, after pytorch_model_best.bin is written: export the bare model in another format too
    # (the HF models' hf_best/ folder, volta_ml/iglue_hf/train.py), told which weights these are (SavedBest); under
    # --sharding fsdp every rank calls it (gathering the weights is collective: `sharding.gather_full_state`) and
    # rank 0 writes
    on_best_saved: Callable[[nn.Module, "SavedBest"], None] | None = None
    # pretraining (volta_ml/pretrain): (log label, TensorBoard key) of each loss part forward_and_loss sums
    loss_parts: tuple[tuple[str, str], ...] = ()
    # the optimizer's parameter groups (a group may carry its own "lr"); default: decay / no decay
    param_groups: Callable[[nn.Module], list[dict]] | None = None
    # an optimizer step of other batches before each of the job's own (train_concap_wiki.py's Wikipedia MLM)
    interleaved: "Interleaved | None" = None
    # the training set is this rank's own part (VOLTA's training_feat_part_<rank>.lmdb): not sharded again;
    # every rank's part must give the same number of batches
    rank_shard: bool = False
    # --sharding fsdp (engine/sharding.py): the modules that become FSDP units (decoder layers, vision blocks);
    # None: the job's model cannot be sharded
    shard_units: Callable[[nn.Module], list[nn.Module]] | None = None
    # the trainable tensors are cast to this dtype before training (master weights of a bf16 model; under FSDP
    # unit by unit as they are sharded); None: as loaded
    train_dtype: torch.dtype | None = None
    # what the model is (plain strings: model, LoRA rank and targets, ...): recorded in the resume file as
    # `saved_from`, and named when a resume file does not fit the model
    origin: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SavedBest:
    """What `TrainJob.on_best_saved` is told about the weights just saved as `pytorch_model_best.bin`."""
    checkpoint: Path        # <run dir>/pytorch_model_best.bin
    epoch: int              # the epoch whose validation (at its end, or a mid-epoch point) made them the best
    global_step: int        # optimizer steps taken
    score: float            # that validation score (a fraction)


@dataclass
class Interleaved:
    """Before the first micro-batch of every optimizer step: `grad_acc` batches of another data set, each loss
    divided by `grad_acc` and backpropagated, then clipping and an optimizer step of their own, without a
    learning-rate schedule step (VOLTA's train_concap_wiki.py). Gradients a job carries over an epoch end are
    stepped with them, as there; tensors these batches do not reach take part with zero gradients once they have
    been stepped before (VOLTA's zero_grad zeroes rather than drops gradients)."""
    batch: Callable[[int], object]                    # index -> batch; the same index gives the same batch
    loss: Callable[[nn.Module, object], torch.Tensor]


class RunLog:
    """Rank 0's text log (`out.txt`), logger lines (stderr) and TensorBoard scalars."""

    def __init__(self, job: TrainJob, info: DistInfo):
        self.enabled = info.is_main
        self.text = open(job.run_dir / "out.txt", "a", encoding="utf-8") if self.enabled else None
        self.tb = None
        if self.enabled and job.tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(log_dir=str(job.tb_dir))

    def line(self, message: str) -> None:
        if self.enabled:
            logger.info(message)
            try:
                self.text.write(message + "\n")
                self.text.flush()
            except OSError as error:  # a full disk: name the file (checkpoints are written atomically)
                raise WriteError(Path(self.text.name), error, unchanged=False) from error

    def scalars(self, prefix: str, name: str, step: int, **values) -> None:
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(f"{prefix}/{name}_{key}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.text is not None:
            with contextlib.suppress(OSError):  # the buffered line is lost when the disk is full
                self.text.close()


def per_step_batch_size(args, world_size: int) -> int:
    """VOLTA's batch arithmetic: the configured batch is the effective one, divided by
    grad-accumulation steps and by the number of processes."""
    size = args.batch_size // args.grad_acc_steps // world_size
    if size < 1:
        raise UsageError(f"batch size {args.batch_size} is smaller than gradient_accumulation_steps "
                         f"({args.grad_acc_steps}) x processes ({world_size})")
    return size


def train(job: TrainJob, args, info: DistInfo) -> float:
    shard = sharding.for_run(args, job, info)
    try:
        return _train(job, args, info, shard)
    finally:
        shard.close()


def _train(job: TrainJob, args, info: DistInfo, shard: sharding.Replicated) -> float:
    frozen = freeze_fixed_layers(job.model, job.fixed_layers)
    model = shard.place(job.model)
    if info.is_main:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.remove_stale_temp_files(job.run_dir)
        sharding.remove_stale_shards(job.run_dir)
    barrier(info)

    batch = per_step_batch_size(args, info.world_size)
    loader = train_loader(job.train_dataset, batch, info, args, job.collate_fn, shard=not job.rank_shard)
    micro_per_epoch = len(loader)
    if micro_per_epoch == 0:
        raise ValueError(f"the training set of {job.task_name} gives no batch of {batch} examples")
    total_steps, warmup = schedule_lengths(micro_per_epoch, args)
    optimizer = build_optimizer(model, args, info.device, job.param_groups(model) if job.param_groups else None)
    scheduler = build_scheduler(optimizer, total_steps, warmup, args.lr_scheduler)
    precision = Precision(args.amp, info.device)

    global_step, start_epoch, start_micro, best = 0, 0, 0, -1.0
    resumed = bool(args.resume_file) and os.path.exists(args.resume_file)
    if resumed:
        global_step, start_epoch, start_micro, best = _resume(args.resume_file, model, optimizer, scheduler,
                                                              precision, info, shard, job.origin)
    trainable = [p for p in model.parameters() if p.requires_grad]
    model = shard.wrap(model)

    log = RunLog(job, info)
    _start_summary(job, args, info, batch, micro_per_epoch, total_steps, warmup, frozen, resumed,
                   global_step, start_epoch, start_micro, shard)
    latest_path = job.run_dir / ckpt.LATEST_NAME
    grad_acc = args.grad_acc_steps

    def save_latest(epoch_done: int, next_epoch: int, next_micro: int, pending: bool = False):
        shard.save_latest(latest_path, model, optimizer, pending, scheduler=scheduler, scaler=precision.scaler,
                          global_step=global_step, epoch_id=epoch_done, resume_epoch=next_epoch,
                          resume_micro_step=next_micro, best_score=best, saved_from=job.origin)

    def save_bin(tag) -> None:
        state = shard.model_state(model)     # collective under FSDP; None except on rank 0
        if info.is_main:
            ckpt.atomic_torch_save(state, job.run_dir / f"pytorch_model_{tag}.bin")

    def save_best(tag, epoch: int) -> None:
        """pytorch_model_<tag>.bin and pytorch_model_best.bin, then the job's export of the same weights (under FSDP
        on every rank: gathering them is collective)."""
        save_bin(tag)
        save_bin("best")
        if job.on_best_saved is not None and (info.is_main or shard.collective):
            job.on_best_saved(ckpt.unwrap(model), SavedBest(job.run_dir / "pytorch_model_best.bin", epoch,
                                                            global_step, best))

    width = len(job.loss_parts) or 1   # entries of the score (or of the loss parts) forward_and_loss returns
    steps_per_epoch = -(-micro_per_epoch // grad_acc)

    def interleaved_step(index: int) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64, device=info.device)
        for k in range(grad_acc):
            extra = move_to_device(job.interleaved.batch(index * grad_acc + k), info.device)
            with shard.micro_batch(model, k + 1 == grad_acc):
                with precision.autocast():
                    extra_loss = job.interleaved.loss(model, extra)
                precision.scaler.scale(extra_loss / grad_acc).backward()
            total += extra_loss.detach().double()
        # VOLTA's zero_grad (torch 1.x) zeroes gradients rather than dropping them: a tensor the other loss does
        # not reach (the matching and region heads for Wikipedia MLM) still takes part in this step once it has
        # been stepped before (momentum and weight decay move it)
        for param in trainable:
            if param.grad is None and optimizer.state.get(param):
                param.grad = torch.zeros_like(param)
        if args.clip_grad_norm > 0:
            precision.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainable, args.clip_grad_norm)
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return total

    # --max_val_batches N stops when the batch index equals N-1: N-1 batches (quirk kept)
    end_max_batches = args.max_val_batches - 1 if args.max_val_batches > 0 else None
    val_loaders = {}

    def run_validation(micro_total: int, max_batches: int | None) -> float:
        if job.val_dataset is None:
            return -1.0
        if not job.loss_parts:   # train_concap.py has no such line
            log.line(f"Eval task {job.task_id} on iteration {micro_total}")
        if max_batches not in val_loaders:
            val_loaders[max_batches] = val_loader(job.val_dataset, args.eval_batch_size, info, args, job.collate_fn,
                                                  max_batches)
        with shard.evaluating(ckpt.unwrap(model)):
            result = evaluate(ckpt.unwrap(model), job.val_dataset, task_id=job.task_id,
                              forward_and_loss=job.forward_and_loss, loader=val_loaders[max_batches],
                              precision=precision.mode, progress=False, info=info, score_width=width,
                              lockstep=shard.lockstep, device=info.device)
        if job.loss_parts:  # VOLTA's train_concap.py line; no score, so no "best" weights
            means = {part: total / max(result.n_examples, 1) for part, total in zip(job.loss_parts, result.score_sums)}
            log.line(f"Validation [{job.task_name}]: " + " ".join(f"{label} {value:.3f}"
                                                                 for (label, _), value in means.items()))
            log.scalars("val", job.task_name, global_step, **{key: value for (_, key), value in means.items()})
            return -1.0
        loss, score = result.loss, result.score
        log.line(f"Validation [{job.task_name}]: loss {loss:.3f} score {score * 100:.3f} ")
        log.scalars("val", job.task_name, global_step, loss=loss, score=score)
        return score

    if not resumed:  # VOLTA's initial save (epoch -1); IGLUE-VOLTA also did it on resume (fixed)
        save_bin(-1)
        save_latest(-1, 0, 0)

    window = torch.zeros(2 + width, dtype=torch.float64, device=info.device)  # loss sum, score sum(s), examples
    window_micro = 0
    timing = {"seconds": 0.0, "micro": 0, "steps": 0}  # training time without validation
    with PreemptionFlag() as stop, contextlib.closing(log):
        for epoch in range(start_epoch, args.num_epoch):
            first_micro = start_micro if epoch == start_epoch else 0
            loader.sampler.set_epoch(epoch)
            loader.sampler.skip_next_epoch(first_micro * batch)
            loader.generator.manual_seed(args.seed * 100003 + epoch)
            if hasattr(job.train_dataset, "set_epoch"):  # per-epoch random draws seeded by (seed, epoch, index)
                job.train_dataset.set_epoch(epoch)
            model.train()
            step_loss = torch.zeros((), dtype=torch.float64, device=info.device)
            bar = tqdm(total=micro_per_epoch, initial=first_micro, desc=f"{job.task_name} epoch {epoch}",
                       disable=not info.is_main, dynamic_ncols=True, file=sys.stderr, mininterval=2.0)
            started, steps_before = time.perf_counter(), global_step
            for micro, batch_data in enumerate(loader, start=first_micro):
                if job.interleaved is not None and micro % grad_acc == 0:
                    step_loss += interleaved_step(epoch * steps_per_epoch + micro // grad_acc)  # NaN stops too
                batch_data = move_to_device(batch_data, info.device)
                is_step = (micro + 1) % grad_acc == 0
                with shard.micro_batch(model, is_step):
                    with precision.autocast():
                        loss, score_sum, n_examples, _ = job.forward_and_loss(model, batch_data, job.task_id)
                        loss = loss_and_count(loss, n_examples)[0]
                    precision.scaler.scale(loss / grad_acc if grad_acc > 1 else loss).backward()
                loss_value = loss.detach().double()
                step_loss += loss_value
                window += torch.cat([loss_value.reshape(1), as_tensor(score_sum, info.device).reshape(-1),
                                     as_tensor(n_examples, info.device).reshape(1)])
                window_micro += 1
                bar.update(1)

                if is_step:
                    checks = all_reduce_sum(torch.stack([step_loss, torch.tensor(float(stop.signum > 0),
                                                         dtype=torch.float64, device=info.device)]), info)
                    if not math.isfinite(checks[0].item()):
                        raise NonFiniteLoss(f"training loss is {checks[0].item()} at optimizer step "
                                            f"{global_step + 1} (epoch {epoch}, micro-batch {micro}); stopping "
                                            f"without saving these weights")
                    step_loss.zero_()
                    if args.clip_grad_norm > 0:
                        precision.scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(trainable, args.clip_grad_norm)
                    precision.scaler.step(optimizer)
                    precision.scaler.update()
                    if global_step < warmup or args.lr_scheduler == "warmup_linear":
                        scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    global_step += 1
                    if checks[1].item() > 0:
                        bar.close()
                        save_latest(epoch - 1, epoch, micro + 1)
                        raise Preempted(stop.signum or _peer_signal(), latest_path)
                    if args.checkpoint_every_steps and global_step % args.checkpoint_every_steps == 0:
                        save_latest(epoch - 1, epoch, micro + 1)

                if micro % (20 * grad_acc) == 0 and micro != 0 and window_micro:
                    loss_sum, *score_totals, count = window.tolist()
                    micro_total = epoch * micro_per_epoch + micro + 1
                    lr = optimizer.param_groups[0]["lr"]
                    head = f"[{job.task_name}]: iter {micro_total} Ep: {micro_total / micro_per_epoch:.2f} "
                    if job.loss_parts:  # VOLTA's train_concap.py line
                        means = [total / max(count, 1.0) for total in score_totals]
                        log.line(head + " ".join(f"{label} {value:.3f}" for (label, _), value in
                                                 zip(job.loss_parts, means)) + f" lr {lr:.6g}")
                        log.scalars("train", job.task_name, global_step,
                                    **{key: value for (_, key), value in zip(job.loss_parts, means)})
                    else:
                        mean_loss, mean_score = loss_sum / window_micro, score_totals[0] / max(count, 1.0)
                        log.line(head + f"loss {mean_loss:.3f} score {mean_score:.3f} lr {lr:.6g}")
                        log.scalars("train", job.task_name, global_step, loss=mean_loss, score=mean_score, norm=lr)
                    window.zero_()
                    window_micro = 0

                # VOLTA's mixed-unit mid-epoch evaluation point, run once (VOLTA ran it grad_acc times)
                iter_id = micro // grad_acc + epoch * micro_per_epoch
                if iter_id != 0 and iter_id % (args.eval_steps - 1) == 0 and micro % grad_acc == 0:
                    bar.clear()
                    paused = time.perf_counter()
                    score = run_validation(epoch * micro_per_epoch + micro + 1, None)
                    started += time.perf_counter() - paused
                    model.train()
                    if score > best:
                        best = score
                        save_best(iter_id, epoch)
            bar.close()
            if info.device.type == "cuda":
                torch.cuda.synchronize()
            epoch_seconds = max(time.perf_counter() - started, 1e-9)
            epoch_samples = (micro_per_epoch - first_micro) * batch * info.world_size
            timing["seconds"] += epoch_seconds
            timing["micro"] += micro_per_epoch - first_micro
            timing["steps"] += global_step - steps_before
            log.line(f"Epoch {epoch} throughput: {(global_step - steps_before) / epoch_seconds:.3f} steps/s, "
                     f"{epoch_samples / epoch_seconds:.2f} samples/s")

            if info.device.type == "cuda":
                torch.cuda.empty_cache()
            score = run_validation((epoch + 1) * micro_per_epoch, end_max_batches)
            pending = micro_per_epoch % grad_acc != 0  # VOLTA carries leftover gradients over
            if score > best:
                best = score
                save_best(epoch, epoch)
            elif not args.save_best_only and (epoch + 1) % args.save_every_num_epochs == 0:
                save_bin(epoch)
            save_latest(epoch, epoch + 1, 0, pending=pending)
            stop_votes = all_reduce_sum(torch.tensor(float(stop.signum > 0), device=info.device), info)
            if stop_votes.item() > 0 and epoch + 1 < args.num_epoch:
                raise Preempted(stop.signum or _peer_signal(), latest_path)
        seconds = max(timing["seconds"], 1e-9)
        samples = timing["micro"] * batch * info.world_size
        log.line(f"Training throughput: {timing['steps']} optimizer steps, {samples} samples in {seconds:.1f}s "
                 f"({timing['steps'] / seconds:.3f} steps/s, {samples / seconds:.2f} samples/s, validation excluded)")
    return best


def _peer_signal() -> int:
    return int(signal.SIGTERM)  # only another rank was signalled; report it as SIGTERM


def _resume(path, model, optimizer, scheduler, precision, info, shard, origin: dict) -> tuple[int, int, int, float]:
    state = ckpt.load_latest(path)
    ckpt.check_fits(path, state, model, origin)
    shard.load_latest(path, state, model, optimizer)    # weights, optimizer state, pending gradients
    if state["format"] == "volta":
        logger.warning("%s was written by VOLTA: only weights, step, epoch and best score are restored; "
                       "the optimizer and schedule restart", path)
    else:
        scheduler.load_state_dict(state["scheduler_state_dict"])
        if state.get("scaler_state_dict") and precision.scaler.is_enabled():
            precision.scaler.load_state_dict(state["scaler_state_dict"])
        rng_states = state["rng_states"]
        if len(rng_states) != info.world_size:
            logger.warning("%s was saved by %d processes and is resumed by %d: RNG streams restart from "
                           "rank 0's state", path, len(rng_states), info.world_size)
        ckpt.restore_rng_state(rng_states[info.rank if info.rank < len(rng_states) else 0])
    logger.info("Resumed from %s: global step %d, epoch %d, micro-batch %d, best score %.4f", path,
                state["global_step"], state["resume_epoch"], state["resume_micro_step"], state["score"])
    return state["global_step"], state["resume_epoch"], state["resume_micro_step"], state["score"]


def _start_summary(job, args, info, batch, micro_per_epoch, total_steps, warmup, frozen, resumed,
                   global_step, start_epoch, start_micro, shard) -> None:
    if not info.is_main:
        return
    bare = ckpt.unwrap(job.model)
    n_params = sum(p.numel() for p in bare.parameters())
    n_train = sum(p.numel() for p in bare.parameters() if p.requires_grad)
    lines = [
        f"model        {type(bare).__name__}: {n_params:,} parameters, {n_train:,} trainable"
        + (f" ({len(frozen)} tensors frozen by fixed_layers)" if frozen else ""),
        f"task         {job.task_id} {job.task_name}",
        f"data         train {len(job.train_dataset)} examples, val "
        f"{len(job.val_dataset) if job.val_dataset is not None else 0} examples",
        f"batch        {batch} per step x {args.grad_acc_steps} accumulation x {info.world_size} processes "
        f"= {batch * args.grad_acc_steps * info.world_size} effective (requested {args.batch_size})",
        f"steps        {micro_per_epoch} micro-batches/epoch, {args.num_epoch} epochs, "
        f"{micro_per_epoch * args.num_epoch // args.grad_acc_steps} optimizer steps; LR schedule sized for "
        f"{total_steps} steps ({args.optim_train_epochs} epochs), warmup {warmup:g}",
        f"optimizer    {args.optim} ({args.adam_impl}) lr {args.lr:g} wd {args.weight_decay:g} "
        f"eps {args.adam_epsilon:g} betas {tuple(args.adam_betas)} correct_bias {args.adam_correct_bias} "
        f"clip {args.clip_grad_norm:g}",
        f"precision    {args.amp if args.amp != 'none' else 'float32'} on {info.device}, world size {info.world_size}",
        f"sharding     {shard.describe()}",
        f"output       {job.run_dir}" + (f", TensorBoard {job.tb_dir}" if job.tb_dir else ""),
        "start        " + (f"resumed at step {global_step} (epoch {start_epoch}, micro-batch {start_micro})"
                            if resumed else "fresh"),
    ] + [f"{key:<12} {value}" for key, value in job.summary.items()]
    logger.info("***** Training *****\n  " + "\n  ".join(lines))
