"""Hand-written word tables for the demo's synthetic multilingual task (en, de, fr, es).

Each language renders three sentence kinds about one object (a colour + shape):
- `exists`:   "There is a red circle."         (entailment if the object is drawn, else contradiction)
- `property`: "The red circle is made of wood." (neutral if drawn: the picture cannot tell; else contradiction)
- `caption`:  a noun phrase for the premise caption (`sentence1`, which XVNLI models never read).

`to_english` holds the "machine translation" back to English used for translate-test: fixed templates
that, like real MT output, sometimes phrase things differently from the English training text.
"""
from __future__ import annotations

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")
PROPERTIES = ("wood", "heavy", "anna")  # neutral claims: nothing in a drawing can confirm or refute them
LANGUAGES = ("en", "de", "fr", "es")

# RGB fill of each colour name (the vision side of the task)
RGB = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (40, 70, 220), "yellow": (235, 200, 20)}

_COLOUR_WORDS = {
    "de": {"red": "rot", "green": "grün", "blue": "blau", "yellow": "gelb"},
    "fr": {"red": "rouge", "green": "vert", "blue": "bleu", "yellow": "jaune"},
    "es": {"red": "rojo", "green": "verde", "blue": "azul", "yellow": "amarillo"},
}
# German nouns with their grammatical gender (drives adjective endings); French and Spanish nouns are
# all masculine here and take the adjective after the noun.
_DE_NOUNS = {"circle": ("Kreis", "m"), "square": ("Quadrat", "n"), "triangle": ("Dreieck", "n")}
_FR_NOUNS = {"circle": "cercle", "square": "carré", "triangle": "triangle"}
_ES_NOUNS = {"circle": "círculo", "square": "cuadrado", "triangle": "triángulo"}

_PROPERTY_PHRASES = {
    "en": {"wood": "is made of wood", "heavy": "is heavy", "anna": "belongs to Anna"},
    "de": {"wood": "ist aus Holz", "heavy": "ist schwer", "anna": "gehört Anna"},
    "fr": {"wood": "est en bois", "heavy": "est lourd", "anna": "appartient à Anna"},
    "es": {"wood": "es de madera", "heavy": "es pesado", "anna": "pertenece a Anna"},
}
# What a translation system returns for each language's property phrase (not always the training wording)
_MT_PROPERTY = {
    "de": {"wood": "is made of wood", "heavy": "is heavy", "anna": "belongs to Anna"},
    "fr": {"wood": "is wooden", "heavy": "is heavy", "anna": "belongs to Anna"},
    "es": {"wood": "is made of wood", "heavy": "is heavy", "anna": "belongs to Anna"},
}
_MT_EXISTS = {"de": "There is a {c} {s}.", "fr": "There is a {c} {s}.", "es": "There's a {c} {s}."}


def _de_adjective(colour: str, ending: str) -> str:
    return _COLOUR_WORDS["de"][colour] + ending


def exists_sentence(lang: str, colour: str, shape: str) -> str:
    if lang == "en":
        return f"There is a {colour} {shape}."
    if lang == "de":
        noun, gender = _DE_NOUNS[shape]
        article, ending = ("einen", "en") if gender == "m" else ("ein", "es")  # accusative after "es gibt"
        return f"Es gibt {article} {_de_adjective(colour, ending)} {noun}."
    if lang == "fr":
        return f"Il y a un {_FR_NOUNS[shape]} {_COLOUR_WORDS['fr'][colour]}."
    if lang == "es":
        return f"Hay un {_ES_NOUNS[shape]} {_COLOUR_WORDS['es'][colour]}."
    raise KeyError(f"no word table for language {lang!r}; known: {', '.join(LANGUAGES)}")


def property_sentence(lang: str, colour: str, shape: str, prop: str) -> str:
    phrase = _PROPERTY_PHRASES[lang][prop]
    if lang == "en":
        return f"The {colour} {shape} {phrase}."
    if lang == "de":
        noun, gender = _DE_NOUNS[shape]
        article = "Der" if gender == "m" else "Das"
        return f"{article} {_de_adjective(colour, 'e')} {noun} {phrase}."
    if lang == "fr":
        return f"Le {_FR_NOUNS[shape]} {_COLOUR_WORDS['fr'][colour]} {phrase}."
    if lang == "es":
        return f"El {_ES_NOUNS[shape]} {_COLOUR_WORDS['es'][colour]} {phrase}."
    raise KeyError(f"no word table for language {lang!r}; known: {', '.join(LANGUAGES)}")


def object_phrase(lang: str, colour: str, shape: str) -> str:
    """Nominative indefinite noun phrase, for captions."""
    if lang == "en":
        return f"a {colour} {shape}"
    if lang == "de":
        noun, gender = _DE_NOUNS[shape]
        return f"{'ein'} {_de_adjective(colour, 'er' if gender == 'm' else 'es')} {noun}"
    if lang == "fr":
        return f"un {_FR_NOUNS[shape]} {_COLOUR_WORDS['fr'][colour]}"
    return f"un {_ES_NOUNS[shape]} {_COLOUR_WORDS['es'][colour]}"


def caption(lang: str, objects: list[tuple[str, str]]) -> str:
    phrases = [object_phrase(lang, c, s) for c, s in objects]
    text = ", ".join(phrases)
    return text[0].upper() + text[1:] + "."


def translate_exists(lang: str, colour: str, shape: str) -> str:
    """The English 'machine translation' of `exists_sentence(lang, ...)`."""
    return _MT_EXISTS[lang].format(c=colour, s=shape)


def translate_property(lang: str, colour: str, shape: str, prop: str) -> str:
    return f"The {colour} {shape} {_MT_PROPERTY[lang][prop]}."
