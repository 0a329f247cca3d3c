"""Pretraining losses, objectives, heads on masked slots, parameter groups and flags (volta_ml/pretrain), each rule
against a plain computation written out here; synthetic batches, tiny models."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from helpers_tiny import tiny_config
from volta_ml.models import build_model
from volta_ml.pretrain import losses
from volta_ml.pretrain.job import check_objective, forward_and_loss, init_from_text_model, pretrain_param_groups

pytestmark = pytest.mark.usefixtures("one_thread")

B, L, R = 4, 9, 6          # images, text length, regions (without the global feature)


def fake_batch(config, seed: int = 0, is_next=(0, 1, 0, 1), feature_dim: int | None = None) -> tuple:
    """VOLTA's batch tuple with every field, region slots laid out for the config's global feature."""
    g = torch.Generator().manual_seed(seed)
    vocab = config.vocab_size
    ids = torch.randint(5, vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[2:, L - 3:] = 0
    ids[mask == 0] = 0
    lm = torch.full((B, L), -1)
    picks = torch.rand(B, L, generator=g) < 0.3
    picks[:, 0] = False
    picks &= mask.bool()
    picks[0, 1] = True
    lm[picks] = torch.randint(5, vocab, (int(picks.sum()),), generator=g)
    dim = feature_dim or config.v_feature_size
    extra = int(config.add_global_imgfeat in ("first", "last"))
    feat = torch.rand(B, R + extra, dim, generator=g)
    loc = torch.rand(B, R + extra, config.num_locs, generator=g)
    image_mask = torch.ones(B, R + extra, dtype=torch.long)
    label = torch.full((B, R), -1)
    label[torch.rand(B, R, generator=g) < 0.3] = 1
    label[0, 2] = label[3, 0] = 1
    image_cls = torch.softmax(3 * torch.randn(B, R, 1601, generator=g), -1)
    image_cls[..., 7] = 0.0                        # zero probabilities: KL's 0 * log 0 terms
    obj_labels = torch.randint(0, 1600, (B, R), generator=g)
    obj_confs = torch.rand(B, R, generator=g)
    attr_labels = torch.randint(0, 400, (B, R), generator=g)
    attr_confs = torch.rand(B, R, generator=g)
    attrs = torch.rand(B, R, 401, generator=g)
    return (ids, mask, torch.zeros_like(ids), lm, torch.tensor(is_next), feat, loc, image_cls, obj_labels, obj_confs,
            attr_labels, attr_confs, attrs, label, image_mask, [str(i) for i in range(B)])


# ---- each visual criterion against VOLTA's formula written out ------------------------------------------------

def plain_criterion(key: int, pred: torch.Tensor, fields: dict, add_global) -> torch.Tensor:
    """VOLTA's pre_vis_criterions[key] on full predictions [B, R, n] (global slot already dropped), by loops."""
    label = fields["image_label"]
    feats = fields["image_feat"]
    feats = feats[:, 1:] if add_global == "first" else feats[:, :-1] if add_global == "last" else feats
    total, masked = 0.0, 0
    for b in range(B):
        for r in range(R):
            if label[b, r] != 1:
                continue
            masked += 1
            p = pred[b, r].double()
            logp = torch.log_softmax(p, -1)
            if key == 0:
                t = fields["image_cls"][b, r].double()
                keep = t > 0
                total += float((t[keep] * (t[keep].log() - logp[keep])).sum())
            elif key in (1, 5):
                d = p - feats[b, r].double()
                total += float((d * d).sum()) if key == 1 else float(torch.where(d.abs() < 1, 0.5 * d * d,
                                                                                  d.abs() - 0.5).sum())
            elif key == 3:
                total += -float(logp[fields["obj_labels"][b, r]]) * float(fields["obj_confs"][b, r])
            elif key == 4:
                total += -float(logp[fields["attr_labels"][b, r]]) * float(fields["attr_confs"][b, r])
            elif key == 6:
                total += -float(logp[fields["obj_labels"][b, r]])
    if key in (1, 5):
        return torch.tensor(total / max(masked * pred.shape[-1], 1))
    return torch.tensor(total / max(masked, 1))


@pytest.mark.parametrize("add_global", [None, "first", "last"])
@pytest.mark.parametrize("key", [0, 1, 3, 4, 5, 6])
def test_visual_criterion_matches_volta_formula(key, add_global):
    width = losses.VISUAL_CRITERIA[key].width
    config = SimpleNamespace(visual_target_weights={str(key): 2.5}, add_global_imgfeat=add_global,
                             vocab_size=50, v_feature_size=2048, num_locs=5)
    fields = losses.as_fields(fake_batch(config, seed=key))
    pred = torch.randn(B, R, width, generator=torch.Generator().manual_seed(9)) * 2
    label = fields["image_label"]
    ours = losses.visual_loss({str(key): pred[label == 1]}, fields, config, label)
    torch.testing.assert_close(ours.double(), 2.5 * plain_criterion(key, pred, fields, add_global).double(),
                               rtol=1e-5, atol=1e-6)


def test_visual_losses_are_summed_with_their_weights_and_zero_without_masked_regions():
    config = SimpleNamespace(visual_target_weights={"3": 6.667, "4": 6.667, "5": 6.667, "0": 0},
                             add_global_imgfeat=None, vocab_size=50, v_feature_size=2048, num_locs=5)
    assert losses.active_targets(config) == {3: 6.667, 4: 6.667, 5: 6.667}
    assert losses.needed_fields(config) == {"obj_labels", "obj_confs", "attr_labels", "attr_confs", "image_feat"}
    fields = losses.as_fields(fake_batch(config))
    label = fields["image_label"]
    g = torch.Generator().manual_seed(1)
    preds = {k: torch.randn(B, R, losses.VISUAL_CRITERIA[k].width, generator=g) for k in (3, 4, 5)}
    ours = losses.visual_loss({str(k): p[label == 1] for k, p in preds.items()}, fields, config, label)
    plain = sum(6.667 * plain_criterion(k, p, fields, None) for k, p in preds.items())
    torch.testing.assert_close(ours.double(), plain.double(), rtol=1e-5, atol=1e-6)
    none = torch.full_like(label, -1)
    empty = {str(k): p[none == 1] for k, p in preds.items()}
    assert float(losses.visual_loss(empty, fields, config, none)) == 0.0


def test_nce_loss_and_its_negatives():
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(B, R, 2048, generator=g)
    label = torch.full((B, R), -1)
    label[0, 1] = label[2, 4] = label[3, 0] = 1
    b, r = (label == 1).nonzero(as_tuple=True)
    negatives = losses.nce_negative_indices(b, r, B, R, generator=g)
    assert negatives.shape == (3, 127)
    across_rows, inside = negatives[:, :89] // R, negatives[:, 89:]
    assert (across_rows != b[:, None]).all() and across_rows.max() < B    # another image of the batch
    assert (inside // R == b[:, None]).all() and (inside % R != r[:, None]).all()   # another slot of the same image
    pred = torch.randn(3, 2048, generator=g)
    ours = losses.nce_loss(pred, feats.reshape(B * R, -1), b * R + r, negatives)
    flat = feats.reshape(B * R, -1)
    plain = 0.0
    for m in range(3):
        scores = [float(flat[int(b[m] * R + r[m])] @ pred[m])] + [float(flat[int(i)] @ pred[m]) for i in negatives[m]]
        plain += -(scores[0] - math.log(sum(math.exp(s - max(scores)) for s in scores)) - max(scores))
    torch.testing.assert_close(ours.double(), torch.tensor(plain / 3, dtype=torch.float64), rtol=1e-4, atol=1e-4)
    # the criterion draws its own negatives: its value is the loss of some valid draw; none masked: 0
    config = SimpleNamespace(visual_target_weights={"2": 1.0}, add_global_imgfeat="first")
    fields = {"image_feat": torch.cat([feats.mean(1, keepdim=True), feats], 1), "image_label": label}
    torch.manual_seed(0)
    value = losses.visual_loss({"2": pred}, fields, config, label)
    torch.manual_seed(0)
    again = losses.nce_negative_indices(b, r, B, R)
    torch.testing.assert_close(value, losses.nce_loss(pred, flat, b * R + r, again))
    assert float(losses.visual_loss({"2": pred[:0]}, fields, config, torch.full_like(label, -1))) == 0.0


def test_mlm_and_matching_losses_match_plain_cross_entropy():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(B, L, 50, generator=g)
    labels = torch.full((B, L), -1)
    labels[0, 1], labels[2, 3], labels[3, 8] = 7, 11, 49
    plain = sum(-float(torch.log_softmax(logits[b, t], -1)[labels[b, t]])
                for b in range(B) for t in range(L) if labels[b, t] != -1) / 3
    assert float(losses.mlm_loss(logits, labels)) == pytest.approx(plain, rel=1e-5)
    assert float(losses.mlm_loss(logits[labels != -1], labels)) == pytest.approx(plain, rel=1e-5)
    assert float(losses.mlm_loss(logits, torch.full_like(labels, -1))) == 0.0   # VOLTA: NaN
    itm = torch.randn(B, 2, generator=g)
    is_next = torch.tensor([0, 1, -1, 1])
    plain = sum(-float(torch.log_softmax(itm[i], -1)[is_next[i]]) for i in (0, 1, 3)) / 3
    assert float(losses.itm_loss(itm, is_next)) == pytest.approx(plain, rel=1e-5)
    assert losses.itm_loss(None, is_next) is None


# ---- objectives ---------------------------------------------------------------------------------------------------

def test_objective_one_drops_the_targets_of_mismatched_pairs_as_volta_computes_it():
    lm = torch.tensor([[-1, 5, 0, -1], [3, -1, 4, 2]])
    img = torch.tensor([[1, -1, 1], [1, 1, -1]])
    is_next = torch.tensor([0, 1])
    new_lm, new_img = losses.apply_objective(lm, img, is_next, 1)
    # row 0 (matched) keeps its targets, except a target id 0, which VOLTA's "0 -> -1" also drops
    assert new_lm.tolist() == [[-1, 5, -1, -1], [-1, -1, -1, -1]]
    assert new_img.tolist() == [[1, -1, 1], [-1, -1, -1]]
    for objective in (0, 2):
        same = losses.apply_objective(lm, img, is_next, objective)
        assert same[0] is lm and same[1] is img


@pytest.fixture(scope="module")
def vilbert():
    torch.manual_seed(0)
    config = tiny_config("ctrl_vilbert_base")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.v_hidden_dropout_prob = config.v_attention_probs_dropout_prob = 0.0
    model = build_model(config, kind="pretraining")
    model.dropout.p = 0.0
    return config, model


def plain_losses(model, config, batch, objective: int, training: bool):
    """The three losses from the full head outputs, VOLTA's way: relabel (training, objective 1), mask, average."""
    f = losses.as_fields(batch)
    lm, img = f["lm_label_ids"].clone(), f["image_label"].clone()
    if training and objective == 1:
        for b in range(B):
            if f["is_next"][b] != 0:
                lm[b], img[b] = -1, -1
    with torch.no_grad():
        out = model(f["input_ids"], f["image_feat"], f["image_loc"], f["segment_ids"], f["input_mask"],
                    f["image_mask"])
    masked_t = F.cross_entropy(out["mlm_logits"].reshape(-1, config.vocab_size), lm.reshape(-1), ignore_index=-1)
    vis = out["vis_logits"]["0"][:, 1:]                 # ctrl configs: global feature first
    masked_v = plain_criterion(0, vis, dict(f, image_label=img), "first")
    nsp = F.cross_entropy(out["itm_logits"], f["is_next"])
    return float(masked_t), float(masked_v), 0.0 if (training and objective == 2) else float(nsp)


@pytest.mark.parametrize("objective", [0, 1, 2])
@pytest.mark.parametrize("training", [True, False])
def test_concap_losses_match_full_head_outputs(vilbert, objective, training):
    config, model = vilbert
    batch = fake_batch(config, seed=objective)
    model.train(training)
    with torch.no_grad():
        ours = [float(x) for x in losses.concap_losses(model, batch, config, objective)]
    model.eval()
    assert ours == pytest.approx(plain_losses(model, config, batch, objective, training), rel=1e-4, abs=1e-6)


def test_objective_two_gives_the_matching_head_zero_gradients(vilbert):
    config, model = vilbert
    model.train()
    model.zero_grad(set_to_none=True)
    loss, parts, n, _ = forward_and_loss(model, fake_batch(config), "TASK0", config=config, objective=2)
    loss.backward()
    grad = model.cls.bi_seq_relationship.weight.grad
    assert grad is not None and float(grad.abs().sum()) == 0.0     # VOLTA multiplies the loss by 0
    assert n == B and parts.shape == (3,) and float(parts[2]) == 0.0
    assert float(loss.detach()) == pytest.approx(float(parts[:2].sum()) / B, rel=1e-5)
    model.zero_grad(set_to_none=True)


def test_unknown_objective_is_a_usage_error():
    from volta_ml.engine.failures import UsageError
    with pytest.raises(UsageError, match=r"--objective 3: VOLTA's objectives are 0: .*1: .*2: "):
        check_objective(3)


def test_heads_on_masked_slots_equal_the_full_outputs(vilbert):
    config, model = vilbert
    f = losses.as_fields(fake_batch(config))
    args = (f["input_ids"], f["image_feat"], f["image_loc"], f["segment_ids"], f["input_mask"], f["image_mask"])
    text = f["lm_label_ids"] != -1
    regions = losses.region_slots(f["image_label"], f["image_feat"].shape[1], "first")
    assert regions.shape == (B, R + 1) and not regions[:, 0].any()
    with torch.no_grad():
        full = model(*args)
        part = model(*args, text_positions=text, region_positions=regions)
    torch.testing.assert_close(part["mlm_logits"], full["mlm_logits"][text])
    torch.testing.assert_close(part["vis_logits"]["0"], full["vis_logits"]["0"][regions])
    torch.testing.assert_close(part["itm_logits"], full["itm_logits"])


def test_wiki_batch_gives_the_mlm_loss_only(vilbert):
    config, model = vilbert
    f = losses.as_fields(fake_batch(config))
    zeros = torch.zeros_like(f["image_feat"])
    wiki = (f["input_ids"], f["input_mask"], f["segment_ids"], f["lm_label_ids"], zeros,
            torch.zeros_like(f["image_loc"]), torch.zeros_like(f["image_mask"]))
    model.eval()
    with torch.no_grad():
        out = model(f["input_ids"], zeros, torch.zeros_like(f["image_loc"]), f["segment_ids"], f["input_mask"],
                    torch.zeros_like(f["image_mask"]))
        plain = F.cross_entropy(out["mlm_logits"].reshape(-1, config.vocab_size), f["lm_label_ids"].reshape(-1),
                                ignore_index=-1)
        assert float(losses.wiki_loss(model, wiki)) == pytest.approx(float(plain), rel=1e-5)


def test_pretraining_heads_start_xavier_as_volta():
    torch.manual_seed(0)
    model = build_model(tiny_config("ctrl_vilbert_base"), kind="pretraining")
    dense = model.cls.predictions.transform.dense.weight.detach()
    bound = math.sqrt(6.0 / (dense.shape[0] + dense.shape[1]))
    assert float(dense.abs().max()) <= bound and float(dense.abs().max()) > 0.8 * bound
    assert float(model.cls.imagePredictions.decoder_dict["0"].bias.detach().abs().sum()) == 0.0
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


# ---- parameter groups ---------------------------------------------------------------------------------------------

def test_param_groups_bert_tensors_at_a_tenth_and_no_decay_names(tmp_path):
    torch.manual_seed(0)
    config = tiny_config("ctrl_vilbert_base")
    config.type_vocab_size = 3                      # the checkpoint's 2 rows fill the first two, as VOLTA resizes
    model = build_model(config, kind="pretraining")
    third_row = model.bert.embeddings.token_type_embeddings.weight[2].detach().clone()
    H = config.hidden_size
    # a text-only BERT checkpoint with Hugging Face names (1 layer, token types of 2 rows)
    hf = {"bert.embeddings.word_embeddings.weight": torch.randn(config.vocab_size, H),
          "bert.embeddings.token_type_embeddings.weight": torch.randn(2, H),
          "bert.embeddings.LayerNorm.weight": torch.ones(H),
          "bert.encoder.layer.0.attention.self.query.weight": torch.randn(H, H),
          "bert.encoder.layer.0.attention.self.query.bias": torch.randn(H),
          "bert.pooler.dense.weight": torch.randn(H, H),
          "cls.predictions.bias": torch.zeros(config.vocab_size)}
    torch.save(hf, tmp_path / "pytorch_model.bin")
    loaded = init_from_text_model(model, tmp_path)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, hf["bert.embeddings.word_embeddings.weight"])
    types = model.bert.embeddings.token_type_embeddings.weight
    assert torch.equal(types[:2], hf["bert.embeddings.token_type_embeddings.weight"]) and torch.equal(types[2], third_row)
    groups = pretrain_param_groups(model, lr=1e-4, weight_decay=0.01, bert_tensors=loaded, bert_lr_scale=0.1)
    got = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    sublayer = config.bert_layer2attn_sublayer.get("0", 0)
    text_names = {"bert.embeddings.word_embeddings.weight", "bert.embeddings.token_type_embeddings.weight",
                  "bert.embeddings.LayerNorm.weight", f"bert.encoder.layer.{sublayer}.attention_self.query.weight",
                  f"bert.encoder.layer.{sublayer}.attention_self.query.bias"}
    for name, param in model.named_parameters():
        lr = 1e-5 if name in text_names else 1e-4       # the pooler and cls.* are not BERT-initialised here
        decay = 0.0 if ("bias" in name or "LayerNorm.weight" in name) else 0.01
        assert got[id(param)] == pytest.approx((lr, decay)), name
    assert len(groups) == 4
    plain = pretrain_param_groups(model, lr=1e-4, weight_decay=0.01, bert_tensors=None, bert_lr_scale=0.1)
    assert {(g["lr"], g["weight_decay"]) for g in plain} == {(1e-4, 0.01), (1e-4, 0.0)}


# ---- flags --------------------------------------------------------------------------------------------------------

CONCAP_FLAGS = ["--annotations_path", "a", "--features_path", "f", "--from_pretrained", "", "--config_file",
                "config/ctrl_vilbert_base.json", "--resume_file", "", "--output_dir", "o", "--logdir", "l",
                "--max_seq_length", "38", "--train_batch_size", "256", "--learning_rate", "1e-4",
                "--gradient_accumulation_steps", "2", "--num_train_epochs", "10", "--warmup_proportion", "0.05",
                "--warmup_steps", "0", "--seed", "42", "--local_rank", "-1", "--num_workers", "25", "--distributed",
                "--objective", "1", "--adam_epsilon", "1e-6", "--adam_betas", "0.9", "0.999",
                "--weight_decay", "0.01", "--clip_grad_norm", "5.0"]
WIKI_FLAGS = ["--annotations_path", "a", "--features_path", "f", "--dataroot", "w", "--ann_files", "w/en.txt",
              "--lgs", "en-de", "--lg_sampling_factor", "0.7", "--m_pretrained", "m", "--x_pretrained", "",
              "--config_file", "config/ctrl_xuniter_base.json", "--resume_file", "", "--output_dir", "o",
              "--logdir", "l", "--max_m_seq_length", "128", "--max_x_seq_length", "36", "--train_m_batch_size",
              "64", "--train_x_batch_size", "256", "--learning_rate", "1e-4", "--gradient_accumulation_steps", "1",
              "--num_train_epochs", "2.5", "--warmup_proportion", "0.1", "--warmup_steps", "100", "--seed", "0",
              "--local_rank", "-1", "--num_workers", "4", "--distributed", "--objective", "2", "--adam_epsilon",
              "1e-8", "--adam_betas", "0.9", "0.98", "--weight_decay", "0.01", "--clip_grad_norm", "1.0"]


def test_every_volta_flag_of_both_scripts_is_accepted_and_mapped():
    from volta_ml.pretrain.cli import parse_args
    a = parse_args(CONCAP_FLAGS)
    assert (a.batch_size, a.grad_acc_steps, a.lr, a.num_epoch, a.optim_train_epochs) == (256, 2, 1e-4, 10, 10.0)
    assert (a.max_seq_length, a.objective, list(a.adam_betas), a.adam_epsilon, a.clip_grad_norm) == \
        (38, 1, [0.9, 0.999], 1e-6, 5.0)
    assert a.warmup_steps is None and a.adam_correct_bias and a.drop_last and not a.wiki
    assert a.init_checkpoint == "" and a.x_pretrained == ""
    w = parse_args(WIKI_FLAGS, wiki=True)
    assert (w.batch_size, w.train_m_batch_size, w.max_seq_length, w.max_m_seq_length) == (256, 64, 36, 128)
    assert (w.lgs, w.lg_sampling_factor, w.init_checkpoint, w.num_epoch, w.optim_train_epochs) == \
        ("en-de", 0.7, "m", 2, 2.5)
    assert w.warmup_steps == 100 and w.wiki
    with pytest.raises(SystemExit):
        parse_args(["--max_m_seq_length", "64"])          # a wiki flag is not train_concap.py's


def test_volta_ml_pretrain_subcommands_are_registered():
    from volta_ml.cli import build_parser
    parser = build_parser()
    args = parser.parse_args(["pretrain", *CONCAP_FLAGS])
    assert args.train_batch_size == 256 and callable(args.func)
    args = parser.parse_args(["pretrain-wiki", *WIKI_FLAGS])
    assert args.lgs == "en-de" and callable(args.func)


# ---- the sweep's pretrain stage -------------------------------------------------------------------------------------

def test_sweep_pretrains_first_and_fine_tunes_from_the_last_epoch(tmp_path):
    import yaml
    from volta_ml.protocols.cell import PRETRAINED
    from volta_ml.protocols.errors import GridError
    from volta_ml.protocols.grid import load_grid
    from volta_ml.protocols.runners import plan_cells
    from volta_ml.protocols.steps import record

    grid = {"name": "pre", "data_root": str(tmp_path / "data"), "output_dir": str(tmp_path / "runs"),
            "tasks": ["xvnli"], "protocols": ["zero_shot"], "languages": {"xvnli": ["ar"]},
            "models": {"mine": {"config": "ctrl_vilbert_base", "bert_model": "/tok",
                                "pretrain": {"annotations_path": "cc/annotations", "features_path": "cc/feats",
                                             "num_train_epochs": 2, "from_pretrained": "",
                                             "flags": ["--objective", "1"]}}},
            "extra_flags": {"pretrain": ["--train_batch_size", "64"]}}
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    cells = plan_cells(load_grid(path))
    assert [c.stage for c in cells] == ["pretrain", "finetune", "zero_shot", "zero_shot"]
    pre, fine = cells[0], cells[1]
    argv = pre.commands[0].argv
    assert argv[1:4] == ["-m", "volta_ml.cli", "pretrain"]
    flags = dict(zip(argv[4::2], argv[5::2]))
    assert flags["--annotations_path"] == str(tmp_path / "cc/annotations") and flags["--from_pretrained"] == ""
    assert flags["--num_train_epochs"] == "2" and flags["--bert_model"] == "/tok"
    assert argv[-4:] == ["--objective", "1", "--train_batch_size", "64"]
    assert fine.depends_on == [pre.id]
    start = fine.commands[0].argv[fine.commands[0].argv.index("--from_pretrained") + 1]
    assert start == str(Path(pre.dir) / PRETRAINED)
    # the record step links the last epoch's weights and reads the last validation line
    cell_dir = Path(pre.dir)
    (cell_dir / "ckpt" / "ctrl_vilbert_base").mkdir(parents=True)
    (cell_dir / "ckpt" / "ctrl_vilbert_base" / "pytorch_model_1.bin").write_bytes(b"weights")
    (cell_dir / "train.log").write_text("... Validation [Conceptual_Caption]: masked_t 7.100 masked_v 0.500 NSP 0.690\n"
                                        "... Validation [Conceptual_Caption]: masked_t 6.000 masked_v 0.400 NSP 0.600\n")
    from volta_ml.protocols.cell import Cell, write_json_atomic
    write_json_atomic(cell_dir / "cell.json", pre.to_json())
    assert record(cell_dir) == 0
    assert (cell_dir / PRETRAINED).read_bytes() == b"weights"
    result = json.loads((cell_dir / "result.json").read_text())
    assert result["metrics"] == {"masked_t": 6.0, "masked_v": 0.4, "NSP": 0.6} and Cell.from_json(pre.to_json())
    bad = dict(grid, models={"mine": {"config": "x", "pretrain": {"annotations_path": "a", "features_path": "f"},
                                      "pretrained": "p.bin"}})
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(GridError, match="not both"):
        load_grid(path)


def test_x_pretrained_loads_the_v_layers_tensors_of_a_volta_checkpoint(tmp_path):
    from volta_ml.pretrain.job import load_vision_checkpoint
    config = tiny_config("ctrl_vilbert_base")
    torch.manual_seed(1)
    source = build_model(config, kind="pretraining")
    torch.save(source.state_dict(), tmp_path / "volta.bin")
    for v_layers, copied in ((None, lambda name: True),
                             (["bert.v_embeddings"], lambda name: name.startswith("bert.v_embeddings"))):
        torch.manual_seed(2)
        model = build_model(config, kind="pretraining")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        config.v_layers = v_layers
        load_vision_checkpoint(model, str(tmp_path / "volta.bin"), config)
        for name, value in model.state_dict().items():
            assert torch.equal(value, source.state_dict()[name] if copied(name) else before[name]), name
    config.v_layers = None


@pytest.mark.parametrize("family", ["lxmert", "vl-bert_base", "uc2_base", "ctrl_visualbert_base"])
def test_every_family_pretrains_with_its_visual_targets(family):
    """LXMERT's three criteria without a global feature, VL-BERT's object labels with the global feature last and
    no matching head, UC2 and VisualBERT: a finite step whose parts are what the config asks for."""
    torch.manual_seed(0)
    config = tiny_config(family, feature_size=2048)
    model = build_model(config, kind="pretraining").train()
    loss, parts, n, _ = forward_and_loss(model, fake_batch(config), "TASK0", config=config, objective=0)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and n == B and float(parts[1]) > 0
    assert (float(parts[2]) == 0.0) == (config.fusion_method == "none")
    decoders = model.cls.imagePredictions.decoder_dict
    assert sorted(int(k) for k in decoders) == sorted(losses.active_targets(config))
    assert all(decoders[k].weight.grad is not None and decoders[k].weight.grad.abs().sum() > 0 for k in decoders)
