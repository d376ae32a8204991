"""How a server may read a URL path: every spelling a request's path could mean to one server
or another, so that a rule is judged on the path as the server would read it.

    r = readings("/repo.git/git-receive-pack;x")
    r.spellings    # {"/repo.git/git-receive-pack;x", "/repo.git/git-receive-pack", …}
    r.doubt        # "" or why no set of readings can be trusted (the request is then denied)

Servers differ, and each of these is something a real one does: percent-decoding (once, twice:
a proxy in front decodes too), dropping `;params` from segments (Tomcat, Jetty, Spring; also
after `%3B` is decoded), reading `\\` as `/` (IIS), dropping a segment's trailing dots and
spaces (Windows), cutting at a decoded NUL, `?` or `#`, collapsing `//`, resolving `.` and `..`,
ignoring a trailing slash (and case: the globs compare case-insensitively). The readings are the
closure of the path under all of them, in any order: an irreversible rule matches if any
reading matches; an allow-list (network.l7 paths) admits the path only if every reading is on it.

Doubt, where no reading can be trusted: a control character in any reading (a decoded NUL,
CR or LF), a `..` that climbs above the root, or more readings than MAX_READINGS.

A plain path (letters, digits, the usual punctuation, dots only inside a segment name) has no
other readings than itself without its trailing slash: the common case costs one regex match.
"""

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote

MAX_READINGS = 64

_PLAIN = re.compile(r"(?:/[\w~@:+,=!$&'()*-]+(?:\.[\w~@:+,=!$&'()*-]+)*)*/?", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PARAMS = re.compile(r";[^/]*")
_SLASHES = re.compile(r"/{2,}")
_CUT = re.compile(r"[\x00?#]")


@dataclass(frozen=True)
class Readings:
    spellings: frozenset
    doubt: str = ""


def _decode(p):
    return unquote(p, errors="surrogateescape")


def _params(p):
    return _PARAMS.sub("", p)


def _backslash(p):
    return p.replace("\\", "/")


def _trailing_dots(p):
    return "/".join(s if s in (".", "..") else s.rstrip(". ") for s in p.split("/"))


def _cut(p):
    m = _CUT.search(p)
    return p[:m.start()] if m else p


def _collapse(p):
    return _SLASHES.sub("/", p)


class _AboveRoot(ValueError):
    pass


def _resolve(p):
    out = []
    for s in p.split("/")[1:]:
        if s == "..":
            if not out:
                raise _AboveRoot(p)
            out.pop()
        elif s not in (".", ""):
            out.append(s)
    return "/" + "/".join(out) + ("/" if p.endswith("/") and out else "")


def _untrail(p):
    return p.rstrip("/") or "/"


_STEPS = (_decode, _params, _backslash, _trailing_dots, _cut, _collapse, _resolve, _untrail)


@lru_cache(maxsize=4096)
def readings(path: str) -> Readings:
    """The spellings a server may read `path` (without its query) as; see the module doc."""
    path = path if path.startswith("/") else "/" + path
    if _PLAIN.fullmatch(path):
        return Readings(frozenset({path, _untrail(path)}))
    seen, todo = {path}, [path]
    while todo:
        p = todo.pop()
        for step in _STEPS:
            try:
                q = step(p)
            except _AboveRoot:
                return Readings(frozenset(seen), f"a '..' in {path!r} climbs above the root")
            if not q.startswith("/"):
                q = "/" + q
            if q not in seen:
                seen.add(q)
                todo.append(q)
                if len(seen) > MAX_READINGS:
                    return Readings(frozenset(seen), f"{path!r} has more than {MAX_READINGS} readings")
    bad = next((p for p in seen if _CONTROL.search(p)), None)
    if bad is not None:
        return Readings(frozenset(seen), f"{path!r} reads as one with a control character "
                                         f"({bad.encode('unicode_escape', 'backslashreplace').decode()!r})")
    return Readings(frozenset(seen))
