"""The demo's synthetic multilingual visual-entailment task, written in IGLUE's XVNLI file layout.

Each scene is a PNG of one coloured shape on a noisy background; its box is kept for the extractor's
given-box mode. Each scene gets four hypotheses about one object:

| hypothesis                        | object drawn  | object absent  |
|-----------------------------------|---------------|----------------|
| "There is a red circle."          | entailment    | contradiction  |
| "The red circle is made of wood." | neutral       | contradiction  |

so the label is decided by the colour and shape of the region: from the text alone the best guess (and
the majority class, contradiction) scores 50%. An absent object differs from the drawn one in colour and in
shape. (Scenes of 2-4 shapes whose absent objects mix drawn colours and shapes were tried first: a small model
did not learn that binding within a CPU budget.)

Files (`<root>` = the output directory's `data/`), in the real XVNLI formats so the real loaders read them:
- `images/<id>.png`, `boxes.json` ({image id: [[x1, y1, x2, y2], ...]}, the extractor's `--boxes` file);
- `XVNLI/annotations/en/{train,dev,test}.jsonl`, `XVNLI/annotations/<lang>/test.jsonl` for de/fr/es;
- `XVNLI/annotations_machine-translate/<lang>/test.jsonl`: the same items translated back to English.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from volta_ml.demo import words

IMAGE_W, IMAGE_H = 320, 240
SPLIT_ID_BASE = {"train": 100000, "dev": 200000, "test": 300000}  # integer ids, as Flickr30k's


@dataclass(frozen=True)
class DemoSize:
    train_images: int
    dev_images: int
    test_images: int


SIZES = {
    "small": DemoSize(train_images=240, dev_images=24, test_images=32),
    "full": DemoSize(train_images=600, dev_images=60, test_images=120),
}


@dataclass
class Scene:
    image_id: str
    objects: list[tuple[str, str]]           # (colour, shape) per drawn shape
    boxes: list[list[float]]                 # x1, y1, x2, y2 per drawn shape, pixels
    hypotheses: list[dict] = field(default_factory=list)


@dataclass
class DemoData:
    root: Path
    images_dir: Path
    boxes_path: Path
    annotations: dict[str, Path]             # "train", "dev", "test/en", "test/de", "test_mt/de", ...
    scenes: dict[str, list[Scene]]

    def test_languages(self) -> list[str]:
        return [key.split("/")[1] for key in self.annotations if key.startswith("test/")]


def _place_boxes(rng: np.random.Generator, count: int) -> list[list[float]]:
    """Non-overlapping squares of 44-76 px (with a gap), by rejection sampling."""
    boxes: list[list[float]] = []
    for _ in range(500):
        if len(boxes) == count:
            break
        side = int(rng.integers(44, 77))
        x1, y1 = int(rng.integers(4, IMAGE_W - side - 4)), int(rng.integers(4, IMAGE_H - side - 4))
        box = [x1, y1, x1 + side, y1 + side]
        if all(box[2] + 6 < b[0] or b[2] + 6 < box[0] or box[3] + 6 < b[1] or b[3] + 6 < box[1] for b in boxes):
            boxes.append(box)
    return [[float(v) for v in b] for b in boxes]


def draw_scene(rng: np.random.Generator, objects: list[tuple[str, str]], boxes: list[list[float]]):
    from PIL import Image, ImageDraw

    tint = rng.integers(215, 241, size=3)  # light, nearly grey: colour and shape are what varies
    pixels = np.clip(tint + rng.normal(0, 6, size=(IMAGE_H, IMAGE_W, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    for (colour, shape), (x1, y1, x2, y2) in zip(objects, boxes):
        fill = tuple(int(np.clip(v + rng.integers(-12, 13), 0, 255)) for v in words.RGB[colour])
        if shape == "circle":
            draw.ellipse([x1, y1, x2, y2], fill=fill)
        elif shape == "square":
            draw.rectangle([x1, y1, x2, y2], fill=fill)
        else:
            draw.polygon([((x1 + x2) / 2, y1), (x2, y2), (x1, y2)], fill=fill)
    return image


def _absent_object(rng: np.random.Generator, objects: list[tuple[str, str]]) -> tuple[str, str]:
    """An object not drawn, differing from every drawn shape in colour and in shape."""
    colours = {c for c, _ in objects}
    shapes = {s for _, s in objects}
    pool = [(c, s) for c in words.COLOURS for s in words.SHAPES if c not in colours and s not in shapes]
    return pool[int(rng.integers(len(pool)))]


def make_scene(rng: np.random.Generator, image_id: str) -> Scene:
    count = 1   # one shape per scene: a task a small model learns from a few hundred scenes on a CPU
    pool = [(c, s) for c in words.COLOURS for s in words.SHAPES]
    picked = rng.choice(len(pool), size=count, replace=False)
    objects = [pool[int(i)] for i in picked]
    boxes = _place_boxes(rng, count)
    objects = objects[:len(boxes)]
    scene = Scene(image_id, objects, boxes)
    present = objects[int(rng.integers(len(objects)))]
    absent = _absent_object(rng, objects)
    props = rng.choice(len(words.PROPERTIES), size=2)
    scene.hypotheses = [
        {"kind": "exists", "object": present, "label": "entailment"},
        {"kind": "exists", "object": absent, "label": "contradiction"},
        {"kind": "property", "object": present, "prop": words.PROPERTIES[int(props[0])], "label": "neutral"},
        {"kind": "property", "object": absent, "prop": words.PROPERTIES[int(props[1])], "label": "contradiction"},
    ]
    order = rng.permutation(4)
    scene.hypotheses = [scene.hypotheses[int(i)] for i in order]
    return scene


def hypothesis_text(lang: str, hyp: dict, translated: bool = False) -> str:
    colour, shape = hyp["object"]
    if hyp["kind"] == "exists":
        return words.translate_exists(lang, colour, shape) if translated else \
            words.exists_sentence(lang, colour, shape)
    return words.translate_property(lang, colour, shape, hyp["prop"]) if translated else \
        words.property_sentence(lang, colour, shape, hyp["prop"])


def xvnli_rows(scenes: list[Scene], lang: str, translated: bool = False) -> list[dict]:
    """XVNLI JSONL rows (the keys and id shapes of IGLUE's files)."""
    rows = []
    for scene in scenes:
        premise = words.caption("en" if translated else lang, scene.objects)
        for k, hyp in enumerate(scene.hypotheses):
            rows.append({"gold_label": hyp["label"], "sentence1": premise,
                         "sentence2": hypothesis_text(lang, hyp, translated),
                         "captionID": f"{scene.image_id}.jpg#0", "pairID": f"{scene.image_id}.jpg#0r{k}{hyp['label'][0]}",
                         "Flikr30kID": scene.image_id})
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def generate(root: str | Path, size: DemoSize, seed: int, languages=words.LANGUAGES, progress=None) -> DemoData:
    """Draw every scene, write images, boxes and annotation files under `root`."""
    root = Path(root)
    images_dir = root / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    scenes: dict[str, list[Scene]] = {}
    all_boxes: dict[str, list[list[float]]] = {}
    counts = {"train": size.train_images, "dev": size.dev_images, "test": size.test_images}
    for split, count in counts.items():
        scenes[split] = []
        for i in range(count):
            scene = make_scene(rng, str(SPLIT_ID_BASE[split] + i))
            draw_scene(rng, scene.objects, scene.boxes).save(images_dir / f"{scene.image_id}.png")
            all_boxes[scene.image_id] = scene.boxes
            scenes[split].append(scene)
            if progress is not None:
                progress.update(1)
    boxes_path = root / "boxes.json"
    boxes_path.write_text(json.dumps(all_boxes), encoding="utf-8")

    annotations = annotation_paths(root, languages)
    for key, path in annotations.items():
        kind, _, lang = key.partition("/")
        split = "test" if kind.startswith("test") else kind
        _write_jsonl(path, xvnli_rows(scenes[split], lang or "en", translated=kind == "test_mt"))
    return DemoData(root, images_dir, boxes_path, annotations, scenes)


def annotation_paths(root: str | Path, languages=words.LANGUAGES) -> dict[str, Path]:
    """Where `generate` writes each annotation file: "train", "dev", "test/<lang>", "test_mt/<lang>" (not en)."""
    xvnli = Path(root) / "XVNLI"
    paths = {"train": xvnli / "annotations/en/train.jsonl", "dev": xvnli / "annotations/en/dev.jsonl"}
    paths.update({f"test/{lang}": xvnli / f"annotations/{lang}/test.jsonl" for lang in languages})
    paths.update({f"test_mt/{lang}": xvnli / f"annotations_machine-translate/{lang}/test.jsonl"
                  for lang in languages if lang != "en"})
    return paths


def generated(root: str | Path, languages=words.LANGUAGES) -> DemoData:
    """The files `generate` wrote under `root` earlier (a resumed demo), without the scenes."""
    root = Path(root)
    return DemoData(root, root / "images", root / "boxes.json", annotation_paths(root, languages), {})


def total_images(size: DemoSize) -> int:
    return size.train_images + size.dev_images + size.test_images


def shuffled_images_copy(path: Path, seed: int) -> Path:
    """A copy of an XVNLI file whose examples point at another scene's image (each scene's four rows move
    together to the next scene's image): a control that shows whether the model reads the pictures."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = list(dict.fromkeys(row["Flikr30kID"] for row in rows))
    order = np.random.default_rng(seed + 1).permutation(len(ids))
    # a cyclic shift of a random order: no scene keeps its own image
    moved = {ids[int(order[i])]: ids[int(order[(i + 1) % len(ids)])] for i in range(len(ids))}
    for row in rows:
        row["Flikr30kID"] = moved[row["Flikr30kID"]]
    return _write_jsonl(Path(path).with_name(Path(path).stem + "_shuffled_images.jsonl"), rows)


def _template(sentence: str) -> str:
    for word in words.COLOURS + words.SHAPES:
        sentence = sentence.replace(word, "_")
    return sentence


def chance_levels(path: Path) -> dict[str, float]:
    """Accuracy (%) of guessing without the image: uniform, the majority class, and the best text-only rule
    (per sentence template with colour and shape blanked, its most frequent label)."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    labels: dict[str, int] = {}
    per_template: dict[str, dict[str, int]] = {}
    for row in rows:
        labels[row["gold_label"]] = labels.get(row["gold_label"], 0) + 1
        counts = per_template.setdefault(_template(row["sentence2"]), {})
        counts[row["gold_label"]] = counts.get(row["gold_label"], 0) + 1
    n = max(len(rows), 1)
    return {"uniform": 100.0 / 3, "majority": 100.0 * max(labels.values(), default=0) / n,
            "text_only": 100.0 * sum(max(c.values()) for c in per_template.values()) / n}
