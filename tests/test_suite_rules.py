"""The suite's scoring rules, each against a plain computation written out here: hand-worked answers for the
normalisations and parsers (the cases where the harnesses disagree side by side), and CIDEr against the
pycocoevalcap scorer called directly on hand-tokenised text."""
from __future__ import annotations

import re
from contextlib import nullcontext

import numpy as np
import pytest

from helpers_suite import needs_java
from volta_ml.suite import rules
from volta_ml.suite.data import Item
from volta_ml.suite.text import normalise_answer, prepare


def maxm_item(answers, processed, lang="en"):
    return Item(id="q", lang=lang, question="?", references=tuple(answers), meta={"processed_answers": processed})


@pytest.mark.parametrize("answer,answers,processed,lang,exact,relaxed,mblip,pangea_exact,pangea_relaxed", [
    # an answer needing the normalisation: case, final period, article
    ("The Red Car.", ["Red car"], ["red car"], "en", 1, 1, 0, 0, 0),
    # number word vs digit (English only), and the processed form being the only exact form
    ("Two", ["two doors"], ["2"], "en", 1, 1, 0, 0, 0),
    # relaxed: gold at the start / end of a longer answer
    ("red car parked outside", ["red car"], ["red car"], "en", 0, 1, 0, 0, 1),
    # PangeaBench never lower-cases the gold answers: "Paris" cannot match its cleaned (lower-cased) prediction
    ("Paris", ["Paris"], ["paris"], "en", 1, 1, 1, 1, 0),
    # ... and maps true / false gold answers to yes / no
    ("yes, it is", ["True"], ["true"], "en", 0, 0, 0, 0, 1),
    # Chinese: full-width punctuation, no articles or number words
    ("红色。", ["红色"], ["红色"], "zh", 1, 1, 0, 0, 1),
    # full-width Latin letters (NFKC) and several references
    ("ＲＥＤ", ["crimson", "Red"], ["crimson", "red"], "en", 1, 1, 0, 0, 0),
    # an empty answer is never right, even against an empty processed form
    ("", ["a"], ["a"], "en", 0, 0, 0, 0, 0),
])
def test_maxm_rules(answer, answers, processed, lang, exact, relaxed, mblip, pangea_exact, pangea_relaxed):
    item = maxm_item(answers, processed, lang)
    got = [rules.maxm_exact(answer, item).score, rules.maxm_relaxed(answer, item).score,
           rules.maxm_mblip(answer, item).score, rules.maxm_pangea_exact(answer, item).score,
           rules.maxm_pangea_relaxed(answer, item).score]
    assert got == [exact, relaxed, mblip, pangea_exact, pangea_relaxed]


def test_answer_normalisation_is_idempotent_and_language_aware():
    assert normalise_answer("The  Two dogs!", "en") == "2 dogs"
    assert normalise_answer("The  Two dogs!", "fr") == "the two dogs"
    assert normalise_answer(normalise_answer("«Le chat», 3.5", "fr"), "fr") == normalise_answer("«Le chat», 3.5", "fr")
    assert normalise_answer("北京，中国。", "zh") == "北京 中国"


def test_vqa_clean_as_the_vqa_evaluation_writes_it():
    assert rules.vqa_clean("The two red cars!") == "2 red cars"
    assert rules.vqa_clean("1,000 people") == "1000 people"          # a digit comma: every listed mark removed
    assert rules.vqa_clean("left/right") == "left right"               # no space beside it: a space instead
    assert rules.vqa_clean("3.5 m. long") == "3.5 m long"              # a period before a digit stays


@pytest.mark.parametrize("answer,gold,official,lmms", [
    ("3.5ドルです", "3.5ドル", 0, 1),       # the official script strips periods from the prediction only
    ("株式会社ABCの看板", "株式会社abc", 1, 1),
    ("Ausgang.", "Ausgang", 1, 1),
    ("Eingang", "Ausgang", 0, 0),
])
def test_mtvqa_containment(answer, gold, official, lmms):
    item = Item(id="q", lang="ja", references=(gold,))
    assert rules.mtvqa_official(answer, item).score == official
    assert rules.mtvqa_lmms_eval(answer, item).score == lmms


OPTIONS = ("Monet", "Van Gogh", "Picasso", "Dali", "Manet")


@pytest.mark.parametrize("response,expected", [
    ("(B)", "B"), ("B", "B"), ("The answer is C.", "C"), ("E. Manet", "E"),
    ("B and D are wrong, A", "A"),                            # several letters: the one found last
    ("I believe the painting is by Picasso without any doubt", "C"),   # > 5 words: the option text
    ("A cat", "A"),                                           # MMMU's letter-then-space rule, taken literally
    ("no idea", None), ("", None),                            # MMMU would draw a random letter here
])
def test_mmmu_choice_parser(response, expected):
    got = rules.parse_mmmu_choice(response, OPTIONS)
    assert (None if got is None else "ABCDE"[got]) == expected


@pytest.mark.parametrize("response,gold,correct", [
    ("The speed is 24 m/s", "24", True), ("24.0", "24", True), ("It is 1,200 metres.", "1200", True),
    ("twenty four", "24", False), ("the answer is blue", "blue", True), ("a", "b", False),
])
def test_mmmu_open_answers(response, gold, correct):
    assert rules.mmmu_open_correct(gold, rules.parse_mmmu_open(response)) == correct


def test_mmmu_unparsed_choice_is_wrong_and_its_random_draw_is_only_an_expectation():
    item = Item(id="q", lang="en", options=OPTIONS, answer=1)
    judged = rules.mmmu_generate("no idea", item)
    assert (judged.score, judged.parsed, judged.chance) == (0.0, False, 1 / 5)
    judged = rules.mmmu_generate("(B)", item)
    assert (judged.score, judged.parsed, judged.chance) == (1.0, True, 1.0)


@pytest.mark.parametrize("response,official,illformat,pangea", [
    ("B", "B", False, "B"),
    ("(C) three", "C", True, "C"),
    ("Answer: B", "A", True, "A"),          # M3Exam's eval reads the first character; PangeaBench the first A-D
    ("Based on the image", "B", True, "D"),    # PangeaBench: "d " matches its case-insensitive letter pattern
    ("E", "E", False, None),                # a fifth option: PangeaBench's parser knows A-D only
    ("", None, False, None),
])
def test_m3exam_extractions(response, official, illformat, pangea):
    item = Item(id="q", lang="th", options=("หนึ่ง", "สอง", "สาม", "สี่", "ห้า"), answer=2)
    judged = rules.m3exam_official(response, item)
    assert (judged.prediction if judged.parsed else None) == official
    assert ("illformat" in judged.flags) == illformat
    assert judged.score == float(official == "C")
    got = rules.parse_pangea_m3exam(response, item.options)
    assert (None if got is None else "ABCDE"[got]) == pangea


@pytest.mark.parametrize("response,n,default,reference", [
    ('{"choice": "B"}', 4, "B", "B"),
    ('{"choice": "E"}', 5, "E", None),                 # the reference reads A-D only
    ('{\n  "choice": "C",\n  "reasoning": "..."\n}', 4, "C", None),    # its regex is line-bound
    ('```json\n{"choice": "D"}\n```', 4, "D", "D"),
    ('{"choice": "B. тертя"}', 5, "B", "B"),
    ('{"choice": "Б"}', 4, "B", "B"),                  # a letter in the question's script
    ("b", 4, "B", None),                               # the reference does not upper-case a bare letter
    ("The answer is B", 4, None, None),
])
def test_kaleidoscope_extractions(response, n, default, reference):
    got = rules.parse_kaleidoscope(response, n)
    assert (None if got is None else "ABCDE"[got]) == default
    got = rules.parse_kaleidoscope_reference(response)
    assert (None if got is None else "ABCD"[got]) == reference


def test_kaleidoscope_reference_counts_any_of_a_to_d_as_an_answer():
    item = Item(id="q", lang="uk", options=("x", "y"), answer=1)
    assert rules.kaleidoscope_reference('{"choice": "D"}', item) == rules.Judged(0.0, True, "D", 0.0)
    assert rules.kaleidoscope_generate('{"choice": "D"}', item) == rules.Judged(0.0, False, "", 0.5)
    assert rules.kaleidoscope_reference("B", item) == rules.Judged(1.0, True, "B", 1.0)


def test_letter_rule_reads_only_the_question_s_own_letters():
    items = [Item(id="a", lang="en", options=("x", "y"), answer=1), Item(id="b", lang="en", options=OPTIONS, answer=4)]
    scores = np.array([[0.1, 0.5, -np.inf, -np.inf, -np.inf], [0.0, 0.2, 0.1, 0.3, 0.9]], dtype=np.float32)
    judged = rules.LETTER_RULE.judge({"scores": scores, "answers": np.array(["", ""])}, items, {})
    assert [(j.prediction, j.score) for j in judged] == [("B", 1.0), ("E", 1.0)]


def test_word_segmentation_is_spacy_s():
    """zh: spaCy's char segmenter (every character a word, Latin letters and digits too, whitespace left out);
    ja: SudachiPy in split mode A (spaCy's default: compounds split) with its core dictionary, surface forms;
    th: PyThaiNLP's word_tokenize as spaCy calls it, its words (whitespace ones too) joined by spaces; then NFC."""
    from pythainlp.tokenize import word_tokenize

    sudachipy = pytest.importorskip("sudachipy", reason="Japanese segmentation needs sudachipy (the test extra)")
    assert prepare("一辆红色的T恤, 2个人\u3000在公园。", "zh") == "一 辆 红 色 的 T 恤 , 2 个 人 在 公 园 。"
    assert prepare("一辆红色的汽车。", "zh", segment=False) == "一辆红色的汽车。"
    japanese = "国家公務員の男性が選挙管理委員会の前に立っている。 Ｔシャツ…"
    with pytest.warns(DeprecationWarning) if hasattr(sudachipy.Dictionary, "tokenizer") else nullcontext():
        morphemes = sudachipy.Dictionary().create(mode=sudachipy.SplitMode.A).tokenize(japanese)   # spaCy's call
    plain = [m.surface() for m in morphemes if m.surface().strip()]
    assert prepare(japanese, "ja").split(" ") == plain
    assert plain[:4] == ["国家", "公務", "員", "の"] and "選挙" in plain and "委員会" not in plain
    thai = "รถยนต์สีแดง  จอดอยู่หน้าบ้าน 2 คัน"
    assert prepare(thai, "th") == " ".join(word_tokenize(thai)) == "รถยนต์ สีแดง    จอด อยู่ หน้าบ้าน   2   คัน"
    decomposed = "cafe\u0301"
    assert prepare(decomposed, "en") == "caf\u00e9" and prepare("ท\u0e35\u0e48", "th") == "ท\u0e35\u0e48"


CIDER_CASES = {   # language -> references, answers, and the same tokenised by hand as the jar tokenises them
    "en": ([["A red car parked in front of a house.", "a small red car on the street"],
            ["Two dogs (a puppy) are playing on the grass.", "Dogs running in a park."], ["A plate of rice."]],
           ["A red car in front of the house.", "two dogs playing", ""],
           [["a red car parked in front of a house", "a small red car on the street"],
            ["two dogs -lrb- a puppy -rrb- are playing on the grass", "dogs running in a park"], ["a plate of rice"]],
           ["a red car in front of the house", "two dogs playing", ""]),
    "zh": ([["一辆红色的汽车。", "红色小汽车"], ["两只狗在玩。"]], ["红色的汽车", "狗在玩耍"],
           [["一 辆 红 色 的 汽 车 。", "红 色 小 汽 车"], ["两 只 狗 在 玩 。"]], ["红 色 的 汽 车", "狗 在 玩 耍"]),
    "th": ([["รถยนต์สีแดงจอดอยู่หน้าบ้าน"], ["รถสีแดงคันเล็กบนถนน"]], ["รถยนต์สีแดง", "รถคันเล็ก"],
           [["รถยนต์ สีแดง จอด อยู่ หน้าบ้าน"], ["รถ สีแดง คัน เล็ก บน ถนน"]], ["รถยนต์ สีแดง", "รถ คัน เล็ก"]),
    "ja": ([["家の前に赤い車が止まっている。"], ["通りの小さな赤い車"]], ["赤い車が家の前にある。", "小さな赤い車"],
           [["家 の 前 に 赤い 車 が 止まっ て いる 。"], ["通り の 小さな 赤い 車"]],
           ["赤い 車 が 家 の 前 に ある 。", "小さな 赤い 車"]),
}


@pytest.mark.parametrize("rule", [pytest.param("cider", marks=needs_java), "cider-pyptb"])
def test_cider_equals_the_scorer_on_hand_tokenised_text(rule):
    """pycocoevalcap's Cider called directly on captions tokenised by hand (Chinese characters, Japanese and Thai
    words, the jar's "。" and -lrb- tokens) gives the rule's per-item and corpus scores."""
    from pycocoevalcap.cider.cider import Cider

    pytest.importorskip("sudachipy", reason="Japanese segmentation needs sudachipy (the test extra)")
    items, answers, hand_refs, hand_answers = [], [], [], []
    for lang, (references, answer, refs_by_hand, answer_by_hand) in CIDER_CASES.items():
        items += [Item(id=f"{lang}{i}", lang=lang, references=tuple(r)) for i, r in enumerate(references)]
        answers, hand_refs, hand_answers = answers + answer, hand_refs + refs_by_hand, hand_answers + answer_by_hand
    judged = rules.CIDER_RULES[rule].judge({"answers": np.array(answers)}, items, {})
    corpus, per_item = Cider().compute_score({i: r for i, r in enumerate(hand_refs)},
                                             {i: [a] for i, a in enumerate(hand_answers)})
    assert [j.prediction for j in judged] == hand_answers
    assert [j.score for j in judged] == pytest.approx(list(per_item))
    assert np.mean([j.score for j in judged]) == pytest.approx(corpus) and corpus > 0


@needs_java
def test_cider_without_segmentation_sees_one_word_per_chinese_sentence():
    """PangeaBench's xm100 joins its segmented words back without spaces: a Chinese caption is one token (with
    the jar's 。 token)."""
    items = [Item(id="0", lang="zh", references=("一辆红色的汽车。",)), Item(id="1", lang="zh", references=("两只狗。",))]
    arrays = {"answers": np.array(["红色的汽车", "两只狗"])}
    segmented = rules.CIDER_RULES["cider"].judge(arrays, items, {})
    whole = rules.CIDER_RULES["cider-nosegment"].judge(arrays, items, {})
    assert segmented[0].score > 0 and whole[0].score == 0 and whole[1].score > 0
    assert [j.prediction for j in whole] == ["红色的汽车", "两只狗"]


# --- VLMEvalKit's exact matching (MMMB, vlmevalkit_mcq) -------------------------------------------------------
def plain_can_infer(reply: str, options: dict) -> str | bool:
    """VLMEvalKit's can_infer spelled out step by step (option letter, then option text), one reply at a time."""
    if "Failed to obtain answer via API" in reply:
        option = False
    elif any(p in reply for p in ["Sorry, I can't help with images of people yet.", "I can't process this file.",
                                  "I'm sorry, but without the image provided", "Cannot determine the answer"]):
        option = "Z"
    else:
        spaced = reply
        for ch in ".()[],:;!*#{}":
            spaced = spaced.replace(ch, " ")
        words = spaced.split()
        option = False
        found = [letter for letter in options if letter in words]
        if len(found) == 1 and words.index(found[0]) >= len(words) - 4:
            option = found[0]
        elif len(found) == 0 and "Z" in words:
            option = "Z"
        if not option:
            m = re.search(r"answer\s+is\s+\**([ABCDabcd])\**", reply, flags=re.IGNORECASE)
            if m and m.group(1).upper() in options:
                option = m.group(1).upper()
    if option:
        return option
    lowered = reply.lower()
    total = 0
    for text in options.values():
        total += len(text)
    if len(lowered) > 2 * total:
        return False
    hits = []
    for letter, text in options.items():
        if text.lower() in lowered:
            hits.append(letter)
    return hits[0] if len(hits) == 1 else False


FOUR = {"A": "a red car", "B": "two dogs", "C": "a plate of rice", "D": "a bicycle"}
VLMEVALKIT_REPLIES = [
    ("B", FOUR, "B"),
    ("(C)", FOUR, "C"),
    ("The answer is B.", FOUR, "B"),                                # one letter among the last four tokens
    ("I think A or B", FOUR, False),                                # two letters, no "answer is": nothing
    ("B is right, not C", FOUR, False),                             # two letters
    ("Option B is what the image shows in my view", FOUR, False),   # one letter, but not among the last four tokens
    ("Option B is what the image shows. The answer is B", FOUR, "B"),   # ... "answer is" rescues it
    ("After long thought the correct answer is **c** here", FOUR, "C"),  # "answer is", any case, bold
    ("answer is E", FOUR, False),                                   # "answer is" only reads A-D
    ("two dogs", FOUR, "B"),                                        # option text in a short reply
    ("I see two dogs playing near a bicycle", FOUR, False),         # two options' texts
    ("It shows " + "very " * 40 + "two dogs", FOUR, False),         # a long reply: text not read
    ("Sorry, I can't help with images of people yet.", FOUR, "Z"),  # declined
    ("Z", FOUR, "Z"),
    ("Failed to obtain answer via API. two dogs", FOUR, "B"),       # the API marker skips the letter step only
    ("a", FOUR, False),                                             # lower case is no letter; "a" in two options
    ("A", {"A": "yes", "B": "no"}, "A"),
    ("C", {"A": "yes", "B": "no"}, False),                          # C is no option of this question
    ("KÖPEK İKİ", {"A": "köpek i̇ki̇", "B": "kedi"}, "A"),            # Turkish İ lower-cases to i + a dot
    ("İİİ", {"A": "i̇", "B": "x"}, "A"),
    ("İİİİ", {"A": "i̇", "B": "x"}, False),                          # 4 characters, 8 lower-cased: too long
    ("两只", {"A": "一只", "B": "两只", "C": "三只"}, "B"),
    ("答案是 B", {"A": "一只", "B": "两只", "C": "三只"}, "B"),
    ("A. a red car", FOUR, "A"),
]


@pytest.mark.parametrize("reply,options,expected", VLMEVALKIT_REPLIES)
def test_vlmevalkit_matching_equals_the_plain_rule(reply, options, expected):
    from volta_ml.suite.rules import vlmevalkit_infer

    assert plain_can_infer(reply, options) == expected
    got = vlmevalkit_infer(reply, tuple(options.values()))
    assert (got or False) == expected
    item = Item(id="q", lang="en", question="?", options=tuple(options.values()), answer=0)
    judged = rules.vlmevalkit_generate(reply, item)
    assert judged.parsed == (expected not in (False, "Z")) and judged.score == float(expected == "A")
    # VLMEvalKit's random last resort (after a judge) draws among the letters and Z; a decline never gets there
    assert judged.chance == {False: 1 / (len(options) + 1), "Z": 0.0}.get(expected, judged.score)


def test_vlmevalkit_prompt_snapshot():
    """ImageMCQDataset.build_prompt: hint line only when the row has one, options lettered, the closing line with
    its trailing space; the letter rule sees the same text."""
    from volta_ml.suite.prompts import vlmevalkit_mcq

    item = Item(id="1", lang="tr", question="Kaç köpek var?", options=("1", "2", "3"), answer=1,
                meta={"hint": "Hayvanları say."})
    expected = ("Hint: Hayvanları say.\nQuestion: Kaç köpek var?\nOptions:\nA. 1\nB. 2\nC. 3\n"
                "Please select the correct answer from the options above. \n")
    assert vlmevalkit_mcq(item, "generate") == expected == vlmevalkit_mcq(item, "letter")
    bare = Item(id="2", lang="en", question="What is shown?", options=("a cat", "a dog"), answer=0,
                meta={"hint": None})
    assert vlmevalkit_mcq(bare, "generate") == ("Question: What is shown?\nOptions:\nA. a cat\nB. a dog\n"
                                                "Please select the correct answer from the options above. \n")
