"""gpu_check.py's checks of the VOLTA model zoo: each a function of a `Context`, built on the benchmarks' own
functions (bench_model.one_run, bench_retrieval.time_volta/time_ours, bench_extract.run_one, bench_cvqa's
synthetic release, bench_train's site) so the check and the benchmarks cannot drift apart."""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from volta_ml.testing.reference import fixture_folders, shared_path  # noqa: E402
BASE_CONFIGS = ("uc2_base", "ctrl_xuniter_base", "ctrl_vilbert_base", "ctrl_lxmert")
QUICK_CONFIGS = ("uc2_base", "ctrl_lxmert")  # one single-stream, one dual-stream layout

# Dense peak TFLOP/s per device (vendor data sheets, SXM parts; no sparsity). The first matching name wins.
PEAKS = [("H200", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),
         ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.2}),
         ("H100", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),
         ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
         ("L40S", {"bf16": 362.1, "tf32": 181.0, "fp32": 91.6})]


def peak_tflops(ctx) -> dict:
    """{"bf16": TF, "fp32": TF, "source": ...}: fp32 matmuls use the TF32 peak when torch allows TF32."""
    import torch
    if ctx.peak_tflops:
        return {**ctx.peak_tflops, "source": "--peak-tflops"}
    if not ctx.device.startswith("cuda"):
        return {"bf16": None, "fp32": None, "source": "no peak known for a CPU (pass --peak-tflops)"}
    name = torch.cuda.get_device_name()
    for key, peaks in PEAKS:
        if key in name:
            tf32 = torch.get_float32_matmul_precision() != "highest"
            return {"bf16": peaks["bf16"], "fp32": peaks["tf32" if tf32 else "fp32"],
                    "source": f"{key} data sheet, dense" + (", fp32 = TF32 peak" if tf32 else "")}
    return {"bf16": None, "fp32": None, "source": f"{name!r} not in the peak table (pass --peak-tflops)"}


def check_device(ctx) -> None:
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": ctx.device,
            "float32_matmul_precision": torch.get_float32_matmul_precision(), "cpu_threads": torch.get_num_threads()}
    if ctx.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, count=torch.cuda.device_count(), memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())
    ctx.row(item="device", **info, peak_tflops=peak_tflops(ctx))


# ---- parity ----------------------------------------------------------------------------------------------------

def load_for_parity_on_device(fixture_dir: str, kind: str = "tasks", dtype=None):
    """check_parity.py's loader contract, on the device named by GPU_CHECK_DEVICE."""
    import torch
    from volta_ml.testing.parity import load_for_parity
    return load_for_parity(fixture_dir, kind, dtype or torch.float32, device=os.environ.get("GPU_CHECK_DEVICE", "cpu"))


PREFERRED_QUICK = "uc2_base__A"  # --quick checks one fixture (tests/test_model_parity.py checks them all)


def golden_folder() -> Path | None:
    """The first golden folder (VOLTA_ML_GOLDEN, else <shared>/golden) that has a manifest."""
    found = [f for f in fixture_folders("VOLTA_ML_GOLDEN", "golden") if (f / "manifest.json").is_file()]
    return found[0] if found else None


def quick_fixture(names: list[str], kinds: dict[str, str]) -> str | None:
    """The fixture --quick checks, chosen from what the folder holds: the preferred one if it is there, else the
    first tasks fixture whose name is in no other model fixture's name (check_parity.py's --only is a substring
    filter; hf_init fixtures are skipped without --hf-loader)."""
    models = [n for n in names if kinds.get(n, "tasks") != "hf_init"]
    tasks = [n for n in models if kinds.get(n, "tasks") == "tasks"]
    if PREFERRED_QUICK in tasks:
        return PREFERRED_QUICK
    return next((n for n in tasks if sum(n in other for other in models) == 1), None)


def _fixtures(golden: Path, quick: bool) -> list[Path]:
    """Every fixture a tasks model runs (all but hf_init); one with --quick."""
    manifest = json.loads((golden / "manifest.json").read_text())
    kinds = {fx["name"]: fx.get("kind", "tasks") for fx in manifest["fixtures"]}
    names = list(kinds)
    chosen = [quick_fixture(names, kinds)] if quick else [n for n in names if kinds[n] != "hf_init"]
    return [golden / n for n in chosen if n is not None]


def check_parity(ctx) -> None:
    golden, check_parity_py = golden_folder(), shared_path("tools", "check_parity.py")
    if golden is None or not check_parity_py.is_file():
        ctx.row(item="parity", status="skipped", reason=f"no golden fixtures (VOLTA_ML_GOLDEN, else "
                f"{shared_path('golden')}) or no {check_parity_py}")
        return
    fixtures = _fixtures(golden, ctx.quick)
    if not fixtures:
        ctx.row(item="parity", status="skipped", reason=f"{golden} holds no tasks fixture to compare")
        return
    cmd = [sys.executable, str(check_parity_py), str(golden), "--loader",
           f"{Path(__file__).resolve()}:load_for_parity_on_device", "--dtype", "float32"]
    if ctx.quick:
        cmd += ["--only", fixtures[0].name]
    env = dict(os.environ, GPU_CHECK_DEVICE=ctx.device, PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(10.0, ctx.left() - 5))
    summary = re.search(r"SUMMARY: (\d+) ok, (\d+) failed, (\d+) skipped", proc.stdout)
    failures = [line for line in proc.stdout.splitlines() if line.startswith("[FAIL")]
    compared = int(summary.group(1)) + int(summary.group(2)) if summary else None
    item = f"fp32 parity ({check_parity_py.name} on {golden}, atol = rtol = 1e-4)"
    if proc.returncode == 0 and compared == 0:  # nothing compared is not a pass
        ctx.row(item=item, status="skipped", reason=f"check_parity.py compared nothing in {golden}",
                compared=0, failed=0)
        return
    ctx.row(item=item, status="ok" if proc.returncode == 0 and summary else "failed",
            compared=compared, failed=int(summary.group(2)) if summary else None, failures=failures[:10],
            stderr=proc.stderr[-1500:] if proc.returncode else "")
    _bf16_drift(ctx, fixtures)


def _bf16_drift(ctx, fixtures: list[Path]) -> None:
    """Logits under bf16 autocast against the fp32 goldens: the drift training and eval in bf16 accept."""
    import torch
    device_type = "cuda" if ctx.device.startswith("cuda") else "cpu"
    for fdir in fixtures:
        meta = json.loads((fdir / "meta.json").read_text())
        inputs = torch.load(fdir / "inputs.pt", map_location="cpu", weights_only=True)
        expected = torch.load(fdir / "expected.pt", map_location="cpu", weights_only=True)
        run = _runner(fdir, ctx.device)
        worst_abs, worst_scale = 0.0, 0.0
        for batch_name, outputs in expected.items():
            tids = meta.get("single_batch_tasks" if batch_name == "single" else "pair_batch_tasks", [])
            with torch.autocast(device_type, dtype=torch.bfloat16):
                got = run({k: v.clone() for k, v in inputs[batch_name].items()}, tids)
            for key, exp in outputs.items():
                if key.startswith("logits/") and key in got:
                    diff = (got[key].float().cpu() - exp.float()).abs().max().item()
                    worst_abs = max(worst_abs, diff)
                    worst_scale = max(worst_scale, exp.abs().max().item())
        ctx.row(item=f"bf16 drift {fdir.name}", max_abs_logit_diff=worst_abs,
                relative=worst_abs / worst_scale if worst_scale else None)


def _runner(fdir: Path, device: str):
    import torch
    from volta_ml.testing.parity import load_for_parity
    return load_for_parity(str(fdir), "tasks", torch.float32, device=device)


# ---- training step and MFU -----------------------------------------------------------------------------------

def train_config(name: str, quick: bool, vocab_size: int = 1000):
    """A real base config by name, or (quick) the same layout at width 64 (bench_retrieval's tiny size) and a
    small vocabulary."""
    if not quick:
        return name
    import bench_retrieval
    return {**bench_retrieval.make_config(name, "tiny").to_dict(), "vocab_size": vocab_size}


def _one_run(config_source, precision, device, batch, steps, warmup) -> dict:
    import bench_model
    kwargs = dict(config_name=config_source, precision=precision, device=device, batch=batch, steps=steps,
                  warmup=warmup)
    if "compile_model" in inspect.signature(bench_model.one_run).parameters:
        kwargs["compile_model"] = False
    return bench_model.one_run(**kwargs)


def check_train_step(ctx) -> None:
    import bench_model
    peaks = peak_tflops(ctx)
    batch, steps, warmup = (2, 1, 0) if ctx.quick else (64, 5, 1)
    device = "cuda" if ctx.device.startswith("cuda") else "cpu"
    for name in QUICK_CONFIGS if ctx.quick else BASE_CONFIGS:
        source = train_config(name, ctx.quick)
        flops = bench_model.flops_per_sample(source)
        for precision in ("fp32", "bf16"):
            if ctx.skip_if_late(f"{name} {precision}", 2 if ctx.quick else 15):
                continue
            r = _one_run(source, precision, device, batch, steps, warmup)
            peak = peaks.get(precision)
            reference = r.get("reference_step_s")  # VOLTA's per-tensor AdamW on the same step (bench_model)
            ctx.row(item=f"{name} {precision}", config=name, precision=precision, batch=batch,
                    samples_per_s=r["samples_per_s"], step_s=r["step_s"],
                    forward_s=r.get("forward_s"), backward_s=r.get("backward_s"), optimizer_s=r.get("optimizer_s"),
                    volta_scheme_samples_per_s=batch / reference if reference and precision == "fp32" else None,
                    flops_per_sample=flops, tflops=flops * r["samples_per_s"] / 1e12,
                    mfu=flops * r["samples_per_s"] / (peak * 1e12) if peak else None,
                    peak_tflops=peak, peak_gib=r.get("peak_gib"), params_m=r.get("params_m"))


def check_pretrain(ctx) -> None:
    """train_concap.py's step (three losses, heads on the masked slots, AdamW) at the base configs, batch 64."""
    import bench_pretrain
    batch, steps = (2, 1) if ctx.quick else (64, 5)
    device = "cuda" if ctx.device.startswith("cuda") else "cpu"
    for name in ("ctrl_lxmert",) if ctx.quick else ("ctrl_vilbert_base", "ctrl_xuniter_base"):
        source = train_config(name, ctx.quick)
        for precision in ("fp32", "bf16"):
            if ctx.skip_if_late(f"{name} {precision}", 2 if ctx.quick else 25):
                continue
            r = bench_pretrain.measure(source, device, "bf16" if precision == "bf16" else "none", batch, steps)
            ctx.row(item=f"pretrain {name} {precision}", config=name, precision=precision, batch=batch, **r)


# ---- retrieval, extraction, CVQA (zoo) -------------------------------------------------------------------------

def check_retrieval(ctx) -> None:
    import bench_retrieval as br
    size, captions, images = ("tiny", 2, 8) if ctx.quick else ("base", 8, 256)
    precision = "bf16" if ctx.device.startswith("cuda") else "fp32"
    for family in ("ctrl_uniter_base", "ctrl_vilbert_base"):
        if ctx.skip_if_late(family, 3 if ctx.quick else 20):
            continue
        volta = br.time_volta(family, size, captions, images, ctx.device, 1)
        ours = br.time_ours(family, size, captions, images, ctx.device, precision, 1, 1, 256)
        pairs = captions * images
        ctx.row(item=family, size=size, pairs=pairs, volta_scheme_pairs_per_s=pairs / volta,
                pairs_per_s=pairs / ours, precision=precision, vs_volta=volta / ours)


def check_extraction(ctx) -> None:
    import bench_extract
    presets, size, n = (("volta-x101",), "tiny", 1) if ctx.quick else (("volta-butd36", "volta-x101"), "default", 8)
    for preset in presets:
        if ctx.skip_if_late(preset, 5 if ctx.quick else 15):
            continue
        r = bench_extract.run_one(preset, size, ctx.device, n, os.cpu_count() or 1)
        ctx.row(item=f"{preset} {size}", images_per_s=r["img_per_s"], input=r["input"], weights=r["weights"],
                images=n, peak_gpu_mib=r["peak_gpu_mib"])


def check_cvqa_zoo(ctx) -> None:
    import torch

    import bench_cvqa
    from volta_ml.cvqa.data import load_cvqa
    from volta_ml.cvqa.zoo import MatchingScorer, score_condition
    from volta_ml.data.text import load_tokenizer
    from volta_ml.models import build_model, load_config
    from volta_ml.tasks.regions import open_region_view

    questions, batch = (8, 8) if ctx.quick else (512, 256)
    device = torch.device(ctx.device)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dataset = load_cvqa(bench_cvqa.write_release(tmp / "cvqa", questions))
        bench_cvqa.write_store(tmp / "feats", dataset.image_ids, 2048)
        tokenizer = load_tokenizer(str(bench_cvqa.bert_vocab_dir(tmp)), do_lower_case=True)
        for name in ("ctrl_xuniter_base",) if ctx.quick else ("ctrl_xuniter_base", "uc2_base"):
            config = load_config(train_config(name, ctx.quick, vocab_size=30522))  # bert-base-uncased ids
            model = build_model(config, kind="pretraining").to(device).eval()
            view = open_region_view(str(tmp / "feats"), config, {"name": "CVQA", "max_region_num": 36})
            for amp in ((False, True) if device.type == "cuda" else (False,)):
                if ctx.skip_if_late(f"{name} amp={amp}", 2 if ctx.quick else 8):
                    continue
                scorer = MatchingScorer(model)
                run = lambda qs: score_condition(scorer, qs, "en-aware", tokenizer, view,  # noqa: E731
                                                 batch_size=batch, device=device, amp=amp, progress=False)
                run(dataset.questions[: max(1, batch // 4)])  # warm-up
                _sync(device)
                start = time.perf_counter()
                run(dataset.questions)
                _sync(device)
                seconds = time.perf_counter() - start
                ctx.row(item=f"{name} {'bf16' if amp else 'fp32'}", config=name, questions=len(dataset.questions),
                        questions_per_s=len(dataset.questions) / seconds, pairs_per_s=4 * len(dataset.questions) / seconds)
            del model


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---- DDP -----------------------------------------------------------------------------------------------------------

def check_ddp(ctx) -> None:
    import torch
    import bench_retrieval as br
    gpus = torch.cuda.device_count() if ctx.device.startswith("cuda") else 0
    if ctx.device.startswith("cuda") and gpus < 2:
        ctx.row(item="ddp", status="skipped", reason=f"{gpus} GPU visible; scaling needs 2")
        return
    # CPU (--quick): 2 gloo ranks on tiny sizes, so the multi-process path is exercised where no 2 GPUs are
    size, captions, images = ("tiny", 4, 8) if ctx.quick else ("base", 16, 512)
    precision = "bf16" if gpus else "fp32"
    one = br.time_ours("ctrl_uniter_base", size, captions, images, ctx.device, precision, 1, 1, 256)
    two = br.time_ours("ctrl_uniter_base", size, captions, images, ctx.device, precision, 2, 1, 256)
    ctx.row(item="retrieval ctrl_uniter_base, 1 vs 2 ranks", pairs=captions * images, seconds_1=one, seconds_2=two,
            speedup=one / two, efficiency=one / (2 * two))
    if gpus >= 2 and not ctx.skip_if_late("train_task.py 1 vs 2 GPUs", 60):
        _train_scaling(ctx)


def _train_scaling(ctx) -> None:
    import argparse

    import bench_train
    args = argparse.Namespace(epochs=2, batch_size=64, grad_acc=1, num_workers=2, amp="bf16", device="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        site = bench_train.build_site(work, "ctrl_uniter_base", 512)
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
        try:
            _, one = bench_train.run([sys.executable, str(REPO / "train_task.py"),
                                      *bench_train.train_command(work, site, args, "one")], env)[:2]
            _, two = bench_train.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc_per_node", "2", str(REPO / "train_task.py"),
                                      *bench_train.train_command(work, site, args, "two")], env)[:2]
        except SystemExit as err:  # bench_train reports a failed run by exiting
            raise RuntimeError(str(err)[-2000:]) from None
    ctx.row(item="train_task.py ctrl_uniter_base, 1 vs 2 GPUs (bf16, --batch_size 64)", samples_per_s_1=one,
            samples_per_s_2=two, efficiency=two / (2 * one))
