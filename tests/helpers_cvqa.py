"""A CVQA-shaped release written with pyarrow in the Hugging Face `datasets` layout, plus a tiny tokenizer.

Shapes follow the real shards: an `image` struct {bytes, path} (the `datasets` Image feature, declared in the
`huggingface` schema metadata), `Subset` as a tuple's string form, index-aligned local/English options.
Three revisions: `latest` (list options, labels, two shards), `strings` (stringified options, no Image
Type/License, as the May 2024 revision) and `hidden` (every Label -1).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

# (ID, Subset, Question, Translated Question, Options, Translated Options, Label, Category, Image Type)
ROWS = [
    ("1001_0", "('Telugu', 'India')", "ఇది ఏ వంటకం?", "Which dish is this?",
     ["దోస", "ఇడ్లీ", "వడ", "ఉప్మా"], ["dosa", "idli", "vada", "upma"], 1, "Cooking and Food", "Self"),
    ("1001_1", "('Telugu', 'India')", "దీన్ని ఎప్పుడు తింటారు?", "When is it eaten?",
     [" ఉదయం", "రాత్రి", "మధ్యాహ్నం", "ఎప్పుడూ కాదు"], ["morning", "night", "noon", "never"], 0,
     "Cooking and Food", "Self"),
    ("1002_0", "('Telugu', 'India')", "ఈ ఆలయం ఎక్కడ ఉంది?", "Where is this temple",
     ["తిరుపతి", "మదురై", "పూరి", "కాశీ"], ["tirupati", "madurai", "puri", "kashi"], 0,
     "Geography, buildings, and landmarks", "External"),
    ("2001_0", "('Egyptian_Arabic', 'Egypt')", "ما اسم هذا الطبق؟", "What is the name of this dish?",
     ["كشري", "فول", "ملوخية", "فتة"], ["koshari", "ful", "molokhia", "fatta"], 0, "Cooking and food", "Self"),
    ("2002_0", "('Egyptian_Arabic', 'Egypt')", "من هذا المغني؟", "Who is this singer?",
     ["أم كلثوم", "فيروز", "عبد الحليم", "شادية"], ["umm kulthum", "fairuz", "abdel halim", "shadia"], 2,
     "Public Figure and Pop-Culture", "External"),
    ("3001_0", "('Spanish', 'Mexico')", "¿Qué fiesta es esta?", "Which festival is this?",
     ["Día de Muertos", "Navidad", "Carnaval", "Pascua"], ["day of the dead", "christmas", "carnival", "easter"], 0,
     "Tradition, Art, and History", "Self"),
    ("3001_1", "('Spanish', 'Mexico')", "¿Qué flor se usa?", "Which flower is used?",
     ["cempasúchil", "rosa", "tulipán", "lirio"], ["marigold", "rose", "tulip", "lily"], 3,
     "Tradition, Art, and History", "Self"),
]
IMAGE_SIZES = {"1001": (48, 64), "1002": (40, 40), "2001": (64, 48), "2002": (36, 52), "3001": (50, 70)}
REVISION = "6a38d71d0c7e1f2b3a4c5d6e7f8091a2b3c4d5e6"


def image_png(image_id: str, seed: int = 0) -> bytes:
    from PIL import Image

    h, w = IMAGE_SIZES[image_id]
    rng = np.random.default_rng(int(image_id) + seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _table(rows, options_as_string=False, hidden=False, with_image_type=True):
    import pyarrow as pa

    columns = {
        "image": [{"bytes": image_png(r[0].split("_")[0]), "path": f"{r[0]}.png"} for r in rows],
        "ID": [r[0] for r in rows], "Subset": [r[1] for r in rows], "Question": [r[2] for r in rows],
        "Translated Question": [r[3] for r in rows],
        "Options": [str(r[4]) if options_as_string else r[4] for r in rows],
        "Translated Options": [str(r[5]) if options_as_string else r[5] for r in rows],
        "Label": [-1 if hidden else r[6] for r in rows], "Category": [r[7] for r in rows],
    }
    options_type = pa.string() if options_as_string else pa.list_(pa.string())
    fields = [pa.field("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
              pa.field("ID", pa.string()), pa.field("Subset", pa.string()), pa.field("Question", pa.string()),
              pa.field("Translated Question", pa.string()), pa.field("Options", options_type),
              pa.field("Translated Options", options_type), pa.field("Label", pa.int64()),
              pa.field("Category", pa.string())]
    if with_image_type:
        columns["Image Type"] = [r[8] for r in rows]
        columns["Image Source"] = ["" if r[8] == "Self" else "https://example.org/x.jpg" for r in rows]
        columns["License"] = ["CC BY-SA 4.0"] * len(rows)
        fields += [pa.field(n, pa.string()) for n in ("Image Type", "Image Source", "License")]
    features = {f.name: ({"_type": "Image"} if f.name == "image" else {"_type": "Value"}) for f in fields}
    schema = pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": features}})})
    return pa.table(columns, schema=schema)


def write_release(root: Path, kind: str = "latest") -> Path:
    """Write one revision's shards under `root/snapshots/<commit>/data` (the HF cache layout) and return that
    data folder."""
    import pyarrow.parquet as pq

    data = Path(root) / "snapshots" / REVISION / "data" if kind == "latest" else Path(root) / kind
    data.mkdir(parents=True, exist_ok=True)
    if kind == "latest":
        pq.write_table(_table(ROWS[:4]), data / "test-00000-of-00002.parquet")
        pq.write_table(_table(ROWS[4:]), data / "test-00001-of-00002.parquet")
    elif kind == "strings":
        pq.write_table(_table(ROWS, options_as_string=True, with_image_type=False), data / "test.parquet")
    elif kind == "hidden":
        pq.write_table(_table(ROWS, hidden=True), data / "test-00000-of-00001.parquet")
    else:
        raise ValueError(kind)
    return data


def tiny_tokenizer(folder: Path):
    """A WordPiece tokenizer whose vocabulary holds the fixture's English words (the local scripts mostly map
    to [UNK], as in real mBERT runs on rare scripts); saved to `folder` for `load_tokenizer`."""
    from transformers import AutoTokenizer

    words = set()
    for row in ROWS:
        for text in [row[3], *row[5]]:
            words.update(text.lower().replace("?", " ?").split())
    words |= {"location", ":", ".", "question", "options", "short", "answer", "india", "egypt", "mexico"}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words) + [f"##{c}" for c in "sd"]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512}))
    return AutoTokenizer.from_pretrained(str(folder), do_lower_case=True, local_files_only=True)


def make_cvqa_store(path, dataset, feature_dim=16, skip=()):
    """A native store of random regions for every image of `dataset` except `skip`."""
    from volta_ml.features import open_writer

    with open_writer(str(path), "native") as writer:
        for k, image_id in enumerate(dataset.image_ids):
            if image_id in skip:
                continue
            rng = np.random.default_rng(k)
            n = 5 + k
            xy = rng.uniform(0, 30, (n, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(5, 30, (n, 2))], axis=1).astype(np.float32)
            writer.put(image_id, rng.random((n, feature_dim), dtype=np.float32), boxes, 64, 64)
    return path
