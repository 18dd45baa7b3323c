"""The readings of a text that the instruction rules (``projections.admission.instructions``)
scan: the text with the Unicode tricks that would hide an instruction from them undone (which
ones: that module's "Tricks the scan sees through"). Pure, and linear in the length of the
text."""

from __future__ import annotations

import unicodedata

_ENCODING = "utf-8"
_ERRORS = "surrogatepass"  # a str may hold lone surrogates (from JSON \ud800 escapes)

_INVISIBLE = (
    *(0x00AD, 0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFEFF, 0xFFA0),
    *range(0x180B, 0x1810),  # Mongolian variation selectors and vowel separator
    *range(0x200B, 0x2010),  # zero-width space, joiners, direction marks
    *range(0x202A, 0x202F),  # bidirectional embeddings and overrides
    *range(0x2060, 0x2070),  # word joiner, invisible operators, isolates
    *range(0xFE00, 0xFE10),  # variation selectors
    *range(0xE0100, 0xE01F0),  # variation selectors supplement
    *(0xE0001, 0xE007F),  # language tag, cancel tag
)
# Combining marks that NFKD splits off letters ("ì" -> "i" + U+0300).
_COMBINING = (
    *range(0x0300, 0x0370),
    *range(0x1AB0, 0x1B00),
    *range(0x1DC0, 0x1E00),
    *range(0x20D0, 0x2100),
    *range(0xFE20, 0xFE30),
)
# Letters that look like Latin ones, and the punctuation and separators NFKD leaves alone.
_LOOKALIKES = {
    **{
        f"CYRILLIC SMALL LETTER {name}": latin
        for name, latin in (
            ("A", "a"),
            ("VE", "b"),
            ("IE", "e"),
            ("O", "o"),
            ("ER", "p"),
            ("ES", "c"),
            ("U", "y"),
            ("HA", "x"),
            ("BYELORUSSIAN-UKRAINIAN I", "i"),
            ("JE", "j"),
            ("DZE", "s"),
            ("KOMI DE", "d"),
            ("SHHA", "h"),
            ("PALOCHKA", "l"),
            ("QA", "q"),
            ("WE", "w"),
        )
    },
    **{
        f"CYRILLIC CAPITAL LETTER {name}": latin
        for name, latin in (
            ("A", "A"),
            ("VE", "B"),
            ("IE", "E"),
            ("KA", "K"),
            ("EM", "M"),
            ("EN", "H"),
            ("O", "O"),
            ("ER", "P"),
            ("ES", "C"),
            ("TE", "T"),
            ("HA", "X"),
            ("BYELORUSSIAN-UKRAINIAN I", "I"),
            ("JE", "J"),
            ("DZE", "S"),
            ("STRAIGHT U", "Y"),
        )
    },
    **{
        f"GREEK SMALL LETTER {name}": latin
        for name, latin in (
            ("ALPHA", "a"),
            ("OMICRON", "o"),
            ("NU", "v"),
            ("RHO", "p"),
            ("IOTA", "i"),
            ("KAPPA", "k"),
            ("TAU", "t"),
            ("UPSILON", "u"),
        )
    },
    **{
        f"GREEK CAPITAL LETTER {name}": latin
        for name, latin in (
            ("ALPHA", "A"),
            ("BETA", "B"),
            ("EPSILON", "E"),
            ("ZETA", "Z"),
            ("ETA", "H"),
            ("IOTA", "I"),
            ("KAPPA", "K"),
            ("MU", "M"),
            ("NU", "N"),
            ("OMICRON", "O"),
            ("RHO", "P"),
            ("TAU", "T"),
            ("UPSILON", "Y"),
            ("CHI", "X"),
        )
    },
    "LATIN SMALL LETTER DOTLESS I": "i",
    "LATIN SMALL LETTER DOTLESS J": "j",
    "LATIN SMALL LETTER SCRIPT G": "g",
    "LATIN LETTER SMALL CAPITAL I": "I",
    "LATIN LETTER SMALL CAPITAL L": "L",
    **dict.fromkeys(
        (
            "LEFT SINGLE QUOTATION MARK",
            "RIGHT SINGLE QUOTATION MARK",
            "SINGLE LOW-9 QUOTATION MARK",
            "SINGLE HIGH-REVERSED-9 QUOTATION MARK",
            "PRIME",
        ),
        "'",
    ),
    **dict.fromkeys(
        (
            "LEFT DOUBLE QUOTATION MARK",
            "RIGHT DOUBLE QUOTATION MARK",
            "DOUBLE LOW-9 QUOTATION MARK",
            "DOUBLE HIGH-REVERSED-9 QUOTATION MARK",
            "DOUBLE PRIME",
        ),
        '"',
    ),
    **dict.fromkeys(
        (
            "HYPHEN",
            "NON-BREAKING HYPHEN",
            "FIGURE DASH",
            "EN DASH",
            "EM DASH",
            "HORIZONTAL BAR",
            "MINUS SIGN",
        ),
        "-",
    ),
    **dict.fromkeys(("LINE SEPARATOR", "PARAGRAPH SEPARATOR"), "\n"),
    **dict.fromkeys(("OGHAM SPACE MARK", "BRAILLE PATTERN BLANK"), " "),
}
_FOLD: dict[int, int | str | None] = {
    **{code: None for code in _COMBINING},
    **{ord(unicodedata.lookup(name)): latin for name, latin in _LOOKALIKES.items()},
    0x0085: "\n",  # next line (NEL)
    # tag characters mirror ASCII, invisibly: the text they hide is read as that ASCII
    **{code: chr(code - 0xE0000) for code in range(0xE0020, 0xE007F)},
}
_INVISIBLE_AS_NOTHING = {**_FOLD, **{code: None for code in _INVISIBLE}}
_INVISIBLE_AS_SPACE = {**_FOLD, **{code: " " for code in _INVISIBLE}}
_INVISIBLE_CHARACTERS = frozenset(map(chr, _INVISIBLE))


def readings(text: str) -> tuple[bytes, ...]:
    """The UTF-8 readings of the text that the rules scan: the text itself when it is ASCII;
    otherwise its Unicode tricks undone, with invisible characters read as nothing and, if it
    holds any, also as a space."""
    if text.isascii():
        return (text.encode(),)
    decomposed = unicodedata.normalize("NFKD", text)
    folded = [decomposed.translate(_INVISIBLE_AS_NOTHING)]
    if not _INVISIBLE_CHARACTERS.isdisjoint(decomposed):
        folded.append(decomposed.translate(_INVISIBLE_AS_SPACE))
    return tuple(reading.encode(_ENCODING, _ERRORS) for reading in folded)
