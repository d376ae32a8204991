"""Text from a step (file names, ref names, hosts, paths, command lines) made inert before it
reaches a person's terminal: an agent must not be able to fake what the person reads with
escape sequences (colours, cursor moves, cleared lines, a title, a hyperlink) or with
characters that reorder what follows (bidirectional overrides).

Every C0 control (ESC, CR, BS, newline, …), DEL, every C1 control (U+0080–U+009F, which some
terminals obey as CSI/OSC), the line and paragraph separators and the bidirectional controls
are shown as escapes: `\\x1b`, `\\n`, `\\u202e`. Standard library only, and not even `re`:
run.py's prompt uses it on the hot path.
"""

_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_CODES = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, 0x2028, 0x2029,
          *range(0x202A, 0x202F), *range(0x2066, 0x206A)]


def _escape(c):
    return _NAMED.get(c) or (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")


_TABLE = {c: _escape(c) for c in _CODES}
_TABLE_TEXT = {c: e for c, e in _TABLE.items() if c != 0x09}      # a file's lines keep tabs
_JSON = {c: f"\\u{c:04x}" for c in _CODES if c >= 0x7F}            # json.dumps escapes C0 itself


def inert(value) -> str:
    """One value (a name, a path, a command line) as a single inert line."""
    return str(value).translate(_TABLE)


def inert_line(line: str) -> str:
    """A line of a file's contents (a diff): inert, its tabs and its final newline kept."""
    body, nl = (line[:-1], "\n") if line.endswith("\n") else (line, "")
    return body.translate(_TABLE_TEXT) + nl


def inert_json(text: str) -> str:
    """JSON text (json.dumps with ensure_ascii=False) with the controls json leaves raw
    (DEL, C1, bidirectional) as \\u escapes: the same JSON value, inert on a terminal."""
    return text.translate(_JSON)


def some(items, n: int = 20) -> str:
    """The first n of `items` (paths, hosts) for a line of text, and how many more."""
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")
