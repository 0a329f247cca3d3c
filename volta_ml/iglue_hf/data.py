"""IGLUE's annotation files read for image-reading backends: examples with `ImageRef`s instead of region keys.

The field rules are the zoo loaders' (`volta_ml/tasks/*.py`): XVNLI keeps `sentence2` as the hypothesis and a
`-` gold label counts as wrong; xGQA reads a GQA-format question JSON (questionId -> question, imageId,
answer); MaRVL reads `caption`, `left_img`, `right_img`, `label` (a JSON boolean), and NLVR2's own rows
(`identifier`, `sentence`, `label` "True"/"False", the English training data of MaRVL); retrieval (xFlickr&CO, WIT)
keeps every caption with the index of its image, images unique in file order.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from volta_ml.data.annotations import AnnotationError, read_jsonl, require
from volta_ml.tasks import visual_entailment
from volta_ml.tasks.gqa import read_question_dict
from volta_ml.tasks.retrieval import key_candidates, row_captions

from .images import ImageRef


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
