"""Which strings may be labels (tags, metadata keys, graph property keys): one rule for the server,
which refuses the others, and the clients and integrations, which avoid sending them."""

from __future__ import annotations

import re
import unicodedata

# Labels (tags, metadata keys) never hold control characters ("deploy\n" beside "deploy" is a second
# label no one meant), invisible characters (Unicode's format category: zero-width spaces, direction
# overrides, byte-order marks, tag characters) or line and paragraph separators: each makes a label
# that looks like another one, or hides text in it. Two are kept where text needs them: joiners
# between two non-ASCII characters (Persian and Indic words, emoji sequences), and tag characters in
# the run that follows a black flag (the flags of regions, such as Scotland's).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_INVISIBLE = frozenset(("Cf", "Zl", "Zp"))
_BLACK_FLAG = "\U0001f3f4"


def label_fault(text: str) -> str | None:
    """Why ``text`` cannot be a tag or a metadata key (its characters), or None when it can."""
    if _CONTROL_RE.search(text):
        return "must not contain control characters (e.g. a newline or a tab)"
    if not text.isascii():
        for i, ch in enumerate(text):
            if unicodedata.category(ch) in _INVISIBLE and not _kept(text, i):
                return f"must not contain invisible or line-separating characters (U+{ord(ch):04X})"
    return None


def blank(text: str) -> bool:
    """Whether ``text`` shows nothing: white space, and invisible characters (zero-width spaces,
    byte-order marks, line separators), alone (the server refuses such content)."""
    if text.isascii():
        return not text.strip()
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in text)


def _kept(text: str, i: int) -> bool:
    code = ord(text[i])
    if code in (0x200C, 0x200D):  # a joiner, between two characters it can join
        return 0 < i < len(text) - 1 and not text[i - 1].isascii() and not text[i + 1].isascii()
    if 0xE0020 <= code <= 0xE007F:  # a tag character, in a black flag's run
        j = i
        while j > 0 and 0xE0020 <= ord(text[j - 1]) <= 0xE007E:
            j -= 1
        return j > 0 and text[j - 1] == _BLACK_FLAG
    return False
