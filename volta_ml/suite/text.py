"""Text processing of the suite's rules: answer normalisation and the tokens CIDEr is computed on.

CIDEr's tokens, as the reference evaluation of the mBLIP / Centurio line computes XM3600 (gregor-ge/mBLIP
`data/xm3600/convert_xm3600_to_coco.py` for the references, `src/tasks/vllm/evaluation.py` `caption_evaluation`
for the predictions):
1. `segment`: Chinese, Japanese and Thai captions are split into words by spaCy's tokenizer of the language and
   the words joined by spaces; then every caption is put in Unicode NFC (in this order);
2. the PTB step: pycocoevalcap's `PTBTokenizer` (the Stanford CoreNLP 3.4.1 jar, run by Java, one line per
   caption, lower case) and the removal of its punctuation tokens; CIDEr-D then splits at whitespace.

Segmenters (`SEGMENTERS`; spaCy itself is not needed: what its tokenizers do is done here with the libraries
they call, and the words each yields are the same):
- zh: spaCy's default Chinese tokenizer (`segmenter = "char"`): every character a word, whitespace left out;
  Latin letters and digits are single characters too ("T恤" -> "T 恤", "2个" -> "2 个");
- ja: spaCy's Japanese tokenizer: SudachiPy, split mode A (spaCy's default, `split_mode = None`), its default
  dictionary `sudachidict_core`; the words are the morphemes' surface forms, empty and whitespace ones left out;
- th: spaCy's Thai tokenizer: PyThaiNLP's `word_tokenize` as spaCy calls it (its defaults: engine `newmm`, named
  here, whitespace kept as words), the words joined by spaces as they come.
Whitespace words change nothing after step 2 (both PTB steps split at every whitespace character), so leaving
them out of zh / ja is exact. The versions of the packages are recorded with each result (`rule_tools`):
Japanese words depend on the dictionary's version.

The PTB step has two implementations: `ptb_jar` runs pycocoevalcap's own `PTBTokenizer` (the default: what the
reference runs; it needs Java), and `ptb.tokens` follows the jar in Python for machines without Java (the
`cider-pyptb` rule; docs/suite.md lists where it differs, tests/test_suite_ptb.py measures it against the jar).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import unicodedata
import warnings
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from volta_ml.engine.failures import UsageError

ARTICLES = {"a", "an", "the"}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
INSTALL = "pip install 'volta-ml[suite]'"


def is_punct(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


# --- word segmentation (spaCy's tokenizers of zh / ja / th, as the reference calls them) --------------------------
def _chinese(text: str) -> str:
    return " ".join(c for c in text if not c.isspace())


@lru_cache(maxsize=1)
def _sudachi():
    import sudachipy

    with warnings.catch_warnings():          # sudachipy >= 0.7 calls create() deprecated; spaCy still calls it
        warnings.simplefilter("ignore", DeprecationWarning)
        return sudachipy.Dictionary().create(mode=sudachipy.SplitMode.A)


def _japanese(text: str) -> str:
    return " ".join(m.surface() for m in _sudachi().tokenize(text) if m.surface() and not m.surface().isspace())


def _thai(text: str) -> str:
    from pythainlp.tokenize import word_tokenize

    return " ".join(word_tokenize(text, engine="newmm"))


SEGMENTERS = {"zh": _chinese, "ja": _japanese, "th": _thai}
# language -> (what the segmenter is, the packages it needs: the first is imported to check it is there)
SEGMENTER_PACKAGES = {
    "zh": ("one word per character (spaCy's char segmenter)", ()),
    "ja": ("SudachiPy, split mode A, dictionary sudachidict_core (spaCy's Japanese tokenizer)",
           ("sudachipy", "sudachidict_core")),
    "th": ("PyThaiNLP word_tokenize, engine newmm (spaCy's Thai tokenizer)", ("pythainlp",)),
}


def prepare(text: str, lang: str, segment: bool = True) -> str:
    """A caption as the reference hands it to the PTB tokenizer: zh / ja / th split into words joined by spaces
    (`segment`), then NFC."""
    if segment and lang in SEGMENTERS:
        text = SEGMENTERS[lang](text)
    return unicodedata.normalize("NFC", text)


def segmenter_versions(lang: str) -> dict:
    """The segmenter of `lang` and the versions of its packages; one UsageError line naming what to install when
    one is missing."""
    if lang not in SEGMENTER_PACKAGES:
        return {}
    what, packages = SEGMENTER_PACKAGES[lang]
    versions = {}
    for package in packages:
        try:
            __import__(package)
            versions[package] = metadata.version(package)
        except ImportError:
            raise UsageError(f"CIDEr for {lang!r} segments words as the reference evaluation does ({what}), which "
                             f"needs {' and '.join(packages)}: {INSTALL} (or pip install {' '.join(packages)})") from None
    return {"segmenter": what, **versions}


# --- the PTB step: pycocoevalcap's PTBTokenizer (Java) ----------------------------------------------------------
# characters the jar ends a line at besides "\n" (which pycocoevalcap's wrapper already replaces by a space): in a
# caption they would start another line and shift every later caption onto another caption's tokens
JAR_LINE_BREAKS = re.compile("[\r\x0b\x0c\x85\u2028\u2029]")


@lru_cache(maxsize=1)
def jar_versions() -> dict:
    """pycocoevalcap's PTBTokenizer can run: the package, its jar, Java on PATH, a writable jar folder (the wrapper
    writes its temporary file there). Returns what it runs with; one UsageError line naming the fix otherwise."""
    other = "or score with --rule cider-pyptb (the PTB step in Python, docs/suite.md)"
    try:
        from pycocoevalcap.tokenizer import ptbtokenizer
    except ImportError:
        raise UsageError(f"CIDEr needs the pycocoevalcap package: {INSTALL}") from None
    folder = Path(ptbtokenizer.__file__).parent
    jar = folder / ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
    if not jar.is_file():
        raise UsageError(f"pycocoevalcap's PTBTokenizer jar is missing ({jar}): reinstall pycocoevalcap, {other}")
    java = shutil.which("java")
    if java is None:
        raise UsageError("the cider rule tokenises with pycocoevalcap's PTBTokenizer, a Java program, and no java is "
                         f"on PATH: install a Java runtime (e.g. apt install default-jre-headless), {other}")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"pycocoevalcap's PTBTokenizer writes its temporary file next to its jar, in {folder}, "
                         f"which is not writable: install pycocoevalcap where you can write, {other}")
    probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=120)
    version = (probe.stderr or probe.stdout).strip().splitlines()
    return {"pycocoevalcap": metadata.version("pycocoevalcap"), "ptb_jar": jar.name,
            "java": version[0] if version else java}


def ptb_jar(captions: list[str]) -> list[str]:
    """pycocoevalcap's `PTBTokenizer.tokenize` on `captions` in one call (one Java process), in their order: one
    string of tokens per caption, punctuation tokens removed, as the reference scores them."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    if not captions:
        return []
    lines = {i: [{"caption": JAR_LINE_BREAKS.sub(" ", c)}] for i, c in enumerate(captions)}
    tokenized = PTBTokenizer().tokenize(lines)
    if len(tokenized) != len(captions) or any(len(tokenized.get(i, ())) != 1 for i in range(len(captions))):
        raise RuntimeError(f"pycocoevalcap's PTBTokenizer returned {sum(map(len, tokenized.values()))} lines for "
                           f"{len(captions)} captions: did java fail? (its messages are above)")
    return [tokenized[i][0] for i in range(len(captions))]


# --- answers ----------------------------------------------------------------------------------------------------
def answer_words(text: str) -> list[str]:
    """An answer's words for exact matching: NFKC (full-width forms folded), lower case, every punctuation mark a
    space."""
    text = unicodedata.normalize("NFKC", text).lower()
    return "".join(" " if is_punct(c) else c for c in text).split()


def normalise_answer(text: str, lang: str) -> str:
    """The answer normalisation of the `exact` MaXM rule: `answer_words`, and for English the VQA conventions
    (number words zero-ten as digits, articles a / an / the dropped). Idempotent."""
    words = answer_words(text)
    if lang == "en":
        words = [NUMBER_WORDS.get(w, w) for w in words if w not in ARTICLES]
    return " ".join(words)
