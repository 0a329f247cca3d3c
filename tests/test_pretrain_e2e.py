"""Pretraining on the engine, end to end: pretrain -> fine-tune (train_task.py --from_pretrained) -> zero-shot
retrieval (eval_retrieval.py --zero_shot) and the CVQA zoo loader; SIGKILL + resume bit-identical (with the
interleaved Wikipedia step, carried-over gradients and NCE's random negatives); 2 gloo ranks; bad inputs (one line,
exit 2: also from a DataLoader worker); LMDB's one-file layout at every store entry point, truncated and garbage
LMDBs."""
from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_eval import FEATURE_DIM, tiny_config_file
from helpers_pretrain import WORDS, make_feature_store, make_pretrain_data, tiny_vocab
from helpers_tasks import REPO, make_store
from helpers_train import assert_same_weights, free_port, load_weights, toy_env

pytestmark = pytest.mark.usefixtures("one_thread")
HELPER = str(Path(__file__).resolve().parent / "helpers_pretrain_train.py")
TRAINVAL = "config_tasks/iglue_trainval_tasks_boxes36.yml"
TEST_TASKS = "config_tasks/iglue_test_tasks_boxes36.yml"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """VOLTA's pretraining folder (helpers_pretrain: td-LMDBs, captions, Wikipedia text, a WordPiece tokenizer),
    an XVNLI-style training file and a Flickr-style caption file over images of a native store, tiny configs."""
    tmp = tmp_path_factory.mktemp("pretrain")
    data = make_pretrain_data(tmp / "cc", n_images=16, n_val=4, n_regions=10, feature_dim=FEATURE_DIM,
                              langs=("en", "de"), wiki_lines=30)
    ids = [str(1000 + i) for i in range(8)]
    rows = [{"gold_label": ["entailment", "neutral", "contradiction"][i % 3],
             "sentence2": " ".join(WORDS[i:i + 5]), "Flikr30kID": image} for i, image in enumerate(ids)]
    captions = {image: " ".join(WORDS[2 * i:2 * i + 6]) for i, image in enumerate(ids)}
    (tmp / "ve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "captions.jsonl").write_text("".join(json.dumps({"sentences": [text], "img_path": f"{image}.jpg"}) + "\n"
                                                for image, text in captions.items()))
    make_store(tmp / "data/flickr30k/features/flickr30k_boxes36.lmdb", ids, FEATURE_DIM)
    config = tiny_config_file(tmp / "config/tiny_uniter.json", vocab_size=len(tiny_vocab()))
    wide = json.loads(config.read_text())      # 2048-d features: NCE (2) beside KL (0), for the resume test
    wide.update(v_feature_size=2048, visual_target_weights={"0": 1.0, "2": 1.0})
    (tmp / "config/wide.json").write_text(json.dumps(wide))
    # 46 images at 2 per micro-batch = 23 micro-batches with grad-acc 2: the odd one's gradients carry into the
    # next epoch's first (Wikipedia) optimizer step, and into the resume file
    wide_data = make_pretrain_data(tmp / "cc_wide", n_images=46, n_val=4, n_regions=6, feature_dim=2048, n_parts=0,
                                   langs=("en", "de"), wiki_lines=20, seed=1)
    return {"tmp": tmp, "data": data, "config": config, "wide": tmp / "config/wide.json", "bert": data.tokenizer,
            "wide_data": wide_data, "store": tmp / "data/flickr30k/features/flickr30k_boxes36.lmdb"}


def pretrain_flags(site, out: Path, *extra, wiki=False, config=None, data=None) -> list[str]:
    data = data or site["data"]
    flags = ["--config_file", str(config or site["config"]), "--bert_model", str(site["bert"]), "--do_lower_case",
             "--annotations_path", str(data.annotations), "--features_path", str(data.features),
             "--num_workers", "0", "--num_val_workers", "0", "--output_dir", str(out / "ckpt"),
             "--logdir", str(out / "tb"), "--device", "cpu", "--learning_rate", "1e-3", "--no_cache"]
    flags += ["--m_pretrained", "", "--dataroot", str(data.wiki), "--lgs", "en-de", "--max_m_seq_length", "16"] \
        if wiki else ["--from_pretrained", ""]
    return flags + list(extra)


# ---- pretrain -> fine-tune -> zero-shot ---------------------------------------------------------------------------

def test_pretrain_then_finetune_then_zero_shot_retrieval(site, capsys):
    from volta_ml.cli import eval_retrieval, train_task
    from volta_ml.engine.run_setup import load_model
    from volta_ml.models import load_config
    from volta_ml.pretrain.cli import main

    out = site["tmp"] / "chain"
    assert main(pretrain_flags(site, out, "--train_batch_size", "4", "--num_train_epochs", "2",
                               "--objective", "1", "--max_seq_length", "12")) == 0
    run_dir = out / "ckpt" / "tiny_uniter"
    lines = (run_dir / "out.txt").read_text().splitlines()
    assert sum(bool(re.fullmatch(r"Validation \[Conceptual_Caption\]: masked_t [\d.]+ masked_v [\d.]+ NSP [\d.]+",
                                 line)) for line in lines) == 2
    assert "Best Validation score" not in capsys.readouterr().out      # pretraining has no score
    pretrained = run_dir / "pytorch_model_1.bin"
    state = load_weights(pretrained)
    assert any(k.startswith("cls.bi_seq_relationship.") for k in state) and any(k.startswith("bert.") for k in state)
    assert not torch.equal(state["cls.bi_seq_relationship.weight"],
                           load_weights(run_dir / "pytorch_model_-1.bin")["cls.bi_seq_relationship.weight"])
    assert list((out / "tb" / "tiny_uniter").glob("events.out.tfevents.*"))
    # the CVQA zoo and eval_retrieval --zero_shot load it as a pretraining model: nothing missing
    _, report = load_model(load_config(str(site["config"])), str(pretrained), kind="pretraining")
    assert report.missing_keys == [] and report.unexpected_keys == []

    common = ["--bert_model", str(site["bert"]), "--do_lower_case", "--config_file", str(site["config"]),
              "--from_pretrained", str(pretrained), "--device", "cpu", "--no_cache"]
    tmp = site["tmp"]
    code = train_task.main(common + ["--tasks_config_file", TRAINVAL, "--task", "19", "--data_root",
                                     str(tmp / "data"), "--train_annotations_jsonpath", str(tmp / "ve.jsonl"),
                                     "--val_annotations_jsonpath", str(tmp / "ve.jsonl"), "--num_epoch", "1",
                                     "--batch_size", "4", "--num_workers", "0", "--num_val_workers", "0",
                                     "--output_dir", str(out / "ft"), "--logdir", str(out / "ft_tb")])
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("Best Validation score: ")
    finetuned = load_weights(out / "ft" / "XVNLI_tiny_uniter" / "pytorch_model_best.bin")
    assert "clfs_dict.TASK19.weight" in finetuned and not any(k.startswith("cls.") for k in finetuned)

    code = eval_retrieval.main(common + ["--zero_shot", "--tasks_config_file", TEST_TASKS, "--task", "8",
                                         "--split", "test", "--val_annotations_jsonpath", str(tmp / "captions.jsonl"),
                                         "--val_features_lmdbpath", str(site["store"]), "--batch_size", "1",
                                         "--caps_per_image", "1", "--output_dir", str(out / "zs")])
    assert code == 0
    stdout = capsys.readouterr().out
    assert len([line for line in stdout.splitlines() if line.startswith("Final r1:")]) == 2


def test_wiki_script_interleaves_a_wikipedia_step(site):
    """train_concap_wiki.py (in bf16 autocast): one Wikipedia optimizer step before each Conceptual Captions one."""
    from volta_ml.models import build_model, load_config
    from volta_ml.pretrain.cli import main_wiki
    from volta_ml.pretrain.job import pretrain_param_groups

    out = site["tmp"] / "wiki"
    assert main_wiki(pretrain_flags(site, out, "--train_x_batch_size", "4", "--train_m_batch_size", "6",
                                    "--num_train_epochs", "1", "--max_x_seq_length", "12", "--amp", "bf16",
                                    wiki=True)) == 0
    run_dir = out / "ckpt" / "tiny_uniter"
    assert "Validation [Conceptual_CaptionplusWikipedia]: masked_t" in (run_dir / "out.txt").read_text()
    latest = torch.load(run_dir / "pytorch_ckpt_latest.tar", weights_only=True)
    assert latest["global_step"] == 4                          # 16 captions, batch 4: the schedule's steps
    # each step is preceded by a Wikipedia step of its own; the heads the MLM loss does not reach join those steps
    # with zero gradients once they have been stepped (VOLTA's zero_grad zeroes): all but the first
    model = build_model(load_config(str(site["config"])), kind="pretraining")
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = [name_of[id(p)] for g in pretrain_param_groups(model, 1e-3, 0.01, None, 0.1) for p in g["params"]]
    steps = {names[int(i)]: int(state["step"]) for i, state in latest["optimizer_state_dict"]["state"].items()}
    assert steps["bert.embeddings.word_embeddings.weight"] == 8 and steps["cls.bi_seq_relationship.weight"] == 7
    assert set(steps.values()) == {7, 8}


# ---- exact resume after SIGKILL -----------------------------------------------------------------------------------

RESUME = ["--train_x_batch_size", "4", "--train_m_batch_size", "4", "--gradient_accumulation_steps", "2",
          "--num_train_epochs", "2", "--checkpoint_every_steps", "1", "--max_x_seq_length", "12"]


def test_sigkill_then_resume_gives_the_uninterrupted_weights(site, tmp_path):
    """train_concap_wiki.py with NCE (random negatives from the torch RNG), the Wikipedia step and gradients carried
    over the epoch end, killed at a random step and resumed: the weights of the uninterrupted run, bit for bit."""
    from volta_ml.pretrain.cli import main_wiki

    flags = functools.partial(pretrain_flags, site, wiki=True, config=site["wide"], data=site["wide_data"])
    assert main_wiki(flags(tmp_path / "reference", *RESUME)) == 0
    expected = load_weights(tmp_path / "reference" / "ckpt" / "wide" / "pytorch_model_1.bin")

    out = tmp_path / "killed"
    argv = [sys.executable, HELPER, "--wiki", *flags(out, *RESUME)]
    proc = subprocess.Popen(argv + ["--sleep", "0.02"], env=toy_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    latest = out / "ckpt" / "wide" / "pytorch_ckpt_latest.tar"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and torch.load(latest, weights_only=True)["global_step"] >= 2:
            break
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 0.8))
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "ckpt" / "wide" / "pytorch_model_1.bin").exists(), "the run finished before the kill"
    resumed = subprocess.run([sys.executable, "train_concap_wiki.py", *flags(out, *RESUME), "--resume_file",
                              str(latest)], cwd=REPO, env=toy_env(), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stderr
    assert_same_weights(load_weights(out / "ckpt" / "wide" / "pytorch_model_1.bin"), expected, exact=True)


# ---- two processes --------------------------------------------------------------------------------------------------

def test_two_gloo_ranks_read_volta_part_files(site, tmp_path):
    """train_concap.py under torchrun; without training_feat_all.lmdb each rank reads its own part, as VOLTA."""
    parts = tmp_path / "features"
    shutil.copytree(site["data"].features, parts)
    shutil.rmtree(parts / "training_feat_all.lmdb")
    argv = pretrain_flags(site, tmp_path, "--train_batch_size", "4", "--num_train_epochs", "1",
                          "--max_seq_length", "12")
    argv[argv.index("--features_path") + 1] = str(parts)
    for _attempt in range(3):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(free_port()), "train_concap.py", *argv], cwd=REPO,
                              env=toy_env(), capture_output=True, text=True, timeout=180)
        if "Address already in use" not in proc.stderr and "EADDRINUSE" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world size 2" in proc.stderr and "2 per step x 1 accumulation x 2 processes = 4 effective" in proc.stderr
    assert "train 8 examples" in proc.stderr          # rank 0's part: 8 of the 16 images, not sharded again
    run_dir = tmp_path / "ckpt" / "tiny_uniter"
    text = (run_dir / "out.txt").read_text()
    assert text.count("Validation [Conceptual_Caption]: masked_t") == 1      # rank 0 writes
    before, after = load_weights(run_dir / "pytorch_model_-1.bin"), load_weights(run_dir / "pytorch_model_0.bin")
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert not torch.equal(before["bert.embeddings.word_embeddings.weight"],
                           after["bert.embeddings.word_embeddings.weight"])


# ---- bad inputs: one line, exit 2 ---------------------------------------------------------------------------------

def test_bad_inputs_are_one_line_and_exit_2(site, tmp_path, capsys):
    from volta_ml.cli import main as volta_ml_main
    from volta_ml.pretrain.cli import main

    data = site["data"]
    no_cls = make_feature_store(tmp_path / "no_cls", data, fields=("objects_id", "objects_conf"))
    lacking = make_feature_store(tmp_path / "lacking", data, ids=data.train_ids[1:] + data.val_ids)
    mse = json.loads(site["config"].read_text())
    mse["visual_target_weights"] = {"1": 1.0}            # regresses 2048-d features; this config has 16
    (tmp_path / "mse.json").write_text(json.dumps(mse))
    cases = [
        (main, ["--objective", "3"], "train_concap.py: error: --objective 3: VOLTA's objectives are"),
        (main, ["--from_pretrained", str(tmp_path / "nope")], f"--from_pretrained {tmp_path / 'nope'}: not a file"),
        (main, ["--config_file", str(tmp_path / "mse.json")], "visual target 1 (MSE-2048"),
        (main, ["--features_path", str(no_cls)], "cls_prob"),
        (main, ["--features_path", str(lacking)], data.train_ids[0]),
        (lambda argv: volta_ml_main(["pretrain", *argv]), ["--objective", "7"],
         "volta-ml pretrain: error: --objective 7: VOLTA's objectives are"),
    ]
    for entry, extra, expected in cases:
        flags = pretrain_flags(site, tmp_path)
        for i in range(0, len(extra), 2):           # the case's flags replace the defaults
            if extra[i] in flags:
                del flags[flags.index(extra[i]):flags.index(extra[i]) + 2]
        capsys.readouterr()
        assert entry(flags + extra) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and expected in err.strip().splitlines()[-1], err[-2000:]


def _last_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def test_an_empty_captions_file_is_refused_before_training(site, tmp_path, capsys):
    """caption_train.json `{}` beside VOLTA's td-LMDBs (whose records carry their captions): the negative captions
    of image-text matching would all be empty; one line names the file."""
    from volta_ml.pretrain.cli import main

    annotations = tmp_path / "annotations"
    shutil.copytree(site["data"].annotations, annotations)
    (annotations / "caption_train.json").write_text("{}")
    flags = pretrain_flags(site, tmp_path, "--train_batch_size", "4", "--num_train_epochs", "1")
    flags[flags.index("--annotations_path") + 1] = str(annotations)
    assert main(flags) == 2
    line = _last_line(capsys.readouterr().err)
    assert f"{annotations / 'caption_train.json'}: no captions" in line and "objective 0" in line
    assert not (tmp_path / "ckpt" / "tiny_uniter" / "pytorch_model_0.bin").exists()


def test_features_of_another_width_than_the_config_are_refused(site, tmp_path, capsys):
    """2048-wide records for a config of v_feature_size 16: one line naming the store, the width and the config."""
    from volta_ml.pretrain.cli import main

    wide = site["wide_data"].features
    flags = pretrain_flags(site, tmp_path, "--train_batch_size", "4", "--num_train_epochs", "1")
    flags[flags.index("--features_path") + 1] = str(wide)
    flags[flags.index("--annotations_path") + 1] = str(site["wide_data"].annotations)
    assert main(flags) == 2
    line = _last_line(capsys.readouterr().err)
    assert str(wide / "training_feat_all.lmdb") in line and "2048-wide region features" in line
    assert f"v_feature_size of {site['config']} is 16" in line


def _store_missing_in_one_record(path, data, image_id, cls_prob_rows=None):
    """A native store of `data`'s images where `image_id` has no cls_prob (or `cls_prob_rows` rows of it)."""
    from volta_ml.features import open_writer

    with open_writer(path, "native") as writer:
        for i in data.train_ids + data.val_ids:
            r = data.records[i]
            extra = {"cls_prob": r["cls_prob"]}
            if i == image_id:
                extra = {} if cls_prob_rows is None else {"cls_prob": r["cls_prob"][:cls_prob_rows]}
            writer.put(i, r["features"], r["boxes"], 640, 480, **extra)
    return path


def test_an_input_error_in_a_dataloader_worker_is_the_same_one_line(site, tmp_path, capsys):
    """A record past the first lacking cls_prob (PretrainDataError) or holding it for too few regions
    (FeatureStoreError, which torch re-raises as a RuntimeError): with --num_workers 2 the same one line and exit
    code as with 0 workers, no worker traceback."""
    from volta_ml.pretrain.cli import main

    data = site["data"]
    bad = data.train_ids[5]
    for name, rows, expected in (("no_cls", None, "has no cls_prob"), ("short_cls", 3, "cls_prob of shape (3, 1601)")):
        store = _store_missing_in_one_record(tmp_path / name, data, bad, rows)
        lines = []
        for workers in ("0", "2"):
            flags = pretrain_flags(site, tmp_path / f"{name}{workers}", "--train_batch_size", "4",
                                   "--num_train_epochs", "1", "--max_seq_length", "12")
            flags[flags.index("--features_path") + 1] = str(store)
            flags[flags.index("--num_workers") + 1] = workers
            assert main(flags) == 2
            lines.append(_last_line(capsys.readouterr().err))
        assert lines[0] == lines[1] and expected in lines[0] and bad in lines[0], lines


def test_fractional_looking_image_sizes_are_read_as_volta_reads_them(site, tmp_path):
    """Conceptual Captions records whose image_h / image_w / num_boxes are "480.0"-style strings, read as a feature
    store (--features_path the td-LMDB itself) and in VOLTA's layout: VOLTA's float() reading, the batches of the
    integer records."""
    from helpers_pretrain import write_td_lmdb

    data = site["data"]
    records = {i: {**data.records[i], "image_h": "480.0", "image_w": "640.0",
                   "num_boxes": f"{data.records[i]['num_boxes']}.0"} for i in data.train_ids + data.val_ids}
    store = write_td_lmdb(tmp_path / "cc_floats.lmdb", list(records.values()))
    _pretrains_as_from_volta_s_layout(site, tmp_path / "store", store)
    folder = tmp_path / "volta_layout"
    for name, ids in (("training_feat_all.lmdb", data.train_ids), ("validation_feat_all.lmdb", data.val_ids)):
        write_td_lmdb(folder / name, [records[i] for i in ids])
    _pretrains_as_from_volta_s_layout(site, tmp_path / "layout", folder)


def _pretrains_as_from_volta_s_layout(site, out: Path, features: Path) -> None:
    """train_concap.py with --features_path `features` ends with exit 0, and the batches read from `features` are
    those read from the site's VOLTA layout (the directory td-LMDBs of integer-string records)."""
    from helpers_pretrain import load_tiny_tokenizer
    from volta_ml.pretrain.cli import main
    from volta_ml.pretrain.data import ConceptCapData, collate_concap

    data = site["data"]
    flags = pretrain_flags(site, out, "--train_batch_size", "4", "--num_train_epochs", "1", "--max_seq_length", "12")
    flags[flags.index("--features_path") + 1] = str(features)
    assert main(flags) == 0
    tok = load_tiny_tokenizer(data.tokenizer)
    ours = collate_concap(ConceptCapData(data.annotations, features, tok, 12).__getitems__(range(16)))
    volta = collate_concap(ConceptCapData(data.annotations, data.features, tok, 12).__getitems__(range(16)))
    assert all(torch.equal(a, b) for a, b in zip(ours[:-1], volta[:-1])) and ours[-1] == volta[-1]


# ---- LMDB stores: LMDB's one-file layout, truncated and garbage files -----------------------------------------------

def _same_samples(a, b, ids) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for i in ids for x, y in zip(a[i], b[i]))


def test_a_single_file_lmdb_is_read_at_every_entry_point(site, tmp_path, capsys):
    """LMDB's one-file layout (subdir=False: what tensorpack's LMDBSerializer.save and so VOLTA's h5_to_td-lmdb.py
    write), written with plain lmdb calls in VOLTA's record layouts (td-LMDB, and the keyed h5_to_lmdb.py layout):
    open_store / RegionView, `volta-ml features inspect|verify|convert`, train_task.py's task store, train_concap.py
    on VOLTA's pretraining layout; everything read as from the directory layout."""
    from helpers_pretrain import write_td_lmdb
    from volta_ml.cli import main as volta_ml_main
    from volta_ml.cli import train_task
    from volta_ml.features import RegionView, open_store
    from volta_ml.models import build_model, load_config, save_checkpoint
    from volta_ml.testing import legacy_layouts as L

    source = open_store(site["store"])
    images = {i: {"features": np.asarray(source[i].features), "boxes": np.asarray(source[i].boxes),
                  "img_w": source[i].image_w, "img_h": source[i].image_h} for i in source}
    folder = tmp_path / "data/flickr30k/features"
    folder.mkdir(parents=True)
    td = L.write_td_lmdb(folder / "flickr30k_boxes36.lmdb", L.h5_style_td_records(images), subdir=False)
    keyed = L.write_volta_lmdb(tmp_path / "keyed.lmdb", images, subdir=False)
    reference = RegionView(source)
    for path, fmt in ((td, "td-lmdb"), (keyed, "volta-lmdb")):
        assert Path(path).is_file()
        store = open_store(path)
        assert store.format_name == fmt and sorted(store) == sorted(images)
        assert _same_samples(RegionView(path), reference, images)
        capsys.readouterr()
        assert volta_ml_main(["features", "inspect", "--json", str(path)]) == 0
        assert json.loads(capsys.readouterr().out)["format"] == fmt
        assert volta_ml_main(["features", "verify", str(path)]) == 0
        assert capsys.readouterr().out.strip().endswith("OK")
        converted = tmp_path / f"{fmt}.vmlf"
        assert volta_ml_main(["features", "convert", str(path), str(converted)]) == 0
        assert _same_samples(RegionView(converted), reference, images)
        capsys.readouterr()
        assert volta_ml_main(["features", "verify", f"{path}-lock"]) == 2    # the lock file beside it: one line
        assert "an LMDB lock file, not the LMDB" in _last_line(capsys.readouterr().err)

    init = tmp_path / "init.bin"
    save_checkpoint(build_model(load_config(str(site["config"])), kind="pretraining"), init)
    code = train_task.main(["--bert_model", str(site["bert"]), "--do_lower_case", "--config_file",
                            str(site["config"]), "--from_pretrained", str(init), "--device", "cpu", "--no_cache",
                            "--tasks_config_file", TRAINVAL, "--task", "19", "--data_root", str(tmp_path / "data"),
                            "--train_annotations_jsonpath", str(site["tmp"] / "ve.jsonl"),
                            "--val_annotations_jsonpath", str(site["tmp"] / "ve.jsonl"), "--num_epoch", "1",
                            "--batch_size", "4", "--num_workers", "0", "--num_val_workers", "0",
                            "--output_dir", str(tmp_path / "ft"), "--logdir", str(tmp_path / "ft_tb")])
    assert code == 0

    data = site["data"]
    cc = tmp_path / "cc_features"
    cc.mkdir()
    write_td_lmdb(cc / "training_feat_all.lmdb", [data.records[i] for i in data.train_ids], single_file=True)
    write_td_lmdb(cc / "validation_feat_all.lmdb", [data.records[i] for i in data.val_ids], single_file=True)
    assert (cc / "training_feat_all.lmdb").is_file()
    _pretrains_as_from_volta_s_layout(site, tmp_path / "pre", cc)


def test_a_truncated_lmdb_is_one_line_before_training(site, tmp_path):
    """An LMDB whose data file lost its second half (an interrupted copy): reading the missing pages would kill the
    run with SIGBUS mid-epoch; it is refused in one line when opened (in a subprocess: a SIGBUS would end pytest)."""
    features = tmp_path / "features"
    shutil.copytree(site["data"].features, features)
    data_file = features / "training_feat_all.lmdb" / "data.mdb"
    os.truncate(data_file, data_file.stat().st_size // 2)
    argv = pretrain_flags(site, tmp_path, "--train_batch_size", "4", "--num_train_epochs", "1")
    argv[argv.index("--features_path") + 1] = str(features)
    proc = subprocess.run([sys.executable, "train_concap.py", *argv], cwd=REPO, env=toy_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    line = _last_line(proc.stderr)
    assert line.startswith(f"train_concap.py: error: {features / 'training_feat_all.lmdb'}: truncated LMDB"), line
    assert "***** Training *****" not in proc.stderr


def test_a_damaged_lmdb_page_is_one_line_naming_store_and_key(site, tmp_path, capsys):
    """train_task.py on a VOLTA LMDB (the project's writer; small records, so many leaf pages) whose header is
    valid but whose leaf holding the annotation's images is zeroed (lmdb.CorruptedError when read): one line
    naming the store and the image, exit 2, before any training."""
    from helpers_lmdb_pages import damage_page, live_leaf_holding
    from volta_ml.cli import train_task

    store = tmp_path / "data/flickr30k/features/flickr30k_boxes36.lmdb"
    make_store(store, [str(1000 + i) for i in range(8)] + [str(5000 + i) for i in range(150)], FEATURE_DIM,
               boxes_range=(1, 1))
    page, keys = live_leaf_holding(store / "data.mdb", b"1000")
    damage_page(store / "data.mdb", page)
    code = train_task.main(["--bert_model", str(site["bert"]), "--do_lower_case", "--config_file", str(site["config"]),
                            "--from_pretrained", "", "--device", "cpu", "--no_cache", "--tasks_config_file", TRAINVAL,
                            "--task", "19", "--data_root", str(tmp_path / "data"), "--train_annotations_jsonpath",
                            str(site["tmp"] / "ve.jsonl"), "--val_annotations_jsonpath", str(site["tmp"] / "ve.jsonl"),
                            "--num_epoch", "1", "--batch_size", "4", "--num_workers", "2", "--output_dir",
                            str(tmp_path / "ft"), "--logdir", str(tmp_path / "tb")])
    assert code == 2
    line = _last_line(capsys.readouterr().err)
    assert line == (f"train_task.py: error: {store} [key '1000']: cannot read the LMDB (CorruptedError: mdb_get: "
                    "MDB_CORRUPTED: Located page was wrong type): its data pages are damaged (an interrupted copy or "
                    "a failing disk): copy or rebuild the store"), line
    assert b"1000" in keys


def test_a_garbage_lmdb_is_one_line_naming_it(site, tmp_path, capsys):
    """data.mdb of random bytes, and random bytes after a valid LMDB header (lmdb.InvalidError / lmdb.Error)."""
    from volta_ml.pretrain.cli import main

    rng = np.random.default_rng(0)
    for name, keep in (("noise", 0), ("header", 20)):
        features = tmp_path / name
        shutil.copytree(site["data"].features, features)
        data_file = features / "training_feat_all.lmdb" / "data.mdb"
        head = data_file.read_bytes()[:keep]
        data_file.write_bytes(head + rng.bytes(1 << 16))
        flags = pretrain_flags(site, tmp_path / f"out_{name}")
        flags[flags.index("--features_path") + 1] = str(features)
        assert main(flags) == 2
        line = _last_line(capsys.readouterr().err)
        assert f"{features / 'training_feat_all.lmdb'}: " in line and "LMDB" in line, line
