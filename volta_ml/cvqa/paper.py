"""The CVQA paper's reference numbers (Romero et al., NeurIPS 2024, arXiv 2406.05967) and how our results map
onto its rows, as transcribed in `docs/cvqa.md` (specs: CVQA §0, §0b).

Every value is accuracy in % as (EN, LOC). Table 3 and Tables 5/6 use the location-aware prompt; Table 7 adds
the location-agnostic one. The generative models were scored with the letter rule, CLIP and M-CLIP by
image-text similarity; the open-ended variant is given for LLaVA-1.5-7B's English accuracy only ("about 30%").
Which average (over questions or over pairs) the paper's headline numbers are is not stated; ours are compared
as the average over questions ("micro").
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath

# paper row -> the checkpoints it names (hub ids; a local folder matches by its last path component)
MODELS = {
    "LLaVA-1.5-7B": ("llava-hf/llava-1.5-7b-hf", "liuhaotian/llava-v1.5-7b"),
    "M-CLIP": ("M-CLIP/XLM-Roberta-Large-Vit-B-32",),
    "CLIP": ("openai/clip-vit-large-patch14-336",),
    "mBLIP-mT0": ("Gregor/mblip-mt0-xl",),
    "mBLIP-BLOOMZ": ("Gregor/mblip-bloomz-7b",),
    "InstructBLIP": ("Salesforce/instructblip-flan-t5-xl",),
    "Gemini-1.5-Flash": ("gemini-1.5-flash",),
    "GPT-4o": ("gpt-4o",),
}
# backends whose results are the paper's rows (a blind control or a VOLTA encoder never is)
PAPER_BACKENDS = {"clip", "mclip", "mllm", "import"}
OPEN_RULES = {"open", "open-ended"}      # the open-ended rule; every other rule compares with the paper's main rows

TABLE3 = {"LLaVA-1.5-7B": (48.9, 36.5), "M-CLIP": (36.9, 33.4), "CLIP": (42.3, 31.5), "mBLIP-mT0": (31.5, 31.2),
          "mBLIP-BLOOMZ": (39.4, 33.0), "InstructBLIP": (47.8, 32.7), "Gemini-1.5-Flash": (67.1, 67.2),
          "GPT-4o": (79.1, 79.4)}
TABLE3_OPEN = {"LLaVA-1.5-7B": (30.0, None)}     # paper §4: 48.9% -> "30%" without options in the prompt

_T5_MODELS = ("LLaVA-1.5-7B", "M-CLIP", "CLIP", "mBLIP-mT0", "mBLIP-BLOOMZ", "InstructBLIP")
_T5 = {
    "Brands": ((47.7, 36.5), (37.8, 35.4), (40.1, 31.3), (33.5, 31.3), (40.3, 36.5), (46.9, 32.2)),
    "Food": ((45.9, 32.5), (33.1, 29.1), (40.8, 30.9), (27.8, 26.9), (37.4, 30.7), (43.8, 32.0)),
    "Geography": ((46.1, 37.9), (36.5, 35.6), (41.0, 32.7), (31.1, 32.6), (35.1, 32.6), (43.6, 32.5)),
    "Objects": ((50.5, 34.7), (36.4, 32.7), (39.0, 24.2), (32.4, 30.9), (42.3, 31.8), (52.0, 31.6)),
    "People": ((58.6, 38.7), (45.7, 38.2), (44.9, 36.2), (34.4, 34.1), (47.1, 37.6), (58.3, 38.1)),
    "Plants & Animals": ((54.8, 39.4), (40.6, 31.9), (45.9, 27.9), (35.4, 35.9), (46.4, 38.2), (56.8, 34.8)),
    "Pop Culture": ((43.5, 36.7), (32.6, 31.0), (44.5, 37.1), (30.6, 31.2), (35.8, 30.7), (45.0, 35.5)),
    "Sports": ((52.0, 40.0), (40.2, 32.6), (45.7, 34.6), (33.3, 30.7), (41.8, 34.4), (49.7, 36.5)),
    "Tradition": ((48.8, 37.1), (36.6, 34.9), (42.4, 31.8), (31.6, 32.1), (39.0, 32.9), (46.5, 30.5)),
    "Vehicles": ((50.9, 43.8), (38.4, 39.4), (40.5, 32.6), (37.4, 35.7), (42.1, 33.3), (52.6, 33.3)),
}
TABLE5 = {(category, model): values[i] for category, values in _T5.items() for i, model in enumerate(_T5_MODELS)}

TABLE6 = {
    ("Self-made", "LLaVA-1.5-7B"): (47.0, 34.0), ("Self-made", "M-CLIP"): (37.9, 34.0),
    ("Self-made", "CLIP"): (41.5, 30.4), ("Self-made", "mBLIP-mT0"): (34.4, 31.9),
    ("Self-made", "mBLIP-BLOOMZ"): (40.5, 34.2), ("Self-made", "InstructBLIP"): (49.1, 31.1),
    ("Web", "LLaVA-1.5-7B"): (48.0, 37.0), ("Web", "M-CLIP"): (36.8, 33.6), ("Web", "CLIP"): (44.1, 33.1),
    ("Web", "mBLIP-mT0"): (34.0, 32.8), ("Web", "mBLIP-BLOOMZ"): (39.6, 33.5), ("Web", "InstructBLIP"): (46.7, 33.1),
}

TABLE7_AGNOSTIC = {"LLaVA-1.5-7B": (47.7, 35.4), "M-CLIP": (37.5, 33.8), "CLIP": (43.1, 31.5),
                   "mBLIP-mT0": (34.2, 32.2), "mBLIP-BLOOMZ": (39.8, 33.6), "InstructBLIP": (47.5, 32.1)}
TABLE7 = {**{("aware", m): v for m, v in TABLE3.items() if m in TABLE7_AGNOSTIC},
          **{("agnostic", m): v for m, v in TABLE7_AGNOSTIC.items()}}

# Figure 3 values quoted in the paper's text (the figure itself is a plot)
FIGURE3 = {("Brazil-Portuguese", "LLaVA-1.5-7B"): (60.73, 51.16), ("Mongolia-Mongolian", "LLaVA-1.5-7B"): (40.0, 27.62)}

# the data's category names (their first word, case-folded) -> the paper's short names
CATEGORIES = {"brands": "Brands", "cooking": "Food", "food": "Food", "geography": "Geography", "objects": "Objects",
              "people": "People", "plants": "Plants & Animals", "public": "Pop Culture", "pop": "Pop Culture",
              "sports": "Sports", "tradition": "Tradition", "traditions": "Tradition", "vehicles": "Vehicles"}
IMAGE_SOURCES = {"self": "Self-made", "external": "Web", "web": "Web"}

CONTINENT_ORDER = ("Asia", "Europe", "Latin America", "Africa", "Other")
CONTINENTS = {
    "Asia": ("Indonesia", "Malaysia", "Mongolia", "China", "South Korea", "Korea", "S. Korea", "India", "Sri Lanka",
             "Pakistan", "Singapore", "Philippines", "Japan"),
    "Europe": ("France", "Bulgaria", "Ireland", "Spain", "Romania", "Norway", "Russia"),
    "Latin America": ("Ecuador", "Mexico", "Uruguay", "Argentina", "Colombia", "Chile", "Brazil"),
    "Africa": ("Kenya", "Rwanda", "Ethiopia", "Egypt", "Nigeria"),
}
_CONTINENT_OF = {country.casefold(): continent for continent, countries in CONTINENTS.items() for country in countries}


def paper_category(category: str) -> str:
    """`"Cooking and Food"` -> "Food"; a category the paper does not have keeps its own name."""
    words = re.findall(r"[a-z]+", category.casefold())
    return CATEGORIES.get(words[0], category) if words else category


def paper_image_source(image_type: str) -> str:
    return IMAGE_SOURCES.get(image_type.strip().casefold(), image_type)


def continent(pair: str) -> str:
    """The continent of a `Country-Language` pair (the country is everything before the last dash's language)."""
    country = pair.rsplit("-", 1)[0]
    return _CONTINENT_OF.get(country.casefold(), "Other")


def paper_row(backend: str | None, model: str | None, aliases: dict[str, str] | None = None) -> str | None:
    """The paper's row for a result, or None. `aliases` (result model -> paper row) comes from the user and
    wins; otherwise a hub id in `MODELS` matches case-insensitively, a local folder by its last component."""
    if not model:
        return None
    if aliases and model in aliases:
        return aliases[model]
    if backend not in PAPER_BACKENDS:
        return None
    name = model.rstrip("/").casefold().replace("\\", "/")
    cached = re.search(r"models--([^/]+?)--([^/]+)", name)      # a Hugging Face cache folder names its hub id
    if cached:
        name = f"{cached.group(1)}/{cached.group(2)}"
    base = PurePosixPath(name).name
    for row, ids in MODELS.items():
        for hub_id in ids:
            hub_id = hub_id.casefold()
            if name == hub_id or base == PurePosixPath(hub_id).name or name == row.casefold():
                return row
    return None
