"""What a server may act on for one request: every method and every path it may read the
request as. The one reader of both, used by the request rules (network.decide_request: l7
methods and paths, irreversible rules), an answer's key and question (approval_effect, the
gate's per-step memory of answers, remembered grants) and the credentials gate (a credential's
`methods` and `paths`).

Methods: the request line's; the override headers (X-HTTP-Method-Override, X-HTTP-Method,
X-Method-Override; any case, every repetition and comma-separated value); a `_method` field in
the query, or in a urlencoded, multipart or JSON body (Rails' Rack::MethodOverride, Laravel,
Symfony). A field's name is read as those servers read it: percent-decoded (`%5Fmethod`) and
with PHP's name mangling (`.`, ` `, `+`, `[` read as `_`), any case. A POST (the method those
frameworks override) whose body could carry such a field but is not read whole (past the
gate's buffer, or undecodable) has an UNKNOWN method too: the strictest reading, so an l7
method list refuses it, and every irreversible rule about a method matches it (as a body rule
matches a body it cannot read).

Paths: the request line's, and those of the X-Original-URL / X-Rewrite-URL headers (IIS URL
Rewrite and ARR, Zend Framework 1, Symfony before CVE-2018-14773 route by them).

Standard library only (imported by the gate, never by the hot path)."""

import json
import re
from urllib.parse import unquote_plus

OVERRIDE_HEADERS = ("x-http-method-override", "x-http-method", "x-method-override")
PATH_HEADERS = ("x-original-url", "x-rewrite-url")
UNKNOWN = "(UNKNOWN)"           # a method that could not be read; never an allowed one



def is_method_field(name: str) -> bool:
    """Is a query/form/JSON field of this (decoded) name read as `_method` by some server?"""
    return re.sub(r"[. +\[]", "_", name.strip("\0")).lower() == "_method"


def _hex(n: int) -> str:
    return f"%{n >> 4:X}[{n & 15:x}{n & 15:X}]"


def _spelled(ch: str) -> str:
    """A regex for one character of a field name as sent: itself (any case) or %-encoded."""
    if ch.isalpha():
        return f"(?:[{ch.lower()}{ch.upper()}]|{_hex(ord(ch.lower()))}|{_hex(ord(ch.upper()))})"
    return f"(?:{re.escape(ch)}|{_hex(ord(ch))})"


# A query's or urlencoded form's field whose name decodes to `_method` (PHP's `.`, ` `, `+`
# and `[` for `_`), found in one linear pass (parse_qsl over a megabyte of fields takes
# seconds); fields split on `&` and `;` (older Rack), the value up to the next of them.
_FIELD = re.compile("(?:^|[&;])" + "(?:" + "|".join(_spelled(c) for c in "_. [") + r"|\+)"
                    + "".join(_spelled(c) for c in "method") + "=([^&;]*)")


# a multipart part named so (its name as _FIELD reads one) and the first word of its value
_PART = re.compile('[Nn][Aa][Mm][Ee]="?(?:' + "|".join(_spelled(c) for c in "_. [+") + ")"
                   + "".join(_spelled(c) for c in "method")
                   + r'"?[^\r\n]*\r?\n(?:[^\r\n]+\r?\n)*\r?\n\s*([A-Za-z]*)')


def _form(text: str) -> set[str]:
    return {unquote_plus(v).strip().upper() for v in _FIELD.findall(text)}


def _body(text: str) -> set[str]:
    out = _form(text)
    out.update(v.upper() for v in _PART.findall(text))
    if text.lstrip().startswith("{"):           # Laravel makes a JSON body the input Symfony reads
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            out.update(v.strip().upper() for k, v in doc.items()
                       if isinstance(v, str) and is_method_field(k))
    return out


def _may_carry_fields(content_type: str) -> bool:
    """Could a server parse this body into fields? (Rack reads a POST without a type as a form.)"""
    t = content_type.split(";", 1)[0].strip().lower()
    return not t or t in ("application/x-www-form-urlencoded", "multipart/form-data") or \
        t.endswith("json")


def methods(req) -> frozenset:
    """Every method a server may act on for `req` (a network.Request), upper-case; UNKNOWN
    among them when a POST's body that may carry `_method` was not read whole. Kept on the
    request (Request.memo): reading a megabyte of body for fields takes tens of milliseconds,
    and the judging and the record's facts both ask."""
    memo = getattr(req, "memo", None)
    if memo is None:
        return _methods(req)
    if "acts.methods" not in memo:
        memo["acts.methods"] = _methods(req)
    return memo["acts.methods"]


def _methods(req) -> frozenset:
    out = {req.method.upper()}
    for h in OVERRIDE_HEADERS:
        if h in req.headers:                    # repetitions are joined by ", " (proxy/flows.py)
            out.update(v.strip().upper() for v in req.headers[h].split(","))
    if req.query:
        out.update(_form(req.query))
    if req.body:
        out.update(_body(req.body.decode("latin-1")))
    if req.method.upper() == "POST" and (req.body_error or not req.body_complete) and \
            _may_carry_fields(req.headers.get("content-type", "")):
        out.add(UNKNOWN)
    out.discard("")
    return frozenset(out)


def paths(req) -> list[str]:
    """Every path (without its query) a server may route `req` to: the request line's first."""
    out = [req.path]
    for h in PATH_HEADERS:
        if h in req.headers:
            v = req.headers[h].strip()
            if "://" in v:                      # an absolute URL: its path
                v = "/" + v.split("://", 1)[1].partition("/")[2]
            v = v.partition("?")[0]
            out.append(v if v.startswith("/") else "/" + v)
    return out
