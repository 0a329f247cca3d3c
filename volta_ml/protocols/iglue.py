"""IGLUE's protocol settings per task, as the paper runs used them.

Everything here is a default: a grid file can override any path, list or flag. Paths are relative to the
grid's `data_root` and use the layout of IGLUE's `datasets/` folder (where it differs from the job scripts,
the repository's names are used because that is what users download).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Flags on every IGLUE train command (user-scripts spec `<adam>`).
ADAM_FLAGS = ["--adam_epsilon", "1e-6", "--adam_betas", "0.9", "0.999", "--adam_correct_bias",
              "--weight_decay", "0.0001", "--warmup_proportion", "0.1", "--clip_grad_norm", "1.0"]
FEW_SHOT_LRS = ["1e-4", "5e-5", "1e-5"]
FEW_SHOT_EPOCHS = 20
ENGLISH_ONLY_MODELS = {"ctrl_lxmert", "ctrl_uniter", "ctrl_vilbert", "ctrl_visualbert", "ctrl_vl-bert"}


@dataclass(frozen=True)
class Schedule:
    """Few-shot batch settings for one shot count: batch / grad-acc, and the m3p variants."""
    batch: int
    grad_acc: int
    m3p_batch: int | None = None
    m3p_grad_acc: int | None = None

    def flags(self, is_m3p: bool) -> list[str]:
        b = self.m3p_batch if is_m3p and self.m3p_batch else self.batch
        g = self.m3p_grad_acc if is_m3p and self.m3p_grad_acc else self.grad_acc
        return ["--batch_size", str(b), "--gradient_accumulation_steps", str(g)]


@dataclass(frozen=True)
class TaskSpec:
    key: str                       # grid name: xvnli, xgqa, marvl, xflickrco, wit
    title: str                     # table / CSV prefix as IGLUE's results/ (XVNLI, xGQA, MaRVL, ...)
    task_id: str                   # "19"
    train_name: str                # run-dir prefix of train_task (<Name>_<cfg>)
    scorer: str                    # eval_task | gqa | retrieval
    languages: tuple[str, ...]     # target languages (English excluded)
    test_file: str                 # annotation path template ({lang}); English uses the same template
    test_split: str                # eval --split template ("" = omit the flag)
    mt_file: str | None = None     # translate-test annotations ({lang})
    mt_split: str | None = None
    test_features: str | None = None          # --val_features_lmdbpath template ({lang}, {feat})
    english_test: dict | None = None          # overrides for the English row (file/split/features; None = omit)
    few_shot_languages: tuple[str, ...] = ()
    shots: tuple[str, ...] = ()
    few_shot_train_file: str | None = None    # ({lang}, {shot})
    few_shot_train_split: str = "train"       # ({lang}, {shot})
    few_shot_train_features: str | None = None
    few_shot_val_split: str | None = None     # ({lang}); None = task config's
    few_shot_val_file: str | None = None      # ({lang}); None = task config's
    few_shot_eval_flags: tuple[str, ...] = ()
    few_shot_eval_flags_m3p: tuple[str, ...] = ()
    schedules: dict = field(default_factory=dict)   # shot -> Schedule (default key "*")
    finetune_grad_acc: int = 4
    finetune_extra: tuple[str, ...] = ()
    translate_train_file: str | None = None   # ({lang})
    translate_train_languages: tuple[str, ...] = ()

    def schedule(self, shot: str) -> Schedule:
        if shot in self.schedules:
            return self.schedules[shot]
        if "*" in self.schedules:
            return self.schedules["*"]
        return Schedule(batch=int(shot_count(shot)) if shot_count(shot) >= 1 else 1, grad_acc=1)


def shot_count(shot: str) -> float:
    """Numeric x-position of a shot label: '10x2' (10 concepts x 2 captions) counts as 20 examples."""
    if "x" in str(shot):
        a, b = str(shot).split("x", 1)
        return float(a) * float(b)
    return float(shot)


def _s(b, g, mb=None, mg=None):
    return Schedule(b, g, mb, mg)


TASKS: dict[str, TaskSpec] = {
    "xvnli": TaskSpec(
        key="xvnli", title="XVNLI", task_id="19", train_name="XVNLI", scorer="eval_task",
        languages=("ar", "es", "fr", "ru"),
        test_file="XVNLI/annotations/{lang}/test.jsonl", test_split="test",
        mt_file="XVNLI/annotations_machine-translate/{lang}/test.jsonl", mt_split="test",
        few_shot_languages=("ar", "es", "fr", "ru"), shots=("1", "5", "10", "20", "25", "48"),
        few_shot_train_file="XVNLI/annotations/{lang}/train_{shot}.jsonl",
        few_shot_val_split="dev", few_shot_val_file="XVNLI/annotations/en/dev.jsonl",
        few_shot_eval_flags=("--eval_batch_size", "64"), few_shot_eval_flags_m3p=("--eval_batch_size", "32"),
        schedules={"1": _s(2, 1), "5": _s(16, 1), "10": _s(32, 1), "*": _s(64, 1, 64, 2)},
    ),
    "xgqa": TaskSpec(
        key="xgqa", title="xGQA", task_id="15", train_name="GQA", scorer="gqa",
        languages=("bn", "de", "id", "ko", "pt", "ru", "zh"),
        test_file="xGQA/annotations/few_shot/{lang}/test.json", test_split="test_{lang}",
        mt_file="xGQA/annotations_machine-translate/few_shot/{lang}/test.json", mt_split="test_{lang}_gmt",
        # IGLUE also ran English few-shot xGQA; the tables keep it out of `avg` like its CSVs
        few_shot_languages=("en", "bn", "de", "id", "ko", "pt", "ru", "zh"), shots=("1", "5", "10", "20", "25", "48"),
        few_shot_train_file="xGQA/annotations/few_shot/{lang}/train_{shot}.pkl",
        few_shot_train_split="train_{lang}_{shot}",
        few_shot_val_split="dev_{lang}", few_shot_val_file="xGQA/annotations/few_shot/{lang}/dev.pkl",
        schedules={"1": _s(8, 1), "5": _s(16, 1), "10": _s(32, 1), "*": _s(64, 1, 64, 2)},
        finetune_extra=("--cache", "500", "--num_workers", "20", "--num_val_workers", "20"),
    ),
    "marvl": TaskSpec(
        key="marvl", title="MaRVL", task_id="12", train_name="NLVR2", scorer="eval_task",
        languages=("id", "sw", "ta", "tr", "zh"),
        test_file="marvl/zero_shot/annotations/marvl-{lang}.jsonl", test_split="test",
        mt_file="marvl/zero_shot/annotations_machine-translate/marvl-{lang}_gmt.jsonl", mt_split="test",
        test_features="marvl/zero_shot/features/marvl-{lang}_{feat}.lmdb",
        english_test={"file": None, "split": None, "features": None},   # NLVR2 test from the task config
        few_shot_languages=("id", "tr", "zh"), shots=("1", "2", "4", "10", "10x2"),
        few_shot_train_file="marvl/few_shot/annotations/marvl-{lang}_train{shot}.jsonl",
        few_shot_train_features="marvl/few_shot/features/marvl-{lang}_fewshot_{feat}.lmdb",
        few_shot_eval_flags=("--eval_batch_size", "32", "--max_val_batches", "15"),
        few_shot_eval_flags_m3p=("--eval_batch_size", "16", "--max_val_batches", "30"),
        schedules={"1": _s(2, 1), "2": _s(4, 1), "4": _s(8, 1), "10": _s(16, 1), "10x2": _s(32, 1, 32, 2)},
        finetune_extra=("--cache", "500", "--num_workers", "10", "--num_val_workers", "10"),
    ),
    "xflickrco": TaskSpec(
        key="xflickrco", title="xFlickrCO", task_id="8", train_name="RetrievalFlickr30k", scorer="retrieval",
        languages=("de", "es", "id", "ja", "ru", "tr", "zh"),
        test_file="xFlickrCO/annotations/{lang}/test.jsonl", test_split="test_{lang}",
        mt_file="xFlickrCO/annotations_machine-translate/{lang}/test_gmt.jsonl", mt_split="test_{lang}_gmt",
        test_features="xFlickrCO/features/xflickrco-test_{feat}.lmdb",
        few_shot_languages=("de", "es", "id", "ja", "ru", "tr", "zh"), shots=("1", "5", "10", "25", "50", "100"),
        few_shot_train_file="xFlickrCO/annotations/{lang}/train_{shot}.jsonl",
        few_shot_train_split="train_{lang}_{shot}",
        few_shot_train_features="xFlickrCO/features/xflickrco-few_{feat}.lmdb",
        few_shot_val_split="dev", few_shot_val_file="flickr30k/annotations/valid_ann.jsonl",
        few_shot_eval_flags=("--eval_batch_size", "16", "--max_val_batches", "130"),
        few_shot_eval_flags_m3p=("--eval_batch_size", "8", "--max_val_batches", "260"),
        schedules={"1": _s(1, 1), "5": _s(2, 1), "10": _s(4, 1), "25": _s(8, 1), "50": _s(16, 1, 16, 2),
                   "*": _s(32, 2, 32, 4)},
        translate_train_file="xFlickrCO/annotations/{lang}/train.jsonl", translate_train_languages=("de", "ja"),
    ),
    "wit": TaskSpec(
        key="wit", title="WIT", task_id="20", train_name="RetrievalWIT", scorer="retrieval",
        languages=("ar", "bg", "da", "el", "et", "id", "ja", "ko", "tr", "vi"),
        test_file="wit/annotations/test_{lang}.jsonl", test_split="test_{lang}",
        mt_file="wit/annotations_machine-translate/test_{lang}_gmt.jsonl", mt_split="test_{lang}_gmt",
        test_features="wit/features/wit_test_{feat}.lmdb",
        finetune_extra=("--cache", "500", "--num_workers", "20", "--num_val_workers", "20",
                        "--optim_train_epochs", "2", "--eval_steps", "1000"),
    ),
}


def finetune_grad_acc(task: str, model: str) -> int:
    """English fine-tuning gradient accumulation (IGLUE's fine-tuning scripts)."""
    if task == "marvl":
        return 2 if model in ENGLISH_ONLY_MODELS | {"ctrl_muniter"} else 4
    return 8 if model == "m3p" else 4


def model_extra_flags(task: str, model: str, stage: str) -> list[str]:
    """Per-model quirks of the IGLUE scripts: uc2 trains retrieval with the triplet loss, m3p evaluates
    retrieval in 4 gallery chunks."""
    flags: list[str] = []
    if model == "uc2" and task in ("xflickrco", "wit") and stage == "train":
        flags += ["--loss", "TripletLoss"]
    if model == "m3p" and task in ("xflickrco", "wit") and stage == "eval":
        flags += ["--num_subiters", "4"]
    return flags
