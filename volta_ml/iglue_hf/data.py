"""IGLUE's annotation files read for image-reading backends: examples with `ImageRef`s instead of region keys.

The field rules are the zoo loaders' (`volta_ml/tasks/*.py`): XVNLI keeps `sentence2` as the hypothesis and a
`-` gold label counts as wrong; xGQA reads a GQA-format question JSON (questionId -> question, imageId,
answer); MaRVL reads `caption`, `left_img`, `right_img`, `label` (a JSON boolean), and NLVR2's own rows
(`identifier`, `sentence`, `label` "True"/"False", the English training data of MaRVL); retrieval (xFlickr&CO, WIT)
keeps every caption with the index of its image, images unique in file order.

floschne's hub copies of XVNLI, xGQA and MaRVL (`floschne/xvnli`, `floschne/xgqa`, `floschne/marvl`: parquet, a
split per language, images embedded, no region features; the way current-model papers run IGLUE) are read by
`read_copy` through one row per task of `COPIES` (docs/hf_models.md: which field is which, and what differs from
IGLUE's own files); their images come from the parquet cells (`images.ParquetSource`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from volta_ml.data.annotations import AnnotationError, read_jsonl, require
from volta_ml.engine.failures import UsageError
from volta_ml.tasks import visual_entailment
from volta_ml.tasks.gqa import read_question_dict
from volta_ml.tasks.retrieval import key_candidates, row_captions

from .images import ImageRef, ParquetSource
from .parquet import ParquetCells, ReleaseError, image_bytes, parquet_rows, parquet_shards


@dataclass
class Example:
    id: str
    images: tuple[ImageRef, ...]
    text: str
    label: str              # gold answer / label name ("-" = no gold: counts as wrong, as VOLTA)
    line: int


@dataclass
class RetrievalData:
    images: list[ImageRef]
    captions: list[str]
    caption_image: list[int] = field(default_factory=list)


def read_xvnli(path: str, lang: str) -> list[Example]:
    out = []
    for record in visual_entailment.read_examples(path):
        label = visual_entailment.LABEL_NAMES[record["label"]] if record["label"] >= 0 else "-"
        out.append(Example(str(record["pair_id"] or record["question_id"]), (ImageRef(record["image_id"], lang=lang),),
                           record["text"], label, record["line"]))
    return out


def read_xgqa(path: str, lang: str) -> list[Example]:
    return [Example(str(key), (ImageRef(str(row["imageId"]), lang=lang),), str(row["question"]), str(row["answer"]),
                    position)
            for position, key, row in read_question_dict(path, ("question", "imageId", "answer"))]


def read_marvl(path: str, lang: str) -> list[Example]:
    """MaRVL rows, or NLVR2 rows (`identifier`, `sentence`, `label` "True"/"False"; the images are
    `<identifier without its last field>-img0.png` / `-img1.png`), as the zoo's loader reads both."""
    out = []
    for index, (line_no, row) in enumerate(read_jsonl(path)):
        if "identifier" in row and "caption" not in row:
            identifier = str(require(row, "identifier", path, line_no))
            stem = "-".join(identifier.split("-")[:-1])
            refs = tuple(ImageRef(f"{stem}-img{k}", f"{stem}-img{k}.png", lang=lang) for k in (0, 1))
            true = require(row, "label", path, line_no) != "False"     # NLVR2: anything but "False" is true
            out.append(Example(identifier, refs, str(require(row, "sentence", path, line_no)),
                               "true" if true else "false", line_no))
            continue
        label = require(row, "label", path, line_no)
        if not (isinstance(label, bool) or label in (0, 1)):
            raise AnnotationError(f"{path}:{line_no}: MaRVL label must be a JSON boolean, got {label!r}")
        concept, row_lang = str(row.get("concept", "")), str(row.get("language") or lang)
        refs = tuple(ImageRef(os.path.basename(name).split(".")[0], os.path.basename(name), concept, row_lang)
                     for name in (str(require(row, "left_img", path, line_no)),
                                  str(require(row, "right_img", path, line_no))))
        out.append(Example(str(row.get("id", index)), refs, str(require(row, "caption", path, line_no)),
                           "true" if label else "false", line_no))
    return out


def read_retrieval(path: str, lang: str) -> RetrievalData:
    """xFlickr&CO (`sentences`, `img_path`/`id`) or WIT (`caption_reference_description`, `wit_ix`)."""
    data, index = RetrievalData([], []), {}
    for line_no, row in read_jsonl(path):
        texts = row_captions(row, path, line_no)
        key = key_candidates(row)[0]
        if key not in index:
            index[key] = len(data.images)
            stem = key.split(".")[0] if "wit_ix" not in row else key
            data.images.append(ImageRef(stem, key if "wit_ix" not in row else "", lang=lang))
        data.captions.extend(texts)
        data.caption_image.extend([index[key]] * len(texts))
    if not data.captions:
        raise AnnotationError(f"{path}: no captions")
    return data


READERS = {"xvnli": read_xvnli, "xgqa": read_xgqa, "marvl": read_marvl, "xflickrco": read_retrieval,
           "wit": read_retrieval}


def read_task(task: str, path: str, lang: str):
    """The task's examples (or retrieval data) of the file; a file holding none is an `AnnotationError` naming it."""
    data = READERS[task](path, lang)
    if not (data.captions if isinstance(data, RetrievalData) else data):
        raise AnnotationError(f"{path}: no {task} example in this annotation file")
    return data


def image_refs(task_data) -> list[ImageRef]:
    if isinstance(task_data, RetrievalData):
        return list(task_data.images)
    return [ref for example in task_data for ref in example.images]


# --- floschne's hub copies ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopySchema:
    """Which columns of a hub copy hold what IGLUE's file holds."""
    text: str                      # the statement / hypothesis / question
    translated: str | None         # the English machine translation (translate-test), where the copy has one
    label: str                     # the gold label / answer
    images: tuple[str, ...]        # image cells, in prompt order
    image_ids: tuple[str, ...]     # the image id of each image cell
    ids: tuple[str, ...] = ()      # the example id: the first of these columns present (else the row's position)
    concept: str | None = None     # MaRVL's concept (an ImageRef field)


COPIES = {
    "xvnli": CopySchema("hypothesis", None, "label", ("image",), ("flikr30k_id",), ("pairID", "pair_id", "id")),
    "xgqa": CopySchema("question", None, "answer", ("image",), ("image_id",), ("question_id", "id")),
    "marvl": CopySchema("hypothesis", "hypo_en", "label", ("left_img", "right_img"), ("left_img_id", "right_img_id"),
                        ("id",), concept="concept"),
}
_LABELS = {"xvnli": lambda v: str(v) if str(v) in visual_entailment.LABELS else None,
           "xgqa": lambda v: str(v) if str(v).strip() else None,
           "marvl": lambda v: ("true" if v else "false") if isinstance(v, bool) or v in (0, 1) else None}


def read_copy(task: str, root, lang: str, translated: bool = False) -> tuple[list[Example], ParquetSource]:
    """The examples of split `lang` of a hub copy (a parquet file or folder, its card's `configs` read) and the
    source of their embedded images. `translated`: the copy's English machine translation as the text
    (translate-test)."""
    if task not in COPIES:
        raise UsageError(f"{task}: no hub copy with embedded images is read for this task (known: {', '.join(COPIES)});"
                         " give IGLUE's annotation file and --images")
    schema = COPIES[task]
    if translated and schema.translated is None:
        raise UsageError(f"{task}: the hub copy has no English translations; translate-test needs IGLUE's _mt file")
    column = schema.translated if translated else schema.text
    shards = parquet_shards(Path(root), lang)
    examples, index = [], {}
    for s, shard in enumerate(shards):
        for row, record in parquet_rows(shard, [column, schema.label, *schema.images, *schema.image_ids]):
            where = f"{shard} row {row}"
            label = _LABELS[task](record[schema.label])
            if label is None:
                raise ReleaseError(f"{where}: {schema.label} {record[schema.label]!r} is not a {task} label")
            refs = []
            for cell, id_column in zip(schema.images, schema.image_ids):
                if image_bytes(record[cell]) is None:
                    raise ReleaseError(f"{where}: {cell} holds no image bytes")
                image_id = str(record[id_column]).strip()
                if not image_id:
                    raise ReleaseError(f"{where}: {id_column} is empty")
                ref = ImageRef(image_id, concept=str(record.get(schema.concept) or "") if schema.concept else "",
                               lang=lang)
                index.setdefault(ref, (s, row, cell))
                refs.append(ref)
            text = record[column]
            if not isinstance(text, str) or not text.strip():
                raise ReleaseError(f"{where}: {column} must be a non-empty text, got {text!r}"[:200])
            key = next((str(record[c]) for c in schema.ids if record.get(c) not in (None, "")), str(len(examples)))
            examples.append(Example(key, tuple(refs), text, label, row + 1))
    if not examples:
        raise ReleaseError(f"{root}: no {task} example in split {lang!r}")
    return examples, ParquetSource(ParquetCells(shards), index)
