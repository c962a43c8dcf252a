"""Splitting PTX text into tokens that remember their line, for `ptx.parser`.

Comments are dropped here; `.loc`/`.file` (which end at the line's end, not at `;`) are the
parser's business, which is why every token carries its line.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass


class PtxParseError(ValueError):
    """PTX text the parser cannot read; names the 1-based line and shows its text."""

    def __init__(self, line: int, message: str, text: str = "") -> None:
        self.line = line
        self.message = message
        self.text = text.strip()
        shown = f"\n    {self.text}" if self.text else ""
        super().__init__(f"PTX line {line}: {message}{shown}")


@dataclass(frozen=True)
class Token:
    kind: str  # "str", "hexf" (0f/0d), "num", "dir" (.name), "name", "punct"
    text: str
    line: int
    start: int  # offset in the comment-free text
    end: int


_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)

# Order matters: `0f3F800000` is a float before it is the number 0 and the name f3F800000,
# and a decimal float before an integer.
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<hexf>0[fF][0-9a-fA-F]{8}(?![\w$])|0[dD][0-9a-fA-F]{16}(?![\w$]))
  | (?P<num>0[xX][0-9a-fA-F]+U?|0[bB][01]+U?
        |\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?)
  | (?P<dir>\.[A-Za-z_][\w$]*(?:::[\w$]+)*)
  | (?P<name>[%$A-Za-z_][\w$]*(?:\.[\w$]+(?:::[\w$]+)*)*)
  | (?P<punct>[{}()\[\],;:@!+\-<>=|*/&^~])
    """,
    re.X,
)


def strip_comments(text: str) -> str:
    """`text` with comments replaced by spaces (newlines kept, so offsets and lines hold)."""

    def blank(m: re.Match[str]) -> str:
        s = m.group(0)
        if s.startswith('"'):
            return s
        return "".join(c if c == "\n" else " " for c in s)

    return _COMMENT.sub(blank, text)


class Source:
    """The comment-free text with line lookup, for tokens and error messages."""

    def __init__(self, text: str) -> None:
        self.raw_lines = text.splitlines()
        self.text = strip_comments(text)
        self._newlines = [i for i, c in enumerate(self.text) if c == "\n"]

    def line_of(self, offset: int) -> int:
        return bisect_right(self._newlines, offset - 1) + 1

    def line_text(self, line: int) -> str:
        return self.raw_lines[line - 1] if 0 < line <= len(self.raw_lines) else ""

    def error(self, line: int, message: str) -> PtxParseError:
        return PtxParseError(line, message, self.line_text(line))

    def span(self, start: int, end: int) -> str:
        """The text between two offsets, whitespace collapsed (an instruction's `text`)."""
        return " ".join(self.text[start:end].split())


def tokenize(src: Source) -> list[Token]:
    out: list[Token] = []
    text = src.text
    pos, n = 0, len(text)
    line = 1
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            line = src.line_of(pos)
            raise src.error(line, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        assert kind is not None
        if kind == "ws":
            line += text.count("\n", pos, m.end())
        else:
            out.append(Token(kind, m.group(0), line, pos, m.end()))
        pos = m.end()
    return out
