"""The hub copies of the suite's benchmarks, written from the same tiny items as the original releases of
tests/helpers_suite.py (the same questions, captions and image bytes), each in the schema the copy publishes: its
file names, its columns, its image storage and its dataset card's `configs` front matter. A copy and its original
must give identical per-item scores (tests/test_suite_copies.py)."""
from __future__ import annotations

import base64
import json
from pathlib import Path

from helpers_suite import MAXM, XM_CAPTIONS, XM_KEYS, _parquet, card, hf_image


def write_maxm_copy(root: Path, maxm: Path, images: Path) -> Path:
    """neulab/PangeaBench-maxm (= floschne/maxm): one row per question, a split per language and `<lang>_yesno`,
    `image` a plain struct {bytes, path} (the JPEG bytes of XM3600's file), `image_id`, `question_id`, ..."""
    folder = root / "PangeaBench-maxm"
    splits = {}
    for lang in MAXM:
        release = json.loads((maxm / f"maxm_v1_{lang}.json").read_text(encoding="utf-8"))
        rows, yesno = [], []
        for ann in release["annotations"]:
            for pair in ann["qa_pairs"]:
                row = {"image_id": ann["image_id"],
                       "image": {"bytes": (images / f"{ann['image_id']}.jpg").read_bytes(),
                                 "path": f"{ann['image_id']}.jpg"},
                       "question_id": pair["question_id"], "question": pair["question"], "answers": pair["answers"],
                       "processed_answers": pair["processed_answers"], "language": lang,
                       "is_collection": pair["is_collection"], "method": "pangea"}
                rows.append(row)
        yesno.append(dict(rows[0], question_id=f"{lang}-yesno-0", question="Is there a car?", answers=["yes"],
                          processed_answers=["yes"]))
        for split, split_rows in ((lang, rows), (f"{lang}_yesno", yesno)):
            splits[split] = f"data/{split}-00000-of-00001.parquet"
            _parquet(folder / splits[split], split_rows)
    card(folder, splits)
    return folder


def write_xm100_copy(root: Path, images: Path, keys=tuple(XM_KEYS[:3]), langs=("en", "de")) -> Path:
    """neulab/PangeaBench-xm100: a split per language, one row per caption (`image_id` XM3600's hex key,
    `image`, `caption` one string); an image's captions are rows apart (interleaved), as grouping must not rely
    on adjacent rows."""
    folder = root / "PangeaBench-xm100"
    splits = {}
    for lang in langs:
        rows = []
        for j in range(max(len(XM_CAPTIONS[lang][XM_KEYS.index(k)]) for k in keys)):
            for key in keys:
                caps = XM_CAPTIONS[lang][XM_KEYS.index(key)]
                if j < len(caps):
                    rows.append({"image_id": key, "image": {"bytes": (images / f"{key}.jpg").read_bytes(),
                                                            "path": f"{key}.jpg"}, "caption": caps[j]})
        splits[lang] = f"data/{lang}-00000-of-00001.parquet"
        _parquet(folder / splits[lang], rows)
    card(folder, splits)
    return folder


def write_m3exam_copy(root: Path, m3exam: Path, name: str = "thai") -> Path:
    """neulab/PangeaBench-m3exam: M3Exam's fields, one row per question, a split per language (M3Exam's name),
    the images a question shows as base64 strings in `image_0` ... `image_9` (in the order the texts show them),
    the literal "None" for the rest."""
    folder = root / "PangeaBench-m3exam"
    source = next(m3exam.rglob(f"{name}-questions-image.json"))
    import re
    rows = []
    for q in json.loads(source.read_text(encoding="utf-8")):
        texts = list(q["background_description"]) + [q["question_text"]] + list(q["options"])
        files = list(dict.fromkeys(f.strip() for t in texts for f in re.findall(r"\(image\)\[([^\]]+)\]", t)))
        row = dict(q)
        for k in range(10):
            row[f"image_{k}"] = (base64.b64encode((source.parent / f"images-{name}" / files[k]).read_bytes())
                                 .decode() if k < len(files) else "None")
        rows.append(row)
    card(folder, {name: f"data/{name}-00000-of-00001.parquet"})
    _parquet(folder / "data" / f"{name}-00000-of-00001.parquet", rows)
    return folder


def write_mtvqa_kr(root: Path) -> Path:
    """MTVQA with Korean written `KR` (Centurio's configs and other ports), a German row, and a row of a
    language MTVQA does not have."""
    rows = [{"id": "KR_0", "image": hf_image("kr0"), "qa_pairs": repr([{"question": "간판에 뭐라고 써 있나요?",
                                                                       "answer": "출구"}]), "lang": "KR"},
            {"id": "DE_1", "image": hf_image("de1"), "qa_pairs": repr([{"question": "Was steht da?",
                                                                       "answer": "Ausgang"}]), "lang": "DE"},
            {"id": "XX_2", "image": hf_image("xx2"), "qa_pairs": repr([{"question": "?", "answer": "x"}]),
             "lang": "XX"}]
    return _parquet(root / "mtvqa_kr" / "data" / "test-00000-of-00001.parquet", rows).parent.parent
