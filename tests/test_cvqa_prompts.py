"""The four prompt conditions (snapshot) and truncation that keeps the option."""
from __future__ import annotations

import pytest
from helpers_cvqa import tiny_tokenizer, write_release

from volta_ml.cvqa.data import load_cvqa
from volta_ml.engine.failures import UsageError
from volta_ml.cvqa.prompts import (CONDITIONS, PROMPTS_VERSION, encode_option_texts, full_texts,
                                         option_texts)

# Changing any of these strings changes published numbers: bump PROMPTS_VERSION with it.
SNAPSHOT = {
    "en-aware": [
        "Location: Mexico. Question: Which flower is used? Options: marigold Short Answer:",
        "Location: Mexico. Question: Which flower is used? Options: rose Short Answer:",
        "Location: Mexico. Question: Which flower is used? Options: tulip Short Answer:",
        "Location: Mexico. Question: Which flower is used? Options: lily Short Answer:",
    ],
    "en-agnostic": [
        "Question: Which flower is used? Options: marigold Short Answer:",
        "Question: Which flower is used? Options: rose Short Answer:",
        "Question: Which flower is used? Options: tulip Short Answer:",
        "Question: Which flower is used? Options: lily Short Answer:",
    ],
    "loc-aware": [
        "Location: Mexico. Question: ¿Qué flor se usa? Options: cempasúchil Short Answer:",
        "Location: Mexico. Question: ¿Qué flor se usa? Options: rosa Short Answer:",
        "Location: Mexico. Question: ¿Qué flor se usa? Options: tulipán Short Answer:",
        "Location: Mexico. Question: ¿Qué flor se usa? Options: lirio Short Answer:",
    ],
    "loc-agnostic": [
        "Question: ¿Qué flor se usa? Options: cempasúchil Short Answer:",
        "Question: ¿Qué flor se usa? Options: rosa Short Answer:",
        "Question: ¿Qué flor se usa? Options: tulipán Short Answer:",
        "Question: ¿Qué flor se usa? Options: lirio Short Answer:",
    ],
}


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    return load_cvqa(write_release(tmp_path_factory.mktemp("cvqa"), "latest")).questions


def test_four_conditions_snapshot(questions):
    assert PROMPTS_VERSION == "cvqa-prompts-v1"
    assert {c: full_texts(questions[6], c) for c in CONDITIONS} == SNAPSHOT


def test_plain_template_is_question_plus_option(questions):
    assert full_texts(questions[0], "en-agnostic", "plain")[2] == "Which dish is this? vada"
    assert full_texts(questions[3], "loc-aware", "plain")[0] == "Location: Egypt. ما اسم هذا الطبق؟ كشري"
    with pytest.raises(ValueError, match="unknown CVQA condition 'fr-aware'"):
        full_texts(questions[0], "fr-aware")


def test_truncation_shortens_the_question_and_keeps_the_option(questions, tmp_path):
    tok = tiny_tokenizer(tmp_path / "tok")
    pieces = option_texts(questions[3], "en-aware")    # "Location: Egypt. Question: What is the name of ..."
    option_ids = [tok(tail, add_special_tokens=False)["input_ids"] for _, tail in pieces]
    full_len = len(tok(" ".join(pieces[0]))["input_ids"])
    max_len = 14
    assert full_len > max_len
    enc = encode_option_texts(tok, pieces, max_len)
    for i in range(4):
        row = enc.ids[i, :enc.lengths[i]].tolist()
        assert enc.lengths[i] == max_len and row[0] == tok.cls_token_id and row[-1] == tok.sep_token_id
        assert row[-1 - len(option_ids[i]):-1] == option_ids[i]       # the whole option frame survives
        head = tok(pieces[i][0], add_special_tokens=False)["input_ids"]
        assert row[1:-1 - len(option_ids[i])] == head[:max_len - 2 - len(option_ids[i])]   # question cut at its end
    assert enc.head_cut.all() and not enc.option_cut.any()
    assert tok.decode(enc.ids[2, :enc.lengths[2]], skip_special_tokens=True).endswith(
        "options : molokhia short answer :")
    # Long enough: nothing is cut and the text equals plain tokenisation of the full string.
    roomy = encode_option_texts(tok, pieces, 64)
    assert not roomy.head_cut.any()
    assert roomy.ids[0, :roomy.lengths[0]].tolist() == tok(" ".join(pieces[0]))["input_ids"]
    # An option longer than the budget is itself cut (flagged), never silently.
    tiny = encode_option_texts(tok, pieces, 5)
    assert tiny.option_cut.all() and (tiny.lengths == 5).all()
    # No room at all is the user's flag, a one-line usage error (not a bug's traceback).
    with pytest.raises(UsageError, match="--max_seq_length 2 leaves no room"):
        encode_option_texts(tok, pieces, 2)


def test_unknown_tokens_are_counted(questions, tmp_path):
    tok = tiny_tokenizer(tmp_path / "tok")
    loc = encode_option_texts(tok, option_texts(questions[0], "loc-agnostic"), 40)
    en = encode_option_texts(tok, option_texts(questions[0], "en-agnostic"), 40)
    assert (loc.unk > 0).all() and (en.unk == 0).all()


def test_sentencepiece_tokenizer_gets_its_own_special_tokens(questions, tmp_path):
    from helpers_tasks import xlmr_dir
    from transformers import AutoTokenizer

    texts = [t for q in questions for c in CONDITIONS for t in full_texts(q, c)]
    tok = AutoTokenizer.from_pretrained(str(xlmr_dir(tmp_path, texts, vocab_size=300)), local_files_only=True)
    pieces = option_texts(questions[1], "loc-aware")
    tail = tok(pieces[3][1], add_special_tokens=False)["input_ids"]
    head = tok(pieces[3][0], add_special_tokens=False)["input_ids"]
    enc = encode_option_texts(tok, pieces, len(tail) + 5)
    row = enc.ids[3, :enc.lengths[3]].tolist()
    assert row == [tok.bos_token_id] + head[:3] + tail + [tok.eos_token_id] and row[0] == 0 and row[-1] == 2
    assert enc.head_cut[3] and not enc.option_cut[3]
    roomy = encode_option_texts(tok, pieces, 80)
    assert roomy.ids[0, :roomy.lengths[0]].tolist() == tok(" ".join(pieces[0]))["input_ids"]
    assert (roomy.ids[0, roomy.lengths[0]:] == tok.pad_token_id).all()
