"""Tiny releases of the suite's benchmarks, each in exactly the schema its authors publish (file names, columns,
nesting, image storage, language codes), with the hard cases: answers that need normalisation, several
references, non-Latin scripts that need word segmentation, questions with 5+ options, several images, image
options, a question without an image. `build_suite(root)` writes them all (about 100 kB) and returns their
paths."""
from __future__ import annotations

import io
import json
import shutil
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers_fake_backends import FakeGenerative


# the cider rules run pycocoevalcap's PTBTokenizer, a Java program (cider-pyptb does not)
needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="pycocoevalcap's PTBTokenizer is a Java program "
                                                                      "and no java is on PATH")


def picture(seed_text: str, size: tuple[int, int] | None = None) -> Image.Image:
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    h, w = size or (int(rng.integers(10, 20)), int(rng.integers(10, 20)))
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def png(seed_text: str) -> bytes:
    buf = io.BytesIO()
    picture(seed_text).save(buf, format="PNG")
    return buf.getvalue()


def hf_image(seed_text: str) -> dict:
    """A Hugging Face `Image` feature cell as parquet stores it."""
    return {"bytes": png(seed_text), "path": f"{seed_text}.png"}


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    return path


# --- XM3600 (and its images, which MaXM shares) ---------------------------------------------------------------
XM_KEYS = ["000411001ff7dd4f", "0004886b7d043cfd", "0035b9006c333719", "3b825ea9d84a44ee"]
XM_CAPTIONS = {
    "en": [["A red car parked in front of a house.", "a small red car on the street"],
           ["Two dogs are playing on the grass.", "Dogs running in a park."],
           ["A plate of rice with vegetables.", "Food on a white plate."],
           ["A man's bicycle leaning against a wall.", "A bike next to the wall."]],
    "zh": [["一辆红色的汽车停在房子前面。", "街上的红色小汽车"], ["两只狗在草地上玩耍。", "狗在公园里跑。"],
           ["一盘米饭和蔬菜。", "白色盘子里的食物"], ["靠在墙上的自行车。", "墙边的一辆自行车"]],
    "th": [["รถยนต์สีแดงจอดอยู่หน้าบ้าน", "รถสีแดงคันเล็กบนถนน"], ["สุนัขสองตัวกำลังเล่นบนหญ้า", "สุนัขวิ่งในสวน"],
           ["ข้าวกับผักในจาน", "อาหารบนจานสีขาว"], ["จักรยานพิงกำแพง", "จักรยานข้างกำแพง"]],
    "ja": [["家の前に赤い車が止まっている。", "通りの小さな赤い車"], ["二匹の犬が芝生で遊んでいる。", "公園を走る犬"],
           ["野菜とご飯の皿。", "白い皿の上の食べ物"], ["壁に立てかけた自転車。", "壁の横の自転車"]],
    "de": [["Ein rotes Auto vor einem Haus.", "Ein kleines rotes Auto auf der Straße."],
           ["Zwei Hunde spielen im Gras.", "Hunde rennen im Park."], ["Ein Teller Reis mit Gemüse.",
                                                                     "Essen auf einem weißen Teller."],
           ["Ein Fahrrad lehnt an einer Wand.", "Ein Rad neben der Wand."]],
}


def write_xm3600(root: Path) -> dict:
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, key in enumerate(XM_KEYS):
        picture(key).save(images / f"{key}.jpg")
        row = {"image/key": key, "image/locale": ["en", "zh", "th", "ja"][i]}
        for lang, per_image in XM_CAPTIONS.items():
            caps = per_image[i]
            row[lang] = {"caption": caps, "caption/tokenized": caps,
                         "caption/tokenized/lowercase": [c.lower() for c in caps]}
        lines.append(json.dumps(row, ensure_ascii=False))
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "xm100_ids.txt").write_text("\n".join(XM_KEYS[:3]) + "\n")
    return {"captions": root / "captions.jsonl", "images": images, "subset": root / "xm100_ids.txt"}


# --- MaXM -----------------------------------------------------------------------------------------------------
MAXM = {
    "en": [(XM_KEYS[0], [("What color is the car?", ["Red.", "red"], ["red", "red"], "false"),
                         ("How many doors does the car have?", ["Two", "2"], ["2", "2"], "false")]),
           (XM_KEYS[1], [("What animals are on the grass?", ["The dogs", "Dogs"], ["dogs", "dogs"], "false"),
                         ("What are the dogs doing?", ["Playing", "running and playing"], ["playing", "running and "
                                                                                            "playing"], "true")])],
    "zh": [(XM_KEYS[0], [("汽车是什么颜色的？", ["红色"], ["红色"], "false")]),
           (XM_KEYS[2], [("盘子里有什么？", ["米饭和蔬菜", "米饭"], ["米饭和蔬菜", "米饭"], "true")])],
}


def write_maxm(root: Path) -> Path:
    folder = root / "maxm_v1_release"
    folder.mkdir(parents=True, exist_ok=True)
    for lang, annotations in MAXM.items():
        data = {"dataset": "maxm", "version": "v1", "split": lang, "annotations": [
            {"image_id": key, "image_url": f"https://example.org/{key}.jpg", "qa_pairs": [
                {"question_id": f"{lang}-{key[:6]}-{q}", "question": question, "answers": answers,
                 "processed_answers": processed, "is_collection": collection}
                for q, (question, answers, processed, collection) in enumerate(pairs)]}
            for key, pairs in annotations]}
        (folder / f"maxm_v1_{lang}.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return folder


# --- MTVQA ----------------------------------------------------------------------------------------------------
def write_mtvqa(root: Path) -> Path:
    rows = []
    for i, (lang, pairs) in enumerate([
            ("JA", [{"question": "看板に書かれている会社名は何ですか？", "answer": "株式会社ABC"},
                    {"question": "価格はいくらですか？", "answer": "3.5ドル"}]),
            ("JA", [{"question": "店の名前は？", "answer": "さくら"}, {"question": "空の答え", "answer": ""}]),
            ("DE", [{"question": "Was steht auf dem Schild?", "answer": "Ausgang"}])]):
        rows.append({"id": f"{lang}_{i}", "image": hf_image(f"mtvqa{i}"), "qa_pairs": repr(pairs), "lang": lang})
    return _parquet(root / "MTVQA" / "data" / "test-00000-of-00001.parquet", rows).parent.parent


# --- xMMMU ----------------------------------------------------------------------------------------------------
XMMMU_FILES = {"en": "data/validation-00000-of-00001.parquet",
               **{lang: f"data/translated_MMMU_val_300_with_image_{language}.parquet" for lang, language in (
                   ("ar", "Arabic"), ("fr", "French"), ("hi", "Hindi"), ("id", "Indonesian"), ("ja", "Japanese"),
                   ("pt", "Portuguese"))}}


def card(folder: Path, splits: dict[str, str], config: str = "default") -> None:
    """A dataset card (README.md) whose YAML front matter maps each split to its files, as the hub's are."""
    lines = ["---", "license: apache-2.0", "configs:", f"- config_name: {config}", "  data_files:"]
    for split, path in splits.items():
        lines += [f"  - split: {split}", f"    path: {path}"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text("\n".join(lines + ["---", "", "# A dataset", ""]), encoding="utf-8")


def write_xmmmu(root: Path) -> Path:
    """neulab/PangeaBench-xmmmu as released: data/translated_MMMU_val_300_with_image_<Language>.parquet (and
    data/validation-00000-of-00001.parquet for en), the card's configs naming the split of each file."""
    folder = root / "xmmmu"
    card(folder, XMMMU_FILES)
    for lang in ("ja", "en"):
        rows = []
        cases = [
            ("validation_Art_1", "<image 1> この絵の作者は誰ですか？", ["モネ", "ゴッホ", "ピカソ", "ダリ", "マネ"], "B",
             "multiple-choice", [1]),
            ("validation_Math_2", "<image 1>と<image 2>の面積の合計は？", ["12", "24", "36", "48"], "C", "multiple-choice",
             [1, 2]),
            ("validation_Physics_3", "<image 1> 速度は何m/sですか？", [], "24", "open", [1]),
            ("validation_Chemistry_4", "<image 1> Which one? (image options)", ["<image 2>", "<image 3>"], "A",
             "multiple-choice", [1, 2, 3]),
        ]
        for qid, question, options, answer, kind, shown in cases:
            row = {"id": qid, "question": question, "options": repr(options), "answer": answer,
                   "question_type": kind, "subfield": "x", "explanation": "", "img_type": "['Photos']",
                   "topic_difficulty": "Easy"}
            for k in range(1, 8):
                row[f"image_{k}"] = hf_image(f"{lang}{qid}{k}") if k in shown else None
            rows.append(row)
        _parquet(folder / XMMMU_FILES[lang], rows)
    return folder


# --- M3Exam ---------------------------------------------------------------------------------------------------
def write_m3exam(root: Path) -> Path:
    folder = root / "M3Exam" / "data" / "multimodal-questions"
    images = folder / "images-thai"
    images.mkdir(parents=True, exist_ok=True)
    for name in ("image-1.png", "image-2.png", "image-3.png", "image-4.png"):
        picture(name).save(images / name)
    questions = [
        {"question_text": "(image)[image-1.png] รูปนี้แสดงอะไร", "background_description": [],
         "answer_text": "2", "options": ["(1) แมว", "(2) สุนัข", "(3) นก", "(4) ปลา", "(5) ม้า"], "need_image": "yes",
         "language": "thai", "level": "low", "subject": "science", "subject_category": "natural-science",
         "year": "2019"},
        {"question_text": "ข้อใดถูกต้อง", "background_description": ["ดูภาพ (image)[image-2.png] แล้วตอบคำถาม"],
         "answer_text": "ค", "options": ["ก. หนึ่ง", "ข. สอง", "ค. สาม", "ง. สี่"], "need_image": "yes",
         "language": "thai", "level": "mid", "subject": "math", "subject_category": "math", "year": "2020"},
        {"question_text": "ภาพใดเป็นวงกลม", "background_description": [], "answer_text": "1",
         "options": ["1. (image)[image-3.png]", "2. (image)[image-4.png]"], "need_image": "yes",
         "language": "thai", "level": "high", "subject": "math", "subject_category": "math", "year": "2021"},
    ]
    (folder / "thai-questions-image.json").write_text(json.dumps(questions, ensure_ascii=False), encoding="utf-8")
    return folder.parent.parent


# --- Kaleidoscope ---------------------------------------------------------------------------------------------
def write_kaleidoscope(root: Path) -> Path:
    folder = root / "kaleidoscope"
    rows = []
    base = {"country": "x", "level": "University Entry", "category_en": "Physics", "general_category_en": "STEM",
            "image_type": "Graph", "image_information": "Essential"}
    members = {}
    for lang, question, options, answer, image in [
            ("uk", "Яка сила діє на тіло?", ["тяжіння", "тертя", "пружності", "Архімеда", "опору"], 3,
             "data/UA_physics/images/q1.png"),
            ("uk", "Скільки буде 2 + 2?", ["3", "4", "5", "6"], 1, None),
            ("uk", "Який графік правильний?", ["data/UA_physics/images/o1.png", "data/UA_physics/images/o2.png"], 0,
             "data/UA_physics/images/q3.png"),
            ("en", "What is shown?", ["a cat", "a dog", "a bird", "a fish"], 2, "data/GATE/images/q4.png")]:
        rows.append(dict(base, language=lang, question=question, options=options, answer=answer, image=image))
        for path in [image] + [o for o in options if o.endswith(".png")]:
            if path:
                members[f"final_data/{path}"] = png(path)
    _parquet(folder / "data" / "train-00000-of-00001.parquet", rows)
    with zipfile.ZipFile(folder / "data.zip", "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return folder


# --- MMMB (VLMEvalKit's multiple-choice TSV) ------------------------------------------------------------------
def b64(seed_text: str) -> str:
    import base64
    return base64.b64encode(png(seed_text)).decode("ascii")


MMMB = {
    # index, question, options A-D ("" = no such option; "None" is a missing cell to pandas), answer, hint, image
    "en": [(0, "What color is the car?", ["red", "blue", "green", "black"], "A", "", "own"),
           (1, "How many dogs are there?", ["1", "2", "3", ""], "B", "Count the animals.", "own"),
           (2, "Is the sky clear?", ["yes", "no", "cannot tell", "None"], "A", "", "0"),     # another row's image
           (3, "Which picture shows a cat?", ["the first", "the second"], "B", "", "two"),   # several images
           (4, "A question whose image is missing", ["a", "b"], "A", "", "none")],           # left out
    "cn": [(10, "汽车是什么颜色？", ["红色", "蓝色", "绿色", "黑色"], "A", "", "own"),
           (11, "有几只狗？", ["一只", "两只", "三只", ""], "B", "数一数动物。", "10")],
}


def write_mmmb(root: Path) -> Path:
    """mmmb/mmmb_<en|cn>.tsv as AIDC-AI/Parrot-dataset releases them (VLMEvalKit's TSV: base64 images, an image
    given as another row's index, a list literal of two images, a row without an image)."""
    import csv

    folder = root / "Parrot-dataset" / "mmmb"
    folder.mkdir(parents=True, exist_ok=True)
    for code, rows in MMMB.items():
        with open(folder / f"mmmb_{code}.tsv", "w", encoding="utf-8", newline="") as handle:
            out = csv.writer(handle, delimiter="\t", lineterminator="\n")
            out.writerow(["index", "question", "hint", "A", "B", "C", "D", "answer", "category", "l2-category",
                          "image"])
            for index, question, options, answer, hint, image in rows:
                cell = {"own": b64(f"mmmb{index}"), "two": repr([b64(f"mmmb{index}a"), b64(f"mmmb{index}b")]),
                        "none": ""}.get(image, image)
                out.writerow([index, question, hint, *(options + [""] * (4 - len(options))), answer, "attribute_recognition", "perception", cell])
    return folder.parent


def build_suite(root: Path) -> dict:
    xm = write_xm3600(root / "xm3600")
    return {"xm3600": xm, "maxm": write_maxm(root), "mtvqa": write_mtvqa(root), "xmmmu": write_xmmmu(root),
            "m3exam": write_m3exam(root), "kaleidoscope": write_kaleidoscope(root), "mmmb": write_mmmb(root)}


# --- stand-in backends ----------------------------------------------------------------------------------------
class FakeExamGenerative(FakeGenerative):
    """The contract fake with one-token letters A-J (questions with 5+ options)."""

    letters_ok = tuple("ABCDEFGHIJ")


EXAM_ANSWERS = ('{"choice": "B"}', "B", "(C) something", "I am not sure", "A. the first", "  {\n \"choice\": \"D\"\n}")
