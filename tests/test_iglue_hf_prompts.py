"""Snapshot of the IGLUE user turns: changing any of them changes results, so PROMPTS_VERSION must move with it."""
import pytest

from volta_ml.iglue_hf.data import Example
from volta_ml.iglue_hf.prompts import PROMPTS_VERSION, TEMPLATES, letter_choices, user_turn

EXAMPLE = Example("1", (), "Two dogs play.", "true", 1)
CANVAS = "The image shows two pictures side by side: the left picture and the right picture.\n"
MULTI = "The first image is the left picture and the second image is the right picture.\n"
LETTER_END = "Answer with the option's letter from the given choices directly."
SNAPSHOT = {
    ("xvnli", "letter", None):
        "Statement: Two dogs play.\nDoes the image show that the statement is true, false, or can it not be told?\n"
        "A. entailment (the image shows it is true)\nB. neutral (it cannot be told from the image)\n"
        "C. contradiction (the image shows it is false)\n" + LETTER_END,
    ("xvnli", "likelihood", None):
        "Statement: Two dogs play.\nIs the statement entailed by the image, contradicted by it, or neutral? "
        "Answer with one word: entailment, neutral or contradiction.",
    ("xgqa", "generate", None): "Two dogs play.\nAnswer the question using a single word or phrase.",
    ("xgqa", "closed", None): "Two dogs play.\nAnswer the question using a single word or phrase.",
    ("marvl", "letter", "canvas"):
        CANVAS + "Statement: Two dogs play.\nIs the statement true or false for the two pictures?\n"
        "A. true\nB. false\n" + LETTER_END,
    ("marvl", "letter", "multi"):
        MULTI + "Statement: Two dogs play.\nIs the statement true or false for the two pictures?\n"
        "A. true\nB. false\n" + LETTER_END,
    ("xvnli", "generate", None):
        "Statement: Two dogs play.\nDoes the image show that the statement is true, false, or can it not be told?\n"
        "A. entailment (the image shows it is true)\nB. neutral (it cannot be told from the image)\n"
        "C. contradiction (the image shows it is false)\n" + LETTER_END,
    ("marvl", "generate", "canvas"):
        CANVAS + "Statement: Two dogs play.\nIs the statement true or false for the two pictures?\n"
        "A. true\nB. false\n" + LETTER_END,
    ("marvl", "likelihood", "canvas"):
        CANVAS + "Statement: Two dogs play.\nIs the statement true or false for the two pictures? "
        "Answer with one word: true or false.",
    ("marvl", "likelihood", "multi"):
        MULTI + "Statement: Two dogs play.\nIs the statement true or false for the two pictures? "
        "Answer with one word: true or false.",
}


def test_prompt_snapshot():
    assert PROMPTS_VERSION == "iglue-hf-prompts-v2"
    assert {(t, r) for t, r, _ in SNAPSHOT} == set(TEMPLATES)
    for (task, rule, layout), text in SNAPSHOT.items():
        assert user_turn(task, rule, EXAMPLE, layout) == text, (task, rule, layout)


def test_letters_and_unknown_rule():
    assert letter_choices("xvnli") == ["A", "B", "C"] and letter_choices("marvl") == ["A", "B"]
    with pytest.raises(ValueError, match="no prompt for task 'xvnli' with rule 'closed'; known rules: generate, letter, "
                                         "likelihood"):
        user_turn("xvnli", "closed", EXAMPLE)


def test_blip_family_vqa_frame_for_xgqa():
    """BLIP-2 / InstructBLIP get the frame their papers used for VQA on xGQA; other tasks keep their turn."""
    assert user_turn("xgqa", "generate", EXAMPLE, vqa_frame="Question: {} Answer:") == "Question: Two dogs play. Answer:"
    assert user_turn("xgqa", "closed", EXAMPLE, vqa_frame="Question: {} Short answer:") == \
        "Question: Two dogs play. Short answer:"
    assert user_turn("xvnli", "letter", EXAMPLE, vqa_frame="Question: {} Answer:") == SNAPSHOT[("xvnli", "letter", None)]
