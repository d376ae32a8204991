"""Base64 broken into lines (MIME's CRLF every 76 characters, PEM's 64, any width, lines
indented): a base64 decoder reads it as one run (most skip line breaks and whitespace), and
echo.py's search for a real value's base64 core, run by run, would not see it across a break.

- `joined`: the text with the breaks inside such runs taken out, where echo.Echoes looks for
  the cores (found whole, never a break between them);
- `held`: how many bytes at a stream's end may begin a core across breaks (they wait for the
  next chunk: a stream is cut off before any byte of the core, not after most of it);
- `rewrite`: in a buffered body, each broken run holding a real value decoded, the value put
  back as its placeholder, encoded again and broken as it was.

A break is spaces or tabs (at most SPACES each side) around at most one line break: a blank
line ends a MIME or PEM block, and an event stream's "\\n\\n" never joins two runs.
"""

import base64
import re

SPACES = 256                # indentation beyond this ends a run (one bound for all three uses)
_ALPHA = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-")
_GAP_CHARS = frozenset(b" \t\r\n")
_GAP = rb"(?:[ \t]{0,%d}\r?\n[ \t]{0,%d}|[ \t]{1,%d})" % (SPACES, SPACES, SPACES)
_GAP_RE = re.compile(_GAP)
_JOIN = re.compile(rb"(?<=[A-Za-z0-9+/_=-])" + _GAP + rb"(?=[A-Za-z0-9+/_=-])")
_RUN = re.compile(rb"[A-Za-z0-9+/_-]+(?:" + _GAP + rb"[A-Za-z0-9+/_-]+)*(?:" + _GAP + rb"?=){0,2}")
_SPLIT = re.compile(b"(" + _GAP + b")")
EDGE_WORDS = 4              # words before or after the base64 in one run ("Basic", a boundary)


def joined(data: bytes) -> bytes:
    return _JOIN.sub(b"", data)


def held(data: bytes, needles, longest: int) -> int:
    """The length of the longest end of `data` that, its breaks taken out, begins one of
    `needles` (0 if none)."""
    places: list[int] = []          # the base64 characters at the end, last first
    i = len(data)
    while len(places) < longest - 1 and i > 0:
        j = i
        while j > 0 and i - j <= 2 * SPACES + 2 and data[j - 1] in _GAP_CHARS:
            j -= 1
        gap = data[j:i]
        if i == len(data) and gap.endswith(b"\r"):
            gap += b"\n"           # a CRLF the next chunk completes
        if gap and not _GAP_RE.fullmatch(gap):
            break                   # a blank line, a long indentation: no run crosses it
        if j == 0 or data[j - 1] not in _ALPHA:
            break
        places.append(j - 1)
        i = j - 1
    if not places:
        return 0
    chars = bytes(data[p] for p in reversed(places))
    for k in range(len(chars)):     # the longest end first
        if any(n.startswith(chars[k:]) for n in needles):
            return len(data) - places[len(chars) - 1 - k]
    return 0


def rewrite(body: bytes, cores, names: list) -> bytes:
    """`body` with every broken base64 run that holds a real value rewritten: `cores` are
    echo.Echoes.cores (core, real, placeholder, name); each name rewritten is added to
    `names`. A run whose value cannot be found at any start is left as it is (the caller
    then finds its core and withholds the body)."""
    def one(m):
        run = m[0]
        if not _GAP_RE.search(run):
            return run              # unbroken: echo.Echoes._b64_run's
        flat = joined(run)
        found = [(real, ph, name) for core, real, ph, name in cores if core in flat]
        return _rewrap(run, found, names) if found else run
    return _RUN.sub(one, body)


def _rewrap(run: bytes, found, names: list) -> bytes:
    parts = _SPLIT.split(run)
    words, gaps = parts[0::2], parts[1::2]
    n = len(words)
    for lead in range(min(n, EDGE_WORDS)):
        for tail in range(min(n - lead, EDGE_WORDS)):
            window = words[lead:n - tail]
            enc = b"".join(window)
            data = _decode(enc)
            if data is None or not any(real in data for real, _, _ in found):
                continue
            for real, ph, name in found:
                if real in data:
                    data = data.replace(real, ph)
                    names.append(name)
            out = _layout(_encode(data, enc), [len(w) for w in window], gaps[lead:n - tail - 1])
            before = b"".join(words[i] + gaps[i] for i in range(lead))
            after = b"".join(gaps[i] + words[i + 1] for i in range(n - tail - 1, n - 1))
            return before + out + after
    return run


def _decode(enc: bytes) -> bytes | None:
    core = enc.rstrip(b"=")
    if len(core) % 4 == 1:
        return None
    urlsafe = b"-" in core or b"_" in core
    try:
        return base64.b64decode(core + b"=" * (-len(core) % 4), altchars=b"-_" if urlsafe else None)
    except ValueError:
        return None


def _encode(data: bytes, like: bytes) -> bytes:
    urlsafe = b"-" in like or b"_" in like
    out = base64.urlsafe_b64encode(data) if urlsafe else base64.b64encode(data)
    return out if like.endswith(b"=") else out.rstrip(b"=")


def _layout(enc: bytes, widths: list[int], gaps: list[bytes]) -> bytes:
    """`enc` broken as the run it replaces was: lines of one width with one break between
    them (MIME, PEM) go on so; any other layout keeps its breaks where they were."""
    if not gaps:
        return enc
    width = widths[0]
    if len(set(gaps)) == 1 and all(w == width for w in widths[:-1]) and widths[-1] <= width:
        return gaps[0].join(enc[i:i + width] for i in range(0, len(enc), width))
    out, at = [], 0
    for w, gap in zip(widths[:-1], gaps, strict=True):
        if at + w >= len(enc):
            break
        out += [enc[at:at + w], gap]
        at += w
    return b"".join(out) + enc[at:]
