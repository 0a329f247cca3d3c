"""The user turns the suite's tasks are asked with (versioned: results depend on them; the exact text the model
saw for the first item, and the user turn of every item, are written with the results).

- MaXM: the short-answer VQA instruction with the answer language ("... in French."); a backend with a
  `vqa_frame` (the BLIP family) gets its paper's frame around the question instead.
- XM3600 / XM100: "Briefly describe the image in <language> in one sentence." (Centurio's captioning prompt).
- MTVQA: the question and "Answer the question using a word or phrase in the language of the question." (the
  lmms-eval task's instruction).
- xMMMU: MMMU's prompt: question, lettered options "A. ...", "Answer with the option letter from the given choices
  directly."; open questions "Answer the question using a single word or phrase.". `<image k>` placeholders stay
  in the text (the images come first, in the order of their placeholders).
- M3Exam: the official zero-shot prompt of the `en-instruct` method (the English hint for every language): "The
  following is a multiple choice question about <subject>. Please only give the correct option, without any other
  details or explanations.", background, question, options relabelled "A. ...", "Answer:".
- Kaleidoscope, generate: the paper's direct regime (its system message, then "Output your choice in the specified
  JSON format.", "Question:", "Options:", "ANSWER:"), the system message placed at the start of the user turn and
  the keywords in English for every language; letter rule: question, lettered options and the letter instruction.
- MMMB and any VLMEvalKit multiple-choice TSV: VLMEvalKit's `ImageMCQDataset.build_prompt`: "Hint: <hint>" (when
  the row has one), "Question: <question>", "Options:", "A. ..." per option, "Please select the correct answer
  from the options above. " (each line ending in a newline, that one after its trailing space), for every
  language; the same text for the letter rule. (VLMEvalKit's model wrappers may replace it with their own
  prompt: the dataset's is the one used here.)
The letter rule reads the letters after its task's lettered prompt (Kaleidoscope: the letter prompt, since the
direct prompt asks for JSON).
Changing any text here changes results: bump PROMPTS_VERSION.
"""
from __future__ import annotations

PROMPTS_VERSION = "suite-prompts-v1"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

LANGUAGE_NAMES = {
    "ar": "Arabic", "af": "Afrikaans", "bn": "Bengali", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "fa": "Persian", "fi": "Finnish", "fil": "Filipino", "fr": "French",
    "he": "Hebrew", "iw": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "mi": "Maori", "ne": "Nepali", "nl": "Dutch",
    "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "quz": "Quechua", "ro": "Romanian", "ru": "Russian",
    "sr": "Serbian", "sv": "Swedish", "sw": "Swahili", "te": "Telugu", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian",
    "vi": "Vietnamese", "zh": "Chinese",
}
MMMU_CHOICE = "Answer with the option letter from the given choices directly."
MMMU_OPEN = "Answer the question using a single word or phrase."
LETTER_INSTRUCTION = "Answer with the option's letter from the given choices directly."
M3EXAM_SUBJECTS = {"language": "Language", "math": "Math", "social-science": "Social Science",
                   "natural-science": "Natural Science"}
KALEIDOSCOPE_SYSTEM = ('You are a helpful assistant who answers multiple-choice questions. For each question, output '
                       'your final answer in JSON format with the following structure:\n\n{"choice": "The correct '
                       'option (e.g., A, B, C, or D)"}\n\nONLY output this format exactly. Do not include any '
                       'additional text or explanations outside the JSON structure.')


def lettered(options) -> str:
    return "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(options))


def maxm(item, kind, frame=None) -> str:
    if frame:
        return frame.format(item.question)
    return f"{item.question}\nAnswer the question using a single word or phrase in {LANGUAGE_NAMES[item.lang]}."


def caption(item, kind, frame=None) -> str:
    return f"Briefly describe the image in {LANGUAGE_NAMES[item.lang]} in one sentence."


def mtvqa(item, kind, frame=None) -> str:
    return f"{item.question}\nAnswer the question using a word or phrase in the language of the question."


def xmmmu(item, kind, frame=None) -> str:
    if not item.options:
        return f"{item.question}\n{MMMU_OPEN}"
    return f"{item.question}\n{lettered(item.options)}\n{MMMU_CHOICE}"


def m3exam(item, kind, frame=None) -> str:
    subject = M3EXAM_SUBJECTS.get(item.meta.get("subject_category") or "", "Language")
    hint = (f"The following is a multiple choice question about {subject}. Please only give the correct option, "
            "without any other details or explanations.")
    background = "\n" + item.meta["background"] if item.meta.get("background") else ""
    return f"{hint}\n\n{background}\n{item.question}\n{lettered(item.options)}\nAnswer:"


def kaleidoscope(item, kind, frame=None) -> str:
    if kind == "letter":
        return f"Question: {item.question}\nOptions:\n{lettered(item.options)}\n{LETTER_INSTRUCTION}"
    return (f"{KALEIDOSCOPE_SYSTEM}\n\nOutput your choice in the specified JSON format.\n\nQuestion: {item.question}\n"
            f"Options:\n{lettered(item.options)}\n\nANSWER:")


VLMEVALKIT_SELECT = "Please select the correct answer from the options above. \n"


def vlmevalkit_mcq(item, kind, frame=None) -> str:
    hint = item.meta.get("hint")
    options = "".join(f"{LETTERS[i]}. {option}\n" for i, option in enumerate(item.options))
    return ((f"Hint: {hint}\n" if hint is not None else "") + f"Question: {item.question}\n"
            + (f"Options:\n{options}{VLMEVALKIT_SELECT}" if item.options else ""))
