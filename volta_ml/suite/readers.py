"""One reader per benchmark, for the files its authors release (schemas in docs/suite.md). Each returns the items
of one language (`TaskData`); a file that is not in the schema is one `SuiteDataError` naming file, row and field.

- MaXM (`maxm_v1_<lang>.json` of google-research-datasets/maxm's `maxm_v1_release.zip`): `annotations` ->
  `image_id`, `qa_pairs` -> `question_id`, `question`, `answers`, `processed_answers`, `is_collection`; the images
  are XM3600's (`<image_id>.jpg`).
- XM3600 (`captions.jsonl` of google/crossmodal-3600): one line per image, `image/key`, `image/locale`, and per
  language `{caption: [...], caption/tokenized: [...], caption/tokenized/lowercase: [...]}`; images
  `<image/key>.jpg`. XM100: the same file restricted to the image keys listed in `--subset` (PangeaBench's 100).
- MTVQA (ByteDance/MTVQA parquet, split `test`): `image` (HF Image), `qa_pairs` (a list, or its Python literal, of
  {question, answer}), `lang`, `id` (optional); one item per question.
- xMMMU (neulab/PangeaBench-xmmmu parquet, one split per language): MMMU's columns `id`, `question`, `options` (a
  list literal), `answer` (a letter; an open question's text), `question_type` (`multiple-choice` | `open`),
  `image_1` ... `image_7`; the images a question shows are its `<image k>` placeholders.
- M3Exam (DAMO-NLP-SG/M3Exam's release, `multimodal-questions/<language>-questions-image.json` with
  `images-<language>/`): `question_text`, `background_description`, `options` (with their own labels "(1) ...",
  "A. ..."), `answer_text` (one of those labels), `level`, `subject_category`, ...; images are written
  `(image)[<file>]` in the texts.
- Kaleidoscope (CohereLabs/kaleidoscope parquet, split `train`, with `data.zip`): `language`, `question`,
  `options` (list), `answer` (0-based index), `image` (a path inside the archive's `final_data/`, or none: a
  text-only question), `category_en`, ...; an option ending in .png / .jpg is an image option.
- VLMEvalKit's multiple-choice TSV (MMMB: AIDC-AI/Parrot-dataset `mmmb/mmmb_<en|cn|pt|ar|tr|ru>.tsv`; any other,
  `vlmevalkit_mcq`): `index`, `question`, `A` `B` ... (an empty cell: no such option), `answer` (the letter),
  `image` (base64, a list literal of several, or the index of the row whose image it is), optional `hint`,
  `category`, `l2-category`; cells read as pandas' `read_csv` (VLMEvalKit's loader) reads them. Without an
  `image` column, `image_path` names the image files (under --images, by default the TSV's folder).
"""
from __future__ import annotations

import ast
import csv
import io
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

from volta_ml.data.annotations import read_json, read_jsonl, read_text
from volta_ml.iglue_hf.data import RetrievalData
from volta_ml.iglue_hf.images import ImageRef, MissingImagesError

from .data import (Item, ReleaseError, SuiteDataError, TaskData, image_bytes, is_parquet_release, literal_list,
                   parquet_rows, parquet_shards, split_of, text, texts)
from .images import Base64Images, FileImages, ParquetImages, ZipImages

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
THAI_LABELS = "กขคงจฉ"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


def _file(root: Path, names: list[str], what: str) -> Path:
    if root.is_file():
        return root
    for name in names:
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"{what} not found: none of {', '.join(str(root / n) for n in names)}")


def _image_root(opts: dict, default: Path | None, what: str) -> Path:
    root = opts.get("images") or default
    if root is None:
        raise MissingImagesError(f"{what}: give --images (the folder holding the benchmark's image files)")
    return Path(root)


# --- MaXM -----------------------------------------------------------------------------------------------------
def read_maxm(root: Path, lang: str, opts: dict) -> TaskData:
    if is_parquet_release(root, "maxm_v1_*.json"):
        return _maxm_parquet(root, lang, opts)
    path = _file(root, [f"maxm_v1_{lang}.json"], f"MaXM file of language {lang!r} (maxm_v1_{lang}.json)")
    data = read_json(path, "MaXM file")
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise SuiteDataError(f"{path}: not a MaXM file (a JSON object with an 'annotations' list)")
    if data.get("split") not in (None, lang):
        raise SuiteDataError(f"{path}: split is {data['split']!r}, not the language {lang!r} asked for")
    items = []
    for a, ann in enumerate(data["annotations"]):
        where = f"{path}: annotations[{a}]"
        if not isinstance(ann, dict) or not isinstance(ann.get("qa_pairs"), list):
            raise SuiteDataError(f"{where}: expected an object with 'image_id' and a 'qa_pairs' list")
        image_id = text(ann, "image_id", where)
        for q, pair in enumerate(ann["qa_pairs"]):
            at = f"{where}.qa_pairs[{q}]"
            if not isinstance(pair, dict):
                raise SuiteDataError(f"{at}: expected an object")
            items.append(Item(id=text(pair, "question_id", at), lang=lang, question=text(pair, "question", at).strip(),
                              images=(image_id,), references=texts(pair, "answers", at),
                              meta={"processed_answers": list(texts(pair, "processed_answers", at)),
                                    "is_collection": pair.get("is_collection"), "image_id": image_id}))
    store = FileImages(_image_root(opts, None, "MaXM (XM3600's images)"), "{id}.jpg")
    return TaskData(items, store, [path])


def _maxm_parquet(root: Path, lang: str, opts: dict) -> TaskData:
    """PangeaBench's copy (neulab/PangeaBench-maxm, the same files as floschne/maxm): one row per question, split
    `<lang>` (and `<lang>_yesno`, by --split), `image_id`, `image` (a struct {bytes, path}), `question_id`,
    `question`, `answers`, `processed_answers`, `language`, `is_collection`; the same items as `maxm_v1_<lang>.json`."""
    shards = parquet_shards(root, opts.get("split") or lang)
    items = []
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["image_id", "image", "question_id", "question", "answers",
                                                "processed_answers"]):
            where = f"{shard} row {row}"
            if image_bytes(record["image"]) is None:
                raise SuiteDataError(f"{where}: the image holds no bytes")
            items.append(Item(id=text(record, "question_id", where), lang=lang,
                              question=text(record, "question", where).strip(), images=((s, row, "image"),),
                              references=texts(record, "answers", where),
                              meta={"processed_answers": list(texts(record, "processed_answers", where)),
                                    "is_collection": record.get("is_collection"),
                                    "image_id": text(record, "image_id", where)}))
    if not items:
        raise SuiteDataError(f"{root}: no MaXM questions in split {opts.get('split') or lang!r}")
    return TaskData(items, ParquetImages(shards), shards)


# --- XM3600 / XM100 -------------------------------------------------------------------------------------------
def _xm3600(root: Path, lang: str, opts: dict):
    """(image key, captions, image store key) of every image with captions in `lang`, the store, the files read,
    what was skipped: from captions.jsonl and its image folder, or from floschne/xm3600 (parquet)."""
    if is_parquet_release(root, "captions.jsonl"):
        found, store, files = _xm3600_parquet(root, lang, opts)
        skipped = Counter()
    else:
        path = _file(root, ["captions.jsonl"], "XM3600 captions (captions.jsonl)")
        found, skipped, langs = [], Counter(), set()
        for line_no, row in read_jsonl(path, "XM3600 captions"):
            where = f"{path}:{line_no}"
            key = text(row, "image/key", where)
            langs |= {k for k, v in row.items() if isinstance(v, dict)}
            entry = row.get(lang)
            if entry is None:
                skipped[f"no {lang} captions"] += 1
                continue
            if not isinstance(entry, dict):
                raise SuiteDataError(f"{where}: {lang} must be an object with a 'caption' list")
            found.append((key, texts(entry, "caption", f"{where} {lang}"), key))
        if not found:
            raise SuiteDataError(f"{path}: no captions in language {lang!r} (languages found: "
                                 f"{', '.join(sorted(langs))})")
        store = FileImages(_image_root(opts, path.parent / "images", "XM3600"), "{id}.jpg")
        files = [path]
    if opts.get("subset"):
        subset = _subset(Path(opts["subset"]), {k for k, _, _ in found}, files[0] if len(files) == 1 else root)
        skipped["not in --subset"] = len(found) - len(subset)
        found = [f for f in found if f[0] in subset]
        files = files + [Path(opts["subset"])]
    return found, store, files, dict(skipped)


def _xm3600_parquet(root: Path, lang: str, opts: dict):
    """floschne/xm3600: a split per language (`fil` for Filipino, as XM3600), one row per image: `image_id` (the
    image/key), `image_locale`, `captions` (list; `captions_tokenized`, `captions_tokenized_lowercase` unread),
    `image` (embedded)."""
    shards = parquet_shards(root, opts.get("split") or lang)
    found = []
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["image_id", "captions", "image"]):
            where = f"{shard} row {row}"
            key = text(record, "image_id", where)
            if image_bytes(record["image"]) is None:
                raise SuiteDataError(f"{where} (image_id {key!r}): the image holds no bytes")
            found.append((key, texts(dict(record, captions=list(record["captions"] or [])), "captions", where),
                          (s, row, "image")))
    if not found:
        raise SuiteDataError(f"{root}: no XM3600 captions in split {(opts.get('split') or lang)!r}")
    return found, ParquetImages(shards), shards


def _subset(path: Path, known: set[str], captions: Path) -> set[str]:
    try:
        keys = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise FileNotFoundError(f"--subset {path}: no such file (one XM3600 image key per line)") from None
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise SuiteDataError(f"--subset {path}: {len(unknown)} image key(s) not in {captions}, e.g. {unknown[0]!r}")
    if not keys:
        raise SuiteDataError(f"--subset {path}: no image keys in the file")
    return set(keys)


def read_xm3600(root: Path, lang: str, opts: dict) -> TaskData:
    found, store, files, skipped = _xm3600(root, lang, opts)
    return TaskData([Item(id=k, lang=lang, images=(image,), references=caps, meta={"image_id": k})
                     for k, caps, image in found], store, files, skipped)


def read_xm100(root: Path, lang: str, opts: dict) -> TaskData:
    """XM3600 (captions.jsonl or floschne/xm3600) restricted by --subset to PangeaBench's 100 image keys, or
    PangeaBench's own copy (neulab/PangeaBench-xm100), already those 100."""
    if not opts.get("subset"):
        if is_parquet_release(root, "captions.jsonl"):
            return _xm100_parquet(root, lang, opts)
        raise SuiteDataError("xm100: give --subset, the file of the 100 XM3600 image keys PangeaBench evaluates on "
                             "(one per line; the image_id column of neulab/PangeaBench-xm100), or --data that copy")
    return read_xm3600(root, lang, opts)


def _xm100_parquet(root: Path, lang: str, opts: dict) -> TaskData:
    """PangeaBench's copy (neulab/PangeaBench-xm100): split `<lang>`, one row per caption (`image_id`: XM3600's
    hex key, `image`, `caption`: one string); the rows of one image are its references, in row order, and the
    image is read from its first row. The same items as captions.jsonl restricted to its 100 keys (--subset)."""
    shards = parquet_shards(root, opts.get("split") or lang)
    first: dict[str, tuple] = {}
    captions: dict[str, list[str]] = {}
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["image_id", "image", "caption"]):
            where = f"{shard} row {row}"
            key = text(record, "image_id", where)
            if key not in first:
                if image_bytes(record["image"]) is None:
                    raise SuiteDataError(f"{where} (image_id {key!r}): the image holds no bytes")
                first[key] = (s, row, "image")
            captions.setdefault(key, []).append(text(record, "caption", where))
    if not first:
        raise SuiteDataError(f"{root}: no XM100 captions in split {opts.get('split') or lang!r}")
    items = [Item(id=k, lang=lang, images=(first[k],), references=tuple(captions[k]), meta={"image_id": k})
             for k in first]
    return TaskData(items, ParquetImages(shards), shards)


def read_xm3600_retrieval(root: Path, lang: str, opts: dict) -> TaskData:
    found, store, files, skipped = _xm3600(root, lang, opts)
    data = RetrievalData(images=[ImageRef(k) for k, _, _ in found], captions=[])
    for index, (_, caps, _) in enumerate(found):
        data.captions.extend(caps)
        data.caption_image.extend([index] * len(caps))
    if isinstance(store, ParquetImages):       # the retrieval loop reads images by ImageRef
        store.refs = {ImageRef(k): image for k, _, image in found}
    items = [Item(id=k, lang=lang, images=(image,), references=caps, meta={"image_id": k}) for k, caps, image in found]
    return TaskData(items, store, files, skipped, retrieval=data)


# --- MTVQA ----------------------------------------------------------------------------------------------------
MTVQA_NAMES = {"arabic": "ar", "german": "de", "french": "fr", "italian": "it", "japanese": "ja", "korean": "ko",
               "russian": "ru", "thai": "th", "vietnamese": "vi",
               "kr": "ko"}      # Korean as Centurio's configs and other ports write it (the card's table says KO)


def read_mtvqa(root: Path, lang: str, opts: dict) -> TaskData:
    shards = parquet_shards(root, opts.get("split") or "test")
    items, skipped, langs = [], Counter(), set()
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["image", "qa_pairs", "lang"]):
            where = f"{shard} row {row}"
            raw = text(record, "lang", where).strip()
            code = MTVQA_NAMES.get(raw.lower(), raw.lower())
            langs.add(code)
            if code != lang:      # another language (one MTVQA does not have included) never stops the run
                continue
            if image_bytes(record["image"]) is None:
                raise SuiteDataError(f"{where}: the image holds no bytes")
            sample = str(record.get("id") or f"{split_of(shard)}-{row}")
            for k, pair in enumerate(literal_list(record["qa_pairs"], where, "qa_pairs")):
                at = f"{where} qa_pairs[{k}]"
                if not isinstance(pair, dict):
                    raise SuiteDataError(f"{at}: expected {{'question': ..., 'answer': ...}}, got {pair!r}"[:200])
                if not str(pair.get("answer") or "").strip():
                    skipped["empty answer"] += 1
                    continue
                items.append(Item(id=f"{sample}_{k}", lang=lang, question=text(pair, "question", at).strip(),
                                  images=((s, row, "image"),), references=(str(pair["answer"]),)))
    if not items:
        raise SuiteDataError(f"{root}: no MTVQA questions in language {lang!r} (languages found: "
                             f"{', '.join(sorted(langs))})")
    return TaskData(items, ParquetImages(shards), shards, dict(skipped))


# --- xMMMU ----------------------------------------------------------------------------------------------------
PLACEHOLDER = re.compile(r"<image (\d+)>")


def _letter_index(value: str, n: int, where: str) -> int:
    letter = value.strip()
    if len(letter) != 1 or letter not in LETTERS[:n]:
        raise SuiteDataError(f"{where}: answer {value!r} is not one of the option letters {LETTERS[:n]}")
    return LETTERS.index(letter)


def read_xmmmu(root: Path, lang: str, opts: dict) -> TaskData:
    shards = parquet_shards(root, opts.get("split") or lang)
    items = []
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["id", "question", "options", "answer", "question_type"]):
            where = f"{shard} row {row} (id {record.get('id')!r})"
            kind = text(record, "question_type", where)
            question = text(record, "question", where)
            meta = {"question_type": kind, "subject": "_".join(str(record["id"]).split("_")[1:-1])}
            if kind == "multiple-choice":
                options = tuple(str(o) for o in literal_list(record["options"], where, "options"))
                if len(options) < 2:
                    raise SuiteDataError(f"{where}: a multiple-choice question needs 2 or more options")
                golds = literal_list(record["answer"], where, "answer") if str(record["answer"]).startswith("[") \
                    else [record["answer"]]
                indices = [_letter_index(str(g), len(options), where) for g in golds]
                item = Item(id=text(record, "id", where), lang=lang, question=question, options=options,
                            answer=indices[0], meta=dict(meta, also_correct=indices[1:]))
            elif kind == "open":
                item = Item(id=text(record, "id", where), lang=lang, question=question,
                            references=(text(record, "answer", where),), meta=meta)
            else:
                raise SuiteDataError(f"{where}: question_type {kind!r} is neither 'multiple-choice' nor 'open'")
            shown = list(dict.fromkeys(PLACEHOLDER.findall(question + " " + " ".join(item.options))))
            keys = []
            for k in shown:
                column = f"image_{k}"
                if image_bytes(record.get(column)) is None:
                    raise SuiteDataError(f"{where}: the question shows <image {k}> but {column} holds no image")
                keys.append((s, row, column))
            item.images = tuple(keys)
            items.append(item)
    if not items:
        raise SuiteDataError(f"{root}: no xMMMU questions in split {lang!r}")
    return TaskData(items, ParquetImages(shards), shards)


# --- M3Exam ---------------------------------------------------------------------------------------------------
M3EXAM_NAMES = {"en": "english", "zh": "chinese", "af": "afrikaans", "it": "italian", "pt": "portuguese",
                "th": "thai", "vi": "vietnamese"}
M3EXAM_IMAGE = re.compile(r"\(image\)\[([^\]]+)\]")
OPTION_LABEL = re.compile(r"^\s*(?:[\(（]\s*([^\s()（）]{1,3})\s*[\)）]|([A-Za-z0-9]{1,2}|[\u0E01-\u0E2E])\s*[\.．、:：\)）])\s*")


def split_option(option: str) -> tuple[str | None, str]:
    """`"(2) firing on Fort Sumter"` -> ("2", "firing on Fort Sumter"); an option without a label -> (None, it)."""
    match = OPTION_LABEL.match(option)
    if not match:
        return None, option.strip()
    return (match.group(1) or match.group(2)), option[match.end():].strip()


def m3exam_gold(answer: str, labels: list[str | None], where: str) -> int:
    """The option `answer_text` names: the option carrying that label, else its position as a letter, a number
    or a Thai label (ก ข ค ง จ)."""
    answer = unicodedata.normalize("NFKC", answer).strip().strip("()（）.")
    for same in (lambda a, b: a == b, lambda a, b: a.lower() == b.lower()):
        hits = [i for i, label in enumerate(labels) if label is not None and same(unicodedata.normalize("NFKC", label),
                                                                                  answer)]
        if len(hits) == 1:
            return hits[0]
    n = len(labels)
    for alphabet in (LETTERS, THAI_LABELS):
        if len(answer) == 1 and answer in alphabet[:n]:
            return alphabet.index(answer)
    if answer.isdigit() and 1 <= int(answer) <= n:
        return int(answer) - 1
    raise SuiteDataError(f"{where}: answer_text {answer!r} names none of the {n} options (labels {labels})")


def _m3exam_item(q: dict, i: int, name: str, lang: str, where: str) -> tuple[Item, list[str]]:
    """One M3Exam question (the release's fields) as an item, and the image files its texts show, in the order
    their `<image k>` placeholders are numbered (background, question, options)."""
    background = q.get("background_description") or []
    if isinstance(background, str):
        background = literal_list(background, where, "background_description")
    if not isinstance(background, list) or not all(isinstance(b, str) for b in background):
        raise SuiteDataError(f"{where}: background_description must be a list of strings")
    options = q.get("options")
    if isinstance(options, str):
        options = literal_list(options, where, "options")
    labels, bodies = zip(*(split_option(o) for o in texts(dict(q, options=options), "options", where)))
    gold = m3exam_gold(text(q, "answer_text", where), list(labels), where)
    files: list[str] = []

    def mark(s: str) -> str:
        def sub(match):
            files.append(match.group(1).strip())
            return f"<image {list(dict.fromkeys(files)).index(match.group(1).strip()) + 1}>"
        return M3EXAM_IMAGE.sub(sub, s)
    background_text = "\n".join(mark(b) for b in background)
    question = mark(text(q, "question_text", where))
    shown = tuple(mark(b) for b in bodies)
    item = Item(id=str(q.get("id") or f"{name}-{i}"), lang=lang, question=question, options=shown, answer=gold,
                meta={"background": background_text, "subject_category": q.get("subject_category"),
                      "level": q.get("level"), "answer_text": q.get("answer_text")})
    return item, list(dict.fromkeys(files))


def read_m3exam(root: Path, lang: str, opts: dict) -> TaskData:
    name = M3EXAM_NAMES[lang]
    file = f"{name}-questions-image.json"
    if is_parquet_release(root, "*-questions-image.json"):
        return _m3exam_parquet(root, lang, name, opts)
    path = _file(root, [file, f"multimodal-questions/{file}", f"data/multimodal-questions/{file}"],
                 f"M3Exam multimodal questions of {name} ({file})")
    questions = read_json(path, "M3Exam file")
    if not isinstance(questions, list):
        raise SuiteDataError(f"{path}: not an M3Exam file (a JSON list of questions)")
    default = next((path.parent / f"{p}-{name}" for p in ("images", "iamges") if (path.parent / f"{p}-{name}").is_dir()),
                   path.parent / f"images-{name}")
    items = []
    for i, q in enumerate(questions):
        where = f"{path}: question {i}"
        if not isinstance(q, dict):
            raise SuiteDataError(f"{where}: expected an object")
        item, files = _m3exam_item(q, i, name, lang, where)
        item.images = tuple(files)
        items.append(item)
    if not items:
        raise SuiteDataError(f"{path}: no questions")
    store = FileImages(_image_root(opts, default, "M3Exam"), "{file}")
    return TaskData(items, store, [path])


M3EXAM_IMAGE_COLUMNS = 10      # PangeaBench-m3exam: image_0 ... image_9


def _m3exam_parquet(root: Path, lang: str, name: str, opts: dict) -> TaskData:
    """PangeaBench's copy (neulab/PangeaBench-m3exam): M3Exam's fields, one row per question, split by language
    (its code or M3Exam's name for it: `th` or `thai`; --split names another), with the images a question shows
    as base64 strings in `image_0` ... `image_9` (the literal "None" where there is none): `image_<k>` is the
    (k+1)-th distinct `(image)[file]` of the texts, in the order of their `<image k+1>` placeholders."""
    shards = None
    for split in ([opts["split"]] if opts.get("split") else [lang, name]):
        try:
            shards = parquet_shards(root, split)
            break
        except ReleaseError as err:
            if opts.get("split") or split == name:
                raise SuiteDataError(f"{err} (M3Exam's {lang} is split {lang!r} or {name!r})") from None
    items, i = [], 0
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["question_text", "options", "answer_text"]):
            where = f"{shard} row {row}"
            item, files = _m3exam_item(record, i, name, lang, where)
            keys = []
            for k, file in enumerate(files):
                column = f"image_{k}"
                if k >= M3EXAM_IMAGE_COLUMNS or image_bytes(record.get(column)) is None:
                    raise SuiteDataError(f"{where}: the question shows (image)[{file}] as <image {k + 1}> but "
                                         f"{column} holds no image")
                keys.append((s, row, column))
            item.images = tuple(keys)
            item.meta["image_files"] = files
            items.append(item)
            i += 1
    if not items:
        raise SuiteDataError(f"{root}: no M3Exam questions in split {(opts.get('split') or lang)!r}")
    return TaskData(items, ParquetImages(shards), shards)


# --- Kaleidoscope ---------------------------------------------------------------------------------------------
def _kaleidoscope_store(root: Path, opts: dict):
    given = Path(opts["images"]) if opts.get("images") else None
    base = root if root.is_dir() else root.parent
    for candidate in ([given] if given else [base / "final_data", base / "data.zip", base]):
        if candidate.is_file() and candidate.suffix == ".zip":
            store = ZipImages(candidate)
            names = store._open().namelist()
            store.prefix = "final_data/" if any(n.startswith("final_data/") for n in names) else ""
            return store
        if candidate.is_dir() and (given or (candidate / "data").is_dir()):
            return FileImages(candidate, "{file}")
    return None


def _kaleidoscope(root: Path, lang: str, opts: dict, multimodal_only: bool) -> TaskData:
    shards = parquet_shards(root, opts.get("split") or "train")
    items, langs, skipped = [], set(), Counter()
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, ["language", "question", "options", "answer", "image"]):
            where = f"{shard} row {row}"
            code = text(record, "language", where).strip()
            langs.add(code)
            if code != lang:
                continue
            options = [str(o) for o in literal_list(record["options"], where, "options")]
            answer = record["answer"]
            if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(options):
                raise SuiteDataError(f"{where}: answer must be an option index 0-{len(options) - 1}, got {answer!r}")
            image = record.get("image")
            image = None if image in (None, "", "None") else str(image)
            if multimodal_only and image is None:
                skipped["text-only question"] += 1
                continue
            keys = [image] if image else []
            shown = []
            for option in options:
                if option.lower().endswith(IMAGE_SUFFIXES):
                    keys.append(option)
                    shown.append(f"<image {len(keys)}>")
                else:
                    shown.append(option)
            items.append(Item(id=str(record.get("id") or f"{split_of(shard)}-{row}"), lang=lang,
                              question=text(record, "question", where), options=tuple(shown), answer=answer,
                              images=tuple(keys), meta={k: record.get(k) for k in ("category_en", "level",
                                                                                   "image_type", "country")}))
    if not items:
        raise SuiteDataError(f"{root}: no Kaleidoscope questions in language {lang!r} (languages found: "
                             f"{', '.join(sorted(langs))})")
    store = _kaleidoscope_store(root, opts)
    if store is None and any(item.images for item in items):
        raise MissingImagesError(f"{root}: Kaleidoscope's images are not here: give --images (the extracted "
                                 "final_data/ folder holding data/..., or the release's data.zip)")
    return TaskData(items, store, shards, dict(skipped))


def read_kaleidoscope(root: Path, lang: str, opts: dict) -> TaskData:
    return _kaleidoscope(root, lang, opts, multimodal_only=False)


def read_kaleidoscope_multimodal(root: Path, lang: str, opts: dict) -> TaskData:
    return _kaleidoscope(root, lang, opts, multimodal_only=True)


# --- VLMEvalKit multiple-choice TSVs (MMMB, MMBench-style sets) ---------------------------------------------------
# the cells pandas' read_csv (VLMEvalKit's `load`) reads as missing by default
PANDAS_NA = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                       "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
INTEGER = re.compile(r"[+-]?\d+")
DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
MMMB_FILES = {"en": "en", "zh": "cn", "pt": "pt", "ar": "ar", "tr": "tr", "ru": "ru"}
INDEX_REFERENCE = 64       # VLMEvalKit: an image cell of at most 64 characters is another row's index


def _tsv_columns(path: Path) -> dict[str, list]:
    """column -> its cells (None: missing), as pandas' default `read_csv(sep="\t")` gives them to VLMEvalKit: the
    missing-value words above, and a column whose cells are all numbers read as numbers (integers; with a missing
    cell, or a decimal, floats: "3" then prints "3.0"), kept here as the text VLMEvalKit's f-strings print."""
    lines = io.StringIO(read_text(path, "VLMEvalKit TSV"), newline="")     # lines end at \n, \r only (not U+2028)
    csv.field_size_limit(max(csv.field_size_limit(), min(sys.maxsize, 2 ** 31 - 1)))   # base64 images are long
    try:
        rows = [r for r in csv.reader(lines, delimiter="\t") if r]
    except csv.Error as err:
        raise SuiteDataError(f"{path}: not a readable TSV ({err})") from None
    if not rows:
        raise SuiteDataError(f"{path}: empty file (a VLMEvalKit TSV has a header line)")
    header, columns = rows[0], {}
    for r, row in enumerate(rows[1:], start=1):
        if len(row) > len(header):
            raise SuiteDataError(f"{path}: data row {r}: {len(row)} fields, the header has {len(header)}")
    for c, name in enumerate(header):
        cells = [row[c] if c < len(row) and row[c] not in PANDAS_NA else None for row in rows[1:]]
        present = [v for v in cells if v is not None]
        if present and all(INTEGER.fullmatch(v) for v in present):
            cells = [None if v is None else str(int(v) if len(present) == len(cells) else float(v)) for v in cells]
        elif present and all(DECIMAL.fullmatch(v) for v in present):
            cells = [None if v is None else str(float(v)) for v in cells]
        columns[name] = cells
    return columns


def _tsv_images(cell: str, where: str, column: str = "image") -> list[str]:
    """VLMEvalKit's `toliststr`: a cell "[...]" is a list literal of several images (or image paths)."""
    if len(cell) > 1 and cell[0] == "[" and cell[-1] == "]":
        try:
            value = ast.literal_eval(cell)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise SuiteDataError(f"{where}: {column} starts with '[' but is not a list literal") from None
        if not isinstance(value, (list, tuple)) or not value:
            raise SuiteDataError(f"{where}: {column} is not a non-empty list")
        return [str(v) for v in value]
    return [cell]


def read_vlmevalkit_tsv(path: Path, lang: str, opts: dict) -> TaskData:
    """The questions of one VLMEvalKit multiple-choice TSV, as VLMEvalKit builds them: rows without an image left
    out (counted), an image cell of at most 64 characters replaced by the image of the row it names, options
    the letter columns with a cell. A TSV without an `image` column names its images' files in `image_path`
    (VLMEvalKit's meta-only TSVs: a path or a list literal of paths; relative ones under --images, by default the
    TSV's folder)."""
    columns = _tsv_columns(path)
    missing = [c for c in ("index", "question", "answer") if c not in columns]
    if "image" not in columns and "image_path" not in columns:
        missing.append("image (or image_path)")
    if missing:
        raise SuiteDataError(f"{path}: missing column(s) {missing}; found {list(columns)}")
    letters = [c for c in LETTERS if c in columns]
    n_rows, skipped = len(columns["index"]), Counter()
    kept, seen = [], {}
    for r in range(n_rows):
        index = columns["index"][r]
        if index is None:
            raise SuiteDataError(f"{path}: data row {r + 1}: index is empty")
        if index in seen:
            raise SuiteDataError(f"{path}: data row {r + 1}: index {index} repeated (data row {seen[index] + 1})")
        seen[index] = r
        if "image" in columns and columns["image"][r] is None:
            skipped["no image"] += 1
            continue
        kept.append(r)
    embedded = "image" in columns
    cells = {columns["index"][r]: columns["image" if embedded else "image_path"][r] for r in kept}
    items, images = [], {}
    for r in kept:
        index = columns["index"][r]
        where = f"{path}: data row {r + 1} (index {index})"
        if not embedded:
            if cells[index] is None:
                raise SuiteDataError(f"{where}: image_path is empty")
            keys = _tsv_images(cells[index], where, "image_path")
        else:
            source, cell = index, cells[index]
            if len(cell) <= INDEX_REFERENCE:
                if cell not in cells or len(cells[cell]) <= INDEX_REFERENCE:
                    raise SuiteDataError(f"{where}: image {cell!r} is short, so the index of another row's image, "
                                         "but no row of that index holds an image")
                source, cell = cell, cells[cell]
            keys = []
            for k, encoded in enumerate(_tsv_images(cell, where)):
                images[(source, k)] = encoded
                keys.append((source, k))
        options = [columns[c][r] for c in letters]
        count = next((i for i, o in enumerate(options) if o is None), len(options))
        if any(o is not None for o in options[count:]):
            raise SuiteDataError(f"{where}: option {letters[count]} is empty but a later one is not (options "
                                 "must run from A without gaps)")
        if count < 2:
            raise SuiteDataError(f"{where}: {count} option(s); a multiple-choice question needs 2 or more")
        answer = columns["answer"][r]
        if answer is None or answer not in letters[:count]:
            raise SuiteDataError(f"{where}: answer {answer!r} is not one of the option letters "
                                 f"{''.join(letters[:count])}")
        question = columns["question"][r]
        if question is None:
            raise SuiteDataError(f"{where}: question is empty")
        meta = {"hint": columns.get("hint", [None] * n_rows)[r]}
        meta.update({k: columns[k][r] for k in ("category", "l2-category") if k in columns})
        items.append(Item(id=index, lang=lang, question=question, images=tuple(keys), options=tuple(options[:count]),
                          answer=letters.index(answer), meta=meta))
    if not items:
        raise SuiteDataError(f"{path}: no questions with an image")
    store = Base64Images(path, images) if embedded else FileImages(_image_root(opts, path.parent, "TSV"), "{file}")
    return TaskData(items, store, [path], dict(skipped))


def read_mmmb(root: Path, lang: str, opts: dict) -> TaskData:
    name = f"mmmb_{MMMB_FILES[lang]}.tsv"
    return read_vlmevalkit_tsv(_file(root, [name, f"mmmb/{name}"], f"MMMB file of language {lang!r} ({name})"), lang,
                               opts)


def read_vlmevalkit_mcq(root: Path, lang: str, opts: dict) -> TaskData:
    """--data is the TSV, or a folder with one TSV named `<lang>.tsv` or `<anything>_<lang>.tsv` (any case)."""
    if root.is_file():
        return read_vlmevalkit_tsv(root, lang, opts)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder")
    found = sorted(p for p in root.glob("*.tsv") if p.stem.lower() == lang.lower()
                   or p.stem.lower().endswith(f"_{lang.lower()}"))
    if len(found) != 1:
        raise FileNotFoundError(f"{root}: {len(found)} TSVs of language {lang!r} (<lang>.tsv or *_<lang>.tsv)"
                                + (f": {', '.join(p.name for p in found)}" if found else "") + "; give --data FILE.tsv")
    return read_vlmevalkit_tsv(found[0], lang, opts)
