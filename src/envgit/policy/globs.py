"""Path globs as the policy writes them, compiled to regular expressions.

The syntax is gitignore's, which agents and people already know:
  `*` any run of characters except `/`;  `?` one such character;  `[abc]` / `[!abc]` a class;
  `**` as a whole path segment: any number of segments (zero included).
A pattern with no `/` matches a name at any depth (`.env` is `**/.env`).
"""

import re


class GlobError(ValueError):
    pass


def compile_glob(pattern: str) -> re.Pattern:
    """The regex matching a relative POSIX path (no leading `/`) against `pattern`."""
    if not pattern:
        raise GlobError("empty pattern")
    if "***" in pattern:
        raise GlobError("'***' is not a pattern; use '**' for any depth")
    body = pattern.strip("/")
    if "/" not in body and not body.startswith("**"):
        body = "**/" + body
    out = []
    segments = body.split("/")
    for n, seg in enumerate(segments):
        last = n == len(segments) - 1
        if seg == "**":
            out.append(".*" if last else "(?:[^/]*/)*")
            continue
        if "**" in seg:
            raise GlobError(f"'**' must be a whole path segment, not part of {seg!r}")
        out.append(_segment(seg))
        if not last:
            out.append("/")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _segment(seg: str) -> str:
    i, out = 0, []
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = seg.find("]", i + 2 if seg[i + 1:i + 2] in ("!", "^") else i + 1)
            if j < 0:
                raise GlobError(f"unclosed '[' in {seg!r}")
            cls = seg[i + 1:j]
            if cls[:1] in ("!", "^"):
                cls = "^" + cls[1:]
            out.append("[" + cls.replace("\\", "\\\\") + "]")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")
