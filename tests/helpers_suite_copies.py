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
    rows = [{"id": "KR_0", "image": hf_image("kr0"), "lang": "KR",
             "qa_pairs": repr([{"question": "간판에 뭐라고 써 있나요?", "answer": "출구"}])},
            {"id": "DE_1", "image": hf_image("de1"), "qa_pairs": repr([{"question": "Was steht da?",
                                                                       "answer": "Ausgang"}]), "lang": "DE"},
            {"id": "XX_2", "image": hf_image("xx2"), "qa_pairs": repr([{"question": "?", "answer": "x"}]),
             "lang": "XX"}]
    return _parquet(root / "mtvqa_kr" / "data" / "test-00000-of-00001.parquet", rows).parent.parent


# --- floschne's copies (images embedded) ----------------------------------------------------------------------
def write_xm3600_copy(root: Path, images: Path, langs=("en", "th", "de")) -> Path:
    """floschne/xm3600: a split per language, one row per image: `image_id`, `image_locale`, `captions`,
    `captions_tokenized`, `captions_tokenized_lowercase`, `image`."""
    folder = root / "floschne-xm3600"
    splits = {}
    for lang in langs:
        rows = [{"image_id": key, "image_locale": "en", "captions": XM_CAPTIONS[lang][i],
                 "captions_tokenized": XM_CAPTIONS[lang][i],
                 "captions_tokenized_lowercase": [c.lower() for c in XM_CAPTIONS[lang][i]],
                 "image": {"bytes": (images / f"{key}.jpg").read_bytes(), "path": None}}
                for i, key in enumerate(XM_KEYS)]
        splits[lang] = f"data/{lang}-00000-of-00001.parquet"
        _parquet(folder / splits[lang], rows)
    card(folder, splits)
    return folder


IGLUE_LABELS = ("entailment", "neutral", "contradiction")


def write_iglue_originals(root: Path) -> dict:
    """Tiny IGLUE test files in IGLUE's own formats (XVNLI jsonl, xGQA's question dict, MaRVL jsonl) with their
    image folders laid out as iglue-hf's default templates read them."""
    from helpers_suite import picture

    out = {}
    xvnli = root / "iglue" / "xvnli_ar.jsonl"
    (root / "iglue" / "flickr").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(6):
        flickr = str(1000 + i // 2)
        picture(f"flickr{flickr}").save(root / "iglue" / "flickr" / f"{flickr}.jpg")
        rows.append({"gold_label": IGLUE_LABELS[i % 3], "sentence1": f"رجل {i}", "sentence2": f"فرضية {i}",
                     "captionID": f"{flickr}.jpg#2", "Flikr30kID": flickr})
    xvnli.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out["xvnli"] = (xvnli, root / "iglue" / "flickr")
    gqa = root / "iglue" / "gqa"
    gqa.mkdir(parents=True, exist_ok=True)
    questions = {}
    for i in range(6):
        image = f"n{500 + i // 3}"
        picture(f"gqa{image}").save(gqa / f"{image}.jpg")
        questions[str(20000 + i)] = {"question": f"Welche Farbe hat {i}?", "imageId": image,
                                     "answer": ["yes", "no", "left"][i % 3]}
    (root / "iglue" / "xgqa_de.json").write_text(json.dumps(questions, ensure_ascii=False), encoding="utf-8")
    out["xgqa"] = (root / "iglue" / "xgqa_de.json", gqa)
    marvl = root / "iglue" / "marvl-id.jsonl"
    rows = []
    for i in range(4):
        concept = f"{39 + i // 2}-Panci"
        left, right = f"{39 + i // 2}-{i}.jpg", f"{39 + i // 2}-{i + 10}.jpg"
        folder = root / "iglue" / "marvl-images" / "id" / "images" / concept
        folder.mkdir(parents=True, exist_ok=True)
        picture(f"marvl{left}").save(folder / left)
        picture(f"marvl{right}").save(folder / right)
        rows.append({"concept": concept, "language": "id", "caption": f"Panci {i}", "left_img": left,
                     "right_img": right, "chapter": "Basic actions", "id": f"id-{i}", "label": i % 2 == 0})
    marvl.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out["marvl"] = (marvl, root / "iglue" / "marvl-images")
    return out


def write_iglue_copies(root: Path, originals: dict) -> dict:
    """floschne/xvnli, floschne/xgqa, floschne/marvl from the same rows and image bytes: a split per language,
    images embedded as {bytes, path} structs, the copies' own field names."""
    out = {}
    xvnli, flickr = originals["xvnli"]
    rows = [json.loads(line) for line in xvnli.read_text(encoding="utf-8").splitlines()]
    out["xvnli"] = _copy(root / "floschne-xvnli", "ar", [
        {"flikr30k_id": r["Flikr30kID"], "caption": r["sentence1"], "hypothesis": r["sentence2"],
         "label": r["gold_label"], "image": {"bytes": (flickr / f"{r['Flikr30kID']}.jpg").read_bytes(),
                                             "path": None}} for r in rows])
    gqa_file, gqa = originals["xgqa"]
    questions = json.loads(gqa_file.read_text(encoding="utf-8"))
    out["xgqa"] = _copy(root / "floschne-xgqa", "de", [
        {"question_id": key, "image_id": q["imageId"], "question": q["question"], "answer": q["answer"],
         "full_answer": q["answer"], "image": {"bytes": (gqa / f"{q['imageId']}.jpg").read_bytes(), "path": None}}
        for key, q in questions.items()])
    marvl, images = originals["marvl"]
    rows = [json.loads(line) for line in marvl.read_text(encoding="utf-8").splitlines()]

    def cell(r, side):
        return {"bytes": (images / "id" / "images" / r["concept"] / r[side]).read_bytes(), "path": None}
    out["marvl"] = _copy(root / "floschne-marvl", "id", [
        {"id": r["id"], "hypothesis": r["caption"], "hypo_en": f"The pan {k}", "label": r["label"],
         "left_img_id": r["left_img"].split(".")[0], "right_img_id": r["right_img"].split(".")[0],
         "left_img": cell(r, "left_img"), "right_img": cell(r, "right_img"), "concept": r["concept"],
         "language": "id", "chapter": r["chapter"]} for k, r in enumerate(rows)])
    return out


def _copy(folder: Path, split: str, rows: list[dict]) -> Path:
    card(folder, {split: f"data/{split}-00000-of-00001.parquet"})
    _parquet(folder / "data" / f"{split}-00000-of-00001.parquet", rows)
    return folder
