"""`volta-ml train --hf_model ... --sharding fsdp` (engine/sharding.py): FSDP2 on gloo, CPU, with a tiny random Qwen2-VL
(LoRA and full fine-tuning on a tiny XVNLI root) and a tiny CLIP (contrastive, on a tiny Flickr30k root).

The runs are few and shared (module fixture `runs`), each process pays its start-up once:
- in this process, one rank, no sharding: the LoRA, full and contrastive references (in a background thread
  meanwhile: a 2-process Slurm-style FSDP LoRA run whose rank 1 is SIGKILLed mid-run);
- one `torchrun` of 2 processes running, in turn (tests/helpers_fsdp_train.py): LoRA, full and contrastive with
  --sharding fsdp; full with --sharding ddp; the killed run resumed with --resume_file; LoRA stopped after one epoch
  (its resume state then continues on one rank, in this process); LoRA with bf16 mixed precision, CPU offload,
  activation checkpointing and the projector trained; LoRA with CPU offload alone, with activation checkpointing
  alone, and 24 steps in fp32 and in bf16 mixed precision;
- two `torchrun --nnodes 2` launchers of one process each, meeting at 127.0.0.1 (two nodes), running LoRA.

Checked: 2 FSDP ranks = 1 rank = 2 DDP ranks (the DDP tests' tolerance, 1e-5, and the same validation scores), for
LoRA, full and contrastive; a rank killed mid-step ends the job with one line; SIGKILL + resume = the uninterrupted
run bit for bit; resuming on 1 rank a state saved by 2 = the 2-rank run; the hf_best/ exports load with plain
transformers / peft and compute what the trained model computes (and the full export scores its validation score
through `volta-ml iglue-hf`); offload and activation checkpointing = the plain run bit for bit; bf16 within
BF16_BAND of fp32's validation loss at every epoch; two nodes = one launcher of 2 processes bit for bit. Ranks > 0
of every FSDP generative run here build the model on the meta device and receive rank 0's tensors (test_fsdp_load.py
checks the shards bit for bit).
"""
import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from helpers_hf import build as build_dual
from helpers_hf_train import REPO, in_process, make_flickr_root, make_xvnli_root, train_env
from helpers_train import free_port
from helpers_vlm_families import build_family, shared_root

ENTRY = str(REPO / "tests" / "helpers_hf_train.py")
MULTI = str(REPO / "tests" / "helpers_fsdp_train.py")
COMMON = ["--batch_size", "8", "--warmup_proportion", "0", "--adam_correct_bias", "--adam_epsilon", "1e-4",
          "--num_workers", "0", "--num_val_workers", "0", "--checkpoint_every_steps", "1"]
# XVNLI: 24 examples. LoRA: 16 per step in 4 accumulated micro-batches, 6 micro-batches per epoch, so every epoch
# end carries 2 micro-batches of gradients into the next (VOLTA's quirk: saved in the resume state); no LoRA
# dropout (2 ranks compute what 1 does). Full: 8 per step, 3 steps per epoch, gradients clipped.
LORA = ["--task", "xvnli", "--num_epoch", "3", "--lr", "2e-2", "--lora_r", "4", "--lora_alpha", "32",
        "--lora_dropout", "0", *COMMON, "--batch_size", "16", "--gradient_accumulation_steps", "4"]
FULL = ["--task", "xvnli", "--num_epoch", "2", "--lr", "1e-3", "--finetune", "full", "--clip_grad_norm", "0.1",
        *COMMON]
CLIP = ["--task", "8", "--num_epoch", "2", "--lr", "3e-3", "--hf_val_gallery", "8", *COMMON]
FSDP = ["--sharding", "fsdp"]
# bf16 against fp32: 8 epochs of 3 optimizer steps (24), one micro-batch each
LONG = ["--num_epoch", "8", "--batch_size", "8", "--gradient_accumulation_steps", "1"]
BF16_BAND = 0.02     # |validation loss bf16 - fp32| at every epoch end (the loss starts near 1.1)
RUN = {"lora": "XVNLI_qwen2-vl", "full": "XVNLI_qwen2-vl", "clip": "RetrievalFlickr30k_clip"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_inputs")
    xvnli, flickr = make_xvnli_root(root / "xvnli", 24, 8), make_flickr_root(root / "flickr", 32, 8)
    return {"qwen": build_family("qwen2-vl", shared_root()), "clip": build_dual("clip", root / "models"),
            "xvnli": xvnli, "flickr": flickr}


def _argv(inputs, kind: str, out, *extra):
    if kind == "clip":
        data, images = inputs["flickr"]
        head = ["--hf_model", str(inputs["clip"]), "--val_annotations_jsonpath",
                str(data / "flickr30k/annotations/train_ann.jsonl"), *CLIP]
    else:
        data, images = inputs["xvnli"]
        head = ["--hf_model", str(inputs["qwen"]), *(LORA if kind == "lora" else FULL)]
    return head + ["--data_root", str(data), "--images", str(images), "--output_dir", str(out / "save"),
                   "--logdir", str(out / "logs"), *extra]


def _kill_rank_one(argv, cwd, port: int, outcome: dict) -> None:
    """A 2-process FSDP run launched as Slurm launches it (one process per rank); rank 1 is SIGKILLed once two
    optimizer steps are saved, mid-step (each training forward sleeps 0.3 s). Records rank 0's end, then writes
    `<cwd>/ended` (the resume waits for it)."""
    env = train_env(SLURM_NTASKS="2", SLURM_JOB_ID="4344", SLURM_JOB_NODELIST="localhost",
                    MASTER_PORT=str(port), HF_TRAIN_SLEEP="0.3")
    procs = [subprocess.Popen([sys.executable, ENTRY, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(env, SLURM_PROCID=str(r), SLURM_LOCALID=str(r))) for r in (0, 1)]
    latest = cwd / "save" / RUN["lora"] / "pytorch_ckpt_latest.tar"
    deadline = time.time() + 240
    step = 0
    try:
        while time.time() < deadline and procs[1].poll() is None:
            try:
                step = torch.load(latest, weights_only=True)["global_step"] if latest.exists() else 0
            except Exception:  # noqa: BLE001 - replaced while read
                step = 0
            if step >= 2:
                break
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        try:
            _, err = procs[0].communicate(timeout=120)
        except subprocess.TimeoutExpired:
            procs[0].kill()
            _, err = procs[0].communicate()
        outcome.update(step=step, killed=killed, ended=time.time(), code=procs[0].returncode, err=err,
                       code1=procs[1].wait())
    finally:
        (cwd / "ended").write_text("")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, inputs):
    """Everything at once where it can overlap: the Slurm-style run to kill (a thread), the references in this
    process, and the torchrun launch, whose last run (the killed one resumed) waits for the kill."""
    d = {name: tmp_path_factory.mktemp(name) for name in
         ("lora_one", "full_one", "clip_one", "lora", "full", "clip", "lora_ddp", "full_ddp", "clip_ddp", "killed",
          "partial", "options", "offload", "checkpointing", "fp32_long", "bf16_long", "nodes")}
    killed: dict = {}
    ports = [free_port()]
    while len(ports) < 3:
        ports += [p for p in [free_port()] if p not in ports]
    killer = threading.Thread(target=_kill_rank_one, args=(_argv(inputs, "lora", d["killed"], *FSDP), d["killed"],
                                                           ports[0], killed))
    killer.start()
    resume = str(d["killed"] / "save" / RUN["lora"] / "pytorch_ckpt_latest.tar")
    launch = [_argv(inputs, kind, d[kind], *FSDP) for kind in ("lora", "full", "clip")]
    launch += [_argv(inputs, kind, d[f"{kind}_ddp"]) for kind in ("lora", "full", "clip")]
    launch += [_argv(inputs, "lora", d["offload"], *FSDP, "--fsdp_offload"),
               _argv(inputs, "lora", d["checkpointing"], *FSDP, "--gradient_checkpointing"),
               _argv(inputs, "lora", d["fp32_long"], *FSDP, *LONG),
               _argv(inputs, "lora", d["bf16_long"], *FSDP, *LONG, "--amp", "bf16")]
    launch += [_argv(inputs, "lora", d["partial"], *FSDP, "--num_epoch", "1"),
               _argv(inputs, "lora", d["options"], *FSDP, "--amp", "bf16", "--hf_dtype", "bf16", "--fsdp_offload",
                     "--gradient_checkpointing", "--train_projector", "--part_lr", "projector=5e-3", "--num_epoch",
                     "2", "--batch_size", "8", "--gradient_accumulation_steps", "1"),
               {"argv": _argv(inputs, "lora", d["killed"], *FSDP, "--resume_file", resume),
                "after": str(d["killed"] / "ended")}]
    (d["lora"] / "runs.json").write_text(json.dumps(launch))
    (d["nodes"] / "runs.json").write_text(json.dumps([_argv(inputs, "lora", d["nodes"], *FSDP)]))

    def torchrun(port, runs=d["lora"], *launch_flags):
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *(launch_flags or
                                 ("--nproc_per_node", "2")), "--master_port", str(port), MULTI,
                                 str(runs / "runs.json")], cwd=runs, env=train_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def two_nodes(port):   # two launchers of one process each, as two nodes meeting at 127.0.0.1
        return [torchrun(port, d["nodes"], "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1",
                         "--master_addr", "127.0.0.1") for rank in (0, 1)]
    launched = torchrun(ports[1])
    nodes = two_nodes(ports[2])
    try:
        for kind in ("lora", "full", "clip"):
            assert in_process(_argv(inputs, kind, d[f"{kind}_one"])) == 0
    finally:
        killer.join()
        _, log = launched.communicate(timeout=900)
        node_logs = [node.communicate(timeout=900)[1] for node in nodes]
    if launched.returncode != 0 and "Address already in use" in log:   # the port was taken meanwhile: once more
        launched = torchrun(free_port())
        _, log = launched.communicate(timeout=900)
    if any(node.returncode for node in nodes) and any("Address already in use" in text for text in node_logs):
        nodes = two_nodes(free_port())
        node_logs = [node.communicate(timeout=900)[1] for node in nodes]
    assert launched.returncode == 0, log[-4000:]
    assert not any(node.returncode for node in nodes), node_logs[0][-3000:] + node_logs[1][-3000:]
    partial = d["partial"] / "save" / RUN["lora"] / "pytorch_ckpt_latest.tar"
    killed["partial_state"] = torch.load(partial, weights_only=True)      # as 2 processes left it
    assert in_process(_argv(inputs, "lora", d["partial"], *FSDP, "--resume_file", str(partial))) == 0
    return d, killed, log


def _weights(out, kind, name):
    return torch.load(out / "save" / RUN[kind] / name, map_location="cpu", weights_only=True)


def _validation(out, kind):
    text = (out / "save" / RUN[kind] / "out.txt").read_text()
    found = re.findall(r"Validation \[\w+\]: loss ([\d.]+) score ([\d.]+)", text)
    return [(float(loss), float(score)) for loss, score in found]


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


LAST = {"lora": "pytorch_model_2.bin", "full": "pytorch_model_1.bin", "clip": "pytorch_model_1.bin"}


@pytest.mark.parametrize("kind", ["lora", "full", "clip"])
def test_two_fsdp_ranks_match_one_rank_and_two_ddp_ranks(runs, kind):
    d, _, log = runs
    assert "sharding     fsdp over 2 process(es)" in log
    one = _weights(d[f"{kind}_one"], kind, LAST[kind])
    for two in (d[kind], d[f"{kind}_ddp"]):
        weights = _weights(two, kind, LAST[kind])
        assert {k: v.shape for k, v in one.items()} == {k: v.shape for k, v in weights.items()}   # logit_scale: 0-d
        assert _worst(one, weights) < 1e-5
        assert [s for _, s in _validation(two, kind)] == [s for _, s in _validation(d[f"{kind}_one"], kind)]
    initial = _weights(d[f"{kind}_one"], kind, "pytorch_model_-1.bin")
    assert _worst(initial, one) > 1e-4                                          # it trained
    if kind == "full":   # full fine-tuning trains every weight but the vision tower's
        assert any(".visual.merger." in k for k in one)
        assert not any(".visual." in k and ".visual.merger." not in k for k in one)
        assert any("language_model.layers.0.mlp" in k for k in one)


def test_a_rank_killed_mid_step_ends_the_job_with_one_line(runs):
    _, killed, _ = runs
    assert killed["step"] >= 2 and killed["code1"] == -signal.SIGKILL
    lines = [line for line in killed["err"].splitlines() if line.strip()]
    assert killed["code"] == 1, killed["err"][-3000:]
    assert re.fullmatch(r"\S+: error: .*another process of the job failed.*", lines[-1]), lines[-3:]
    assert killed["ended"] - killed["killed"] < 30


def test_sigkill_then_resume_is_bit_identical(runs):
    d, killed, log = runs
    run = d["killed"] / "save" / RUN["lora"]
    assert "Resumed from" in log
    uninterrupted, resumed = _weights(d["lora"], "lora", LAST["lora"]), _weights(d["killed"], "lora", LAST["lora"])
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted), f"killed at step {killed['step']}"
    state = torch.load(run / "pytorch_ckpt_latest.tar", weights_only=True)
    assert state["model_state_dict"] == {} and state["sharded"]["processes"] == 2
    assert [f.name for f in (run / "pytorch_ckpt_latest.shards").iterdir()] == [state["sharded"]["folder"]]


def test_a_state_saved_by_two_ranks_resumes_on_one(runs):
    """Saved at the end of epoch 0 with 2 micro-batches of gradients pending, re-sharded onto one process."""
    d, killed, _ = runs
    state = killed["partial_state"]
    assert state["sharded"]["processes"] == 2 and state["sharded"]["pending"] and state["resume_epoch"] == 1
    two, resumed = _weights(d["lora"], "lora", LAST["lora"]), _weights(d["partial"], "lora", LAST["lora"])
    assert _worst(two, resumed) < 1e-5
    assert [s for _, s in _validation(d["partial"], "lora")] == [s for _, s in _validation(d["lora"], "lora")]
    text = (d["partial"] / "save" / RUN["lora"] / "out.txt").read_text()
    assert len(_validation(d["partial"], "lora")) == 3, text


def test_mixed_precision_offload_checkpointing_and_a_part_learning_rate(runs):
    d, _, log = runs
    assert "bf16 parameters, fp32 gradient reduction, parameters, gradients and optimizer state offloaded" in log
    validation = _validation(d["options"], "lora")
    assert len(validation) == 2 and validation[1][0] < validation[0][0], validation
    saved = _weights(d["options"], "lora", "pytorch_model_1.bin")
    assert {v.dtype for v in saved.values()} == {torch.float32}                  # the master weights
    assert any(".merger.modules_to_save." in k for k in saved)                   # the projector trained
    adapter = json.loads((d["options"] / "save" / RUN["lora"] / "hf_best" / "adapter_config.json").read_text())
    assert adapter["modules_to_save"] == ["model.visual.merger"]
    state = torch.load(d["options"] / "save" / RUN["lora"] / "pytorch_ckpt_latest.tar", weights_only=True)
    groups = state["sharded"]["param_groups"]    # per part and decay rule: LoRA at --lr, the projector at its own
    assert sorted({g["initial_lr"] for g in groups}) == [5e-3, 2e-2] and len(groups) == 3   # LoRA: no biases
    assert "projector lr 0.005" in log


@pytest.mark.parametrize("option", ["offload", "checkpointing"])
def test_offload_and_activation_checkpointing_give_the_plain_runs_weights(runs, option):
    """--fsdp_offload (the sharded states and the optimizer step in CPU memory) and --gradient_checkpointing (each
    unit's forward recomputed in the backward) change where and when, not what: the plain 2-process FSDP LoRA run's
    checkpoints bit for bit, and the same validation lines."""
    d, _, log = runs
    for name in ("pytorch_model_0.bin", LAST["lora"]):
        plain, other = _weights(d["lora"], "lora", name), _weights(d[option], "lora", name)
        assert plain.keys() == other.keys() and all(torch.equal(plain[k], other[k]) for k in plain), name
    assert _validation(d[option], "lora") == _validation(d["lora"], "lora")


def test_bf16_mixed_precision_stays_within_a_band_of_fp32(runs):
    """--amp bf16 under FSDP (units gathered and computed in bf16, gradients reduced in fp32, fp32 master weights)
    against fp32, 24 optimizer steps: every epoch's validation loss within BF16_BAND of fp32's, both falling."""
    d, _, _ = runs
    fp32, bf16 = _validation(d["fp32_long"], "lora"), _validation(d["bf16_long"], "lora")
    assert len(fp32) == len(bf16) == 8
    assert max(abs(a - b) for (a, _), (b, _) in zip(fp32, bf16)) <= BF16_BAND, (fp32, bf16)
    assert fp32[-1][0] < fp32[0][0] - 0.05 and bf16[-1][0] < bf16[0][0] - 0.05, (fp32, bf16)
    last = "pytorch_model_7.bin"
    assert _worst(_weights(d["fp32_long"], "lora", last), _weights(d["bf16_long"], "lora", last)) > 0   # bf16 ran


def test_two_launchers_as_two_nodes_equal_one_launcher_of_two_processes(runs):
    """torchrun --nnodes 2 --node_rank 0|1 --nproc_per_node 1 on 127.0.0.1 (two nodes of one process) trains what
    one torchrun of 2 processes trains, bit for bit."""
    d, _, _ = runs
    one, two = _weights(d["lora"], "lora", LAST["lora"]), _weights(d["nodes"], "lora", LAST["lora"])
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert _validation(d["nodes"], "lora") == _validation(d["lora"], "lora")
    state = torch.load(d["nodes"] / "save" / RUN["lora"] / "pytorch_ckpt_latest.tar", weights_only=True)
    assert state["sharded"]["processes"] == 2


# --- the exports, read by plain transformers / peft -----------------------------------------------------------
def _val_batch(inputs):
    from volta_ml.hf.base import ModelSpec
    from volta_ml.hf.mllm import GenerativeBackend
    from volta_ml.iglue_hf.data import read_xvnli
    from volta_ml.iglue_hf.images import ImageSource
    from volta_ml.iglue_hf.prompts import user_turn
    data, images = inputs["xvnli"]
    examples = read_xvnli(str(data / "XVNLI/annotations/en/dev.jsonl"), "en")
    source = ImageSource(images, "{id}.jpg")
    backend = GenerativeBackend(ModelSpec(model=str(inputs["qwen"])))
    return backend._batch([[source.load(e.images[0])] for e in examples], [user_turn("xvnli", "letter", e)
                                                                          for e in examples])


def test_exports_load_with_plain_transformers_and_peft(runs, inputs, tmp_path):
    from peft import PeftModel
    from transformers import AutoModel, AutoModelForImageTextToText, AutoProcessor
    d, _, _ = runs
    batch = _val_batch(inputs)

    def logits(model):
        with torch.no_grad():
            return model.eval()(**batch).logits[:, -1]

    # LoRA: base + adapter = base with the best checkpoint's LoRA tensors
    base = AutoModelForImageTextToText.from_pretrained(inputs["qwen"])
    adapted = PeftModel.from_pretrained(base, d["lora"] / "save" / RUN["lora"] / "hf_best")
    best = {k.removeprefix("peft."): v for k, v in _weights(d["lora"], "lora", "pytorch_model_best.bin").items()}
    reference = AutoModelForImageTextToText.from_pretrained(inputs["qwen"])
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(**{k: v for k, v in adapted.peft_config["default"].to_dict().items()
                           if k in ("r", "lora_alpha", "lora_dropout", "target_modules", "bias")})
    wrapped = get_peft_model(reference, config)
    assert not wrapped.load_state_dict(best, strict=False).unexpected_keys
    torch.testing.assert_close(logits(adapted), logits(wrapped), rtol=0, atol=1e-6)
    assert not torch.allclose(logits(adapted), logits(AutoModelForImageTextToText.from_pretrained(inputs["qwen"])),
                              atol=1e-4)

    # full: a whole model folder with its processor, holding the best checkpoint's tensors
    export = d["full"] / "save" / RUN["full"] / "hf_best"
    full = AutoModelForImageTextToText.from_pretrained(export)
    AutoProcessor.from_pretrained(export)
    state = full.state_dict()
    best = _weights(d["full"], "full", "pytorch_model_best.bin")
    assert best and all(torch.equal(state[k.removeprefix("hf.")], v) for k, v in best.items())

    # contrastive: CLIP's own folder
    clip = AutoModel.from_pretrained(d["clip"] / "save" / RUN["clip"] / "hf_best").state_dict()
    best = _weights(d["clip"], "clip", "pytorch_model_best.bin")
    assert all(torch.equal(clip[k.removeprefix("hf.")], v) for k, v in best.items())


def test_full_export_scores_its_validation_score_in_iglue_hf(runs, inputs, tmp_path, capsys):
    from volta_ml.cli import main
    d, _, _ = runs
    data, images = inputs["xvnli"]
    out = tmp_path / "eval"
    assert main(["iglue-hf", "--backend", "mllm", "--model", str(d["full"] / "save" / RUN["full"] / "hf_best"),
                 "--task", "xvnli", "--lang", "en", "--annotations", str(data / "XVNLI/annotations/en/dev.jsonl"),
                 "--images", str(images), "--output_dir", str(out), "--no_progress"]) == 0
    score = json.loads((out / "iglue_hf_results.json").read_text())["metrics"]["score"]
    assert score == pytest.approx(max(s for _, s in _validation(d["full"], "full")), abs=1e-3)


# --- usage -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, expected", [
    (["--sharding", "fsdp", "--amp", "fp16"], "--sharding fsdp: --amp fp16 is not supported"),
    (["--fsdp_offload"], "--fsdp_offload: only with --sharding fsdp"),
    (["--train_parts", "vision"], "'language' must be trained"),
    (["--train_parts", "vision,eyes"], "unknown part 'eyes'"),
    (["--part_lr", "vision=1e-5"], "the vision part is not trained"),
    (["--finetune", "full", "--hf_adapter", "x"], "--hf_adapter: an adapter is trained with --finetune lora"),
    (["dual", "--train_parts", "vision"], "--train_parts: generative models only"),
])
def test_bad_combinations_are_one_line_with_exit_2(tmp_path, inputs, capsys, extra, expected):
    from volta_ml.cli import main
    kind = "clip" if "dual" in extra else "lora"
    code = main(["train", *_argv(inputs, kind, tmp_path, *[e for e in extra if e != "dual"])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("volta-ml train: error: ") and expected in err[-1], err[-3:]


def test_zoo_models_are_not_sharded(tmp_path, capsys):
    from helpers_train import toy_argv
    from volta_ml.testing.toy_train import main as toy_main
    code = toy_main(toy_argv(tmp_path, "--sharding", "fsdp")[3:])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "--sharding fsdp: this job's model cannot be sharded" in err[-1], err[-3:]


def test_parts_and_their_learning_rates(inputs):
    """--train_parts / --part_lr on a Qwen2-VL: the vision tower without the projector nested in it (visual.merger),
    the projector, the language model; one optimiser group per part and decay rule, a part's own rate."""
    from types import SimpleNamespace
    from transformers import AutoModelForImageTextToText
    from volta_ml.hf.families import FAMILIES
    from volta_ml.iglue_hf import finetune
    model = AutoModelForImageTextToText.from_pretrained(inputs["qwen"])
    modules = finetune.part_modules(model, FAMILIES["qwen2_vl"].projector, "qwen")
    assert modules == {"vision": "model.visual", "projector": "model.visual.merger"}
    args = SimpleNamespace(finetune="full", train_parts="vision,projector", train_projector=False,
                           part_lr="vision=1e-5", hf_adapter="")
    plan = finetune.plan(args)
    finetune.freeze_full(model, modules, plan.parts)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith("model.visual.") for n in trained)
    groups = finetune.param_groups_by_part(model, modules, plan.lrs, weight_decay=0.01)
    by_id = {id(p): n for n, p in model.named_parameters()}
    named = [({by_id[id(p)] for p in g["params"]}, g.get("lr"), g["weight_decay"]) for g in groups]
    assert sum(len(n) for n, _, _ in named) == len(trained)
    for names, lr, decay in named:
        merger = {".merger." in n for n in names}
        assert len(merger) == 1 and (lr is None) == merger.pop()     # the projector at --lr, the tower at 1e-5
        assert (decay == 0.0) == all(n.endswith("bias") for n in names)
    assert len(finetune.shard_units(model)) == 3                       # 1 vision block, 2 decoder layers


@pytest.mark.parametrize("case, expected", [
    ("lora_r", "another model's resume file (saved from model {qwen} (qwen2_vl), LoRA r 4 on q_proj,v_proj"),
    ("ddp_file", "written by a --sharding ddp run (or by VOLTA); resume it with --sharding ddp"),
    ("metadata", "is damaged or unreadable (.metadata: "),
    ("distcp", ".distcp: "),
    ("swapped", "holds another model's tensors: "),
])
def test_a_resume_state_that_does_not_fit_is_one_line(runs, inputs, tmp_path, capsys, case, expected):
    """Another model's file or state, a DDP run's file, a damaged state (its .metadata overwritten at the start, its
    data files cut in half) or the folder of another run (the full fine-tuning's) under a LoRA run's resume file:
    one line, no traceback (torch.distributed.checkpoint logs its own through the root logger)."""
    import shutil
    from volta_ml.cli import main
    d, _, _ = runs
    source, extra = ("lora", ["--lora_r", "8"]) if case == "lora_r" else ("lora_ddp", []) if case == "ddp_file" \
        else ("lora", [])
    path = d[source] / "save" / RUN["lora"] / "pytorch_ckpt_latest.tar"
    if case in ("metadata", "distcp", "swapped"):
        shutil.copytree(path.parent, tmp_path / "copy", ignore=shutil.ignore_patterns("*.bin", "hf_best"))
        path = tmp_path / "copy" / path.name
        folder = path.parent / "pytorch_ckpt_latest.shards" / torch.load(path, weights_only=True)["sharded"]["folder"]
        if case == "metadata":
            (folder / ".metadata").write_bytes(b"garbage!" + (folder / ".metadata").read_bytes()[8:])
        elif case == "distcp":
            for part in folder.glob("*.distcp"):
                part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
        else:
            full = d["full"] / "save" / RUN["full"]
            shutil.rmtree(folder)
            shutil.copytree(full / "pytorch_ckpt_latest.shards" /
                            torch.load(full / "pytorch_ckpt_latest.tar", weights_only=True)["sharded"]["folder"], folder)
    capsys.readouterr()
    code = main(["train", *_argv(inputs, "lora", tmp_path, *FSDP, *extra, "--resume_file", str(path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(f"volta-ml train: error: --resume_file {path}: "), err[-3:]
    assert expected.format(qwen=inputs["qwen"]) in err[-1], err[-1]
    assert not any("Traceback" in line or "metadata is not found" in line for line in err), err
    assert "does not fit" not in err[-1]
    assert not (tmp_path / "save" / RUN["lora"] / "pytorch_model_0.bin").exists()
