"""Readings of a text as the clients a step runs may read it: echo.py's forms are whole-value
spellings, but a server may echo a real value with only some of its characters encoded
(`%67hp_…`, `&#103;hp_…`), in another spelling of a reference (`&#00103;`, `&#X67;`,
`&lowbar;`), folded across header lines, or in an encoding no form lists. Looking for the real
value in each reading fails closed on any such spelling: echo.Echoes withholds what holds it
(it cannot be rewritten in the spelling it came in).

- `of(data)`: the readings of `data` that differ from it: percent-decoded (any case, partial),
  HTML-unescaped (`html.unescape`: every numeric and named reference), the two applied in turn
  until nothing changes (double encodings; at most ROUNDS), obs-fold undone, quoted-printable,
  C-style escapes (`\\xNN`, octal, `\\u`, any escaped character), CSS escapes, and the hex
  digits alone (mixed case, separators, `0x`/`\\x`/`%`/`&#x` prefixes);
- `held(data, needles, window)`: how many bytes at a stream chunk's end may begin a value in
  the percent or HTML readings (they wait for the next chunk, so a value split across chunks
  is caught before any of it reaches the step).

Each reading costs one pass over the text; echo.py calls them on a body within BODY_CAP or on
a stream's chunk and a bounded tail.
"""

import binascii
import html
import re

ROUNDS = 4                  # percent-then-HTML passes (an encoding nested deeper is not read)
PER_CHAR = 16               # raw bytes a stream holds back per character of the longest value
                            # (`&#x0000067;` is 11; a reference padded longer: `overlong`)

_PCT = re.compile(rb"%([0-9A-Fa-f]{2})")
_FOLD = re.compile(rb"\r?\n[ \t]+")
_C_ESC = re.compile(rb"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[0-7]{1,3}|[^\r\n])")
_CSS_ESC = re.compile(rb"\\([0-9A-Fa-f]{1,6})(?:\r\n|[ \t\r\n\f])?")
_HEX_PREFIX = re.compile(rb"0x|\\x")
_NOT_HEX = re.compile(rb"[^0-9a-f]+")
# A numeric reference zero-padded past what a stream holds back per character: html.unescape
# reads any number of digits, so a value so spelled could outrun the hold; no server writes one.
_OVERLONG = re.compile(rb"&#[xX]?[0-9A-Fa-f]{%d,}" % (PER_CHAR - 4))
# An escape not finished at a chunk's end: the next chunk may complete it.
_OPEN = re.compile(rb"(?:%[0-9A-Fa-f]?|&#?[xX]?[0-9A-Za-z]{0,32})\Z")


def _chr(cp: int) -> bytes:
    try:
        return chr(cp).encode("utf-8", "surrogatepass")
    except (ValueError, OverflowError):
        return b"?"


def pct(data: bytes) -> bytes:
    return _PCT.sub(lambda m: bytes([int(m[1], 16)]), data) if b"%" in data else data


def unescape(data: bytes) -> bytes:
    if b"&" not in data:
        return data
    return html.unescape(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def decoded(data: bytes) -> list[bytes]:
    """Percent-decoded and HTML-unescaped in turn, each new reading (the last fully decoded)."""
    out, cur = [], data
    for _ in range(ROUNDS):
        changed = False
        for step in (pct, unescape):
            nxt = step(cur)
            if nxt != cur:
                out.append(nxt)
                cur, changed = nxt, True
        if not changed:
            break
    return out


def _c_escape(m) -> bytes:
    s = m[1]
    if s[:1] in (b"x", b"u", b"U") and len(s) > 1:
        return _chr(int(s[1:], 16))
    if s[:1].isdigit() and s[:1] < b"8":
        return bytes([int(s, 8) & 0xFF])
    return s


def of(data: bytes) -> list[bytes]:
    """Every reading of `data` that differs from it (see the module's text)."""
    out = decoded(data)
    if b"\n" in data:
        out.append(_FOLD.sub(b"", data))
    if b"=" in data:
        try:
            out.append(binascii.a2b_qp(data))
        except (binascii.Error, ValueError):
            pass
    if b"\\" in data:
        out.append(_C_ESC.sub(_c_escape, data))
        out.append(_CSS_ESC.sub(lambda m: _chr(int(m[1], 16)), data))
    out.append(_NOT_HEX.sub(b"", _HEX_PREFIX.sub(b"", data.lower())))
    return [r for r in out if r != data]


def overlong(data: bytes) -> bool:
    """Does `data` hold a numeric reference longer than a stream can hold back per character?"""
    return b"&#" in data and _OVERLONG.search(data) is not None


def held(data: bytes, needles, window: int) -> int:
    """The length of the longest end of `data` (within `window` bytes) whose percent/HTML
    reading begins one of `needles`, with an escape left open at the very end (`%6`, `&#01`)
    held too; 0 if none."""
    tail = data[-window:] if window > 0 else b""
    m = _OPEN.search(tail)
    opened = len(m[0]) if m else 0
    body = tail[:len(tail) - opened]
    firsts = {n[:1] for n in needles if n}
    for s in range(len(body)):
        c = body[s:s + 1]
        if c not in firsts and c not in (b"%", b"&"):
            continue
        rest = body[s:]
        readings = decoded(rest) or [rest]
        got = readings[-1]
        if got and any(n.startswith(got) for n in needles) or \
                any(r and any(n.startswith(r) for n in needles) for r in readings[:-1]):
            return len(body) - s + opened
    return opened
