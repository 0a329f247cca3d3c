"""CIDEr's PTB step: pycocoevalcap's PTBTokenizer (the CoreNLP jar, the default `cider` rule) against its Python
re-implementation (`cider-pyptb`, volta_ml/suite/ptb.py), measured on a multilingual corpus in one run of the jar;
and the one-line errors when the jar or a segmenter cannot run."""
from __future__ import annotations

import pytest

from helpers_suite import XM_CAPTIONS, needs_java, write_xm3600
from test_suite import CAPTIONS, _cli
from volta_ml.suite import ptb
from volta_ml.suite.text import jar_versions, prepare, ptb_jar

HARD = [
    # brackets, quotes, dashes, ellipses (the jar writes -lrb- ... and keeps them; pycocoevalcap drops `` '' -- ...)
    "A man's bicycle, leaning (against) a wall. Don't!", "Two [red] {blue} cars -- one's parked.",
    'She said "hello" and \'bye\' to them.', "“Curly quotes” and ‘single’ ones.", "„German“ text and «French» ones",
    "Wait... what?! Yes -- no.", "Wait…", "a --- b ----- c", "x---y", ". . .", "a....b", "'' double ``",
    # clitics, elisions and other apostrophes
    "I can't, won't, shouldn't; they'd've gone.", "man’s car, don’t go", "L'homme aujourd'hui, c'est l'été.",
    "j'ai faim, n'est pas, qu'il, l’homme-objet", "x'y 'tis rock 'n' roll o'clock", "dell'acqua un'altra c'era",
    "the dogs' toys, y'all, O'Neil, JAMES'S", "'90s music", "cannot gonna", "5'10\" tall",
    # hyphens, numbers, currency, symbols
    "A well-known 3-year-old boy.", "Price: $3.50, 50% off, 1,000 people, 3/4 cup, 12:30 pm.", "-5 and +5 degrees",
    "½ cake, £5, €10, ¥100, 50¢", "US$5 now", "word/word * star # hash @ at ^ caret ~ tilde | pipe \\ backslash",
    "a/b/c/d and/or 12/05/2020", "1.000,50 and .5", "AT&T c++ f# x&y", "ENDASH – EMDASH — minus − hyphen-",
    "re- do -ish —word", "e-mail me at a@b.com or http://x.org/a?b=c", "#tag @user", "**bold** __under__",
    # abbreviations and acronyms (they keep their period)
    "The U.S. army & Co. Ltd.", "e.g. this, i.e. that", "Un barco en el mar.", "Mr. Smith on St. Louis Ave.",
    "No. 5 and fig. 3", "vitamin C.", "a.b-c word.word",
    # scripts: Arabic, Hindi, Thai, Chinese, Japanese, Korean, Greek, Cyrillic, Hebrew, Persian (zero-width non-joiner)
    "رجل يركب دراجة، في الشارع؟", "एक आदमी साइकिल चला रहा है।", "ผู้ชาย ขี่ จักรยาน บน ถนน", "一 辆 红 色 的 汽 车 ， 停 在 路 边 。",
    "「 猫 」 と 『 犬 』 、 【 写真 】 〜", "한국어 문장입니다.", "Ελληνικά κείμενο, με τόνους.", "Один человек — на улице.",
    "אדם רוכב על אופניים.", "مردی در حال رانندگی می‌کند", "٣٫٥ كيلو", "¿Qué? ¡Sí!", "naïve café résumé", "Tiếng Việt có dấu.",
    # emoji (the jar deletes what lies outside the Basic Multilingual Plane), joiners, other spaces, line breaks
    "A dog 🐶 with a ball ⚽ 👍🏽.", "tab\there  two  spaces\u00a0nbsp\u3000ideo", "x\ry", "p\u2028q", "soft\u00adhyphen",
    "a<b>c = d + e", "<br/> and <a href='x'> tags",
    # what the jar does and the Python step does not (KNOWN below, docs/suite.md)
    "Call (555) 123-4567 now", "1-1/2 cups", "ఒక కఀ పిల్లి", "Take vitamin C.", "The end",
]
# caption -> (the jar's tokens, the Python step's tokens): the differences left, each listed in docs/suite.md
KNOWN = {
    "Call (555) 123-4567 now": ("call -lrb-555-rrb-\u00a0123-4567 now", "call -lrb- 555 -rrb- 123-4567 now"),
    "1-1/2 cups": ("1-1/2 cups", "1-1 / 2 cups"),
    "ఒక కఀ పిల్లి": ("ఒక క పిల్లి", "ఒక కఀ పిల్లి"),      # U+0C00: a mark newer than the jar's tables, deleted there
    "Take vitamin C.": ("take vitamin c", "take vitamin c."),  # the jar reads on: the next caption starts with "The"
}


def corpus() -> list[str]:
    """The fixture's captions in every language as the reference hands them to the tokenizer, the captions the
    end-to-end tests generate, and the hard cases."""
    pytest.importorskip("sudachipy", reason="Japanese segmentation needs sudachipy (the test extra)")
    fixture = [prepare(c, lang) for lang, per_image in XM_CAPTIONS.items() for caps in per_image for c in caps]
    return fixture + [prepare(c, "zh") for c in CAPTIONS] + HARD


@needs_java
def test_python_ptb_step_agrees_with_the_jar():
    """Every caption of the corpus gets the jar's tokens from the Python step, but the known differences; and a
    line break the jar knows (\\r, U+2028) neither shifts the captions after it nor drops any."""
    captions = corpus()
    jar = ptb_jar(captions)
    python = [" ".join(ptb.tokens(c)) for c in captions]
    assert len(jar) == len(captions)
    differ = {c: (j, p) for c, j, p in zip(captions, jar, python) if j.split() != p.split()}
    assert differ == KNOWN, differ
    print(f"\nPTB step: the Python tokens equal the jar's on {len(captions) - len(differ)} of {len(captions)} captions")
    index = captions.index("x\ry")
    assert jar[index:index + 3] == ["x y", "p q", "softhyphen"]
    assert jar[captions.index("一 辆 红 色 的 汽 车 ， 停 在 路 边 。")].endswith("边 。")


def _xm3600_args(tmp_path, lang: str, rule: str | None = None) -> list[str]:
    data = write_xm3600(tmp_path / "xm3600")
    return ["--task", "xm3600", "--lang", lang, "--data", str(data["captions"]), "--backend", "mllm", "--model",
            "/m/none", "--output_dir", str(tmp_path / "out")] + (["--rule", rule] if rule else [])


def test_a_missing_java_or_segmenter_is_one_line(tmp_path, capsys, monkeypatch):
    """Before any work: no java on PATH for the default rule names the fix (or the Python PTB step); no SudachiPy
    for Japanese names what to install. Never a silent fallback."""
    import sys

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    jar_versions.cache_clear()
    try:
        code, err = _cli(_xm3600_args(tmp_path, "en"), capsys)
    finally:
        jar_versions.cache_clear()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "no java is on PATH: install a Java runtime" in err and "--rule cider-pyptb" in err
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "sudachipy", None)
    code, err = _cli(_xm3600_args(tmp_path, "ja", "cider-pyptb"), capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "needs sudachipy and sudachidict_core: pip install 'volta-ml[suite]'" in err
