"""What a GraphQL HTTP request could do: its operations, or why they cannot be known.

    r = read(body, content_type, query_string, body_complete=True)
    r.operations   # (Operation(type, name, fields), …): every operation of every document sent
    r.doubt        # "" or why the request cannot be read as GraphQL with certainty
    r.kind         # "query" | "subscription" | "mutation" | "unknown": the worst it could run
    classify(…)    # == read(…).kind

A real parser (graphql-core), because a regex lets a mutation through after a comment, inside
a string-looking block, or behind an `operationName`. The answer is the most dangerous
operation the request *could* run, never the one the client says it picks:

- every operation of every document counts, whatever `operationName` says;
- every value of every GraphQL-carrying field counts: `query=A&query=B` in a form body or a
  query string (Rack-based servers such as GitLab's run the last, others the first), the
  query string and the body both (frameworks merge them), each element of a batched array;
  form fields are read split on `&` and on `&` or `;` (older Rack splits on both);
- doubt ("unknown") when the request cannot be read with certainty: a persisted query sent as
  a hash or id only, a hash that does not match the text beside it (or more than one of
  either), a document that does not parse or has no operation, duplicate keys in a JSON object
  (parsers keep the first or the last), a `query[…]` key (nested form parameters), a
  Content-Type naming more than one type, a multipart body, a body that is not JSON / form /
  application/graphql, or one larger than the gate reads (`body_complete=False`).
A rule that matches mutations matches "unknown" too (see network.py), so what cannot be read
is not let out.

graphql-core is imported on first use: the policy package stays cheap to import.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from urllib.parse import unquote_plus

MAX_DOCUMENT = 1024 * 1024          # larger bodies are not parsed: "unknown"
MAX_TOKENS = 50_000                  # bounds parse time on hostile documents
MAX_FRAGMENT_DEPTH = 20
_RANK = {"query": 0, "subscription": 1, "mutation": 2, "unknown": 3}
_ID_KEYS = ("id", "documentId", "doc_id", "queryId", "persistedQueryId", "hash")
_CARRYING = ("query", "extensions", "operationName", "variables", *_ID_KEYS)
_URL_OPERATION = ("query", "extensions", *_ID_KEYS)   # what makes a query string a GraphQL request
_FORM_SPLITS = (re.compile("&"), re.compile("[&;]"))


@dataclass(frozen=True)
class Operation:
    type: str                      # "query" | "mutation" | "subscription"
    name: str                      # "" when anonymous
    fields: tuple                  # the top-level fields it selects (through fragments too)

    def to_json(self) -> dict:
        return {"type": self.type, "name": self.name, "fields": list(self.fields)}


@dataclass(frozen=True)
class Reading:
    operations: tuple = ()
    doubt: str = ""

    @property
    def kind(self) -> str:
        if self.doubt:
            return "unknown"
        if not self.operations:
            return "query"               # nothing GraphQL-shaped was sent at all
        return max((o.type for o in self.operations), key=_RANK.__getitem__)


class _Doubt(ValueError):
    pass


def classify(body: bytes | None, content_type: str = "", query_string: str = "",
             body_complete: bool = True) -> str:
    """The worst operation type the request could run (see the module doc)."""
    return read(body, content_type, query_string, body_complete).kind


def read(body: bytes | None, content_type: str = "", query_string: str = "",
         body_complete: bool = True) -> Reading:
    """Every operation the request could run, or the doubt (see the module doc)."""
    ops = []
    try:
        if query_string:
            fields = _form_fields(query_string)
            if any(k in fields for k in _URL_OPERATION):
                ops += _from_fields(fields, from_url=True)
        if body:
            ops += _from_body(body, content_type, body_complete)
    except _Doubt as e:
        return Reading(tuple(ops), str(e))
    return Reading(tuple(ops))


def _form_fields(text: str) -> dict:
    """name -> every value it has, read split on `&` and on `&`/`;` (see the module doc)."""
    out: dict[str, dict] = {}          # name -> its values, in order, each once
    for split in _FORM_SPLITS:
        for item in split.split(text):
            if not item:
                continue
            k, _, v = item.partition("=")
            k = unquote_plus(k)
            base = k.partition("[")[0]
            if base != k and base in _CARRYING:
                raise _Doubt(f"the form field {k!r} is a nested parameter")
            out.setdefault(k, {})[unquote_plus(v)] = None
    return {k: list(v) for k, v in out.items()}


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _Doubt(f"a JSON object has the key {dup!r} twice")
    return dict(pairs)


def _json(text: str):
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        if isinstance(e, _Doubt):
            raise
        raise _Doubt(f"the body is not JSON ({e.__class__.__name__})") from None


def _from_body(body: bytes, content_type: str, complete: bool) -> list:
    if not complete or len(body) > MAX_DOCUMENT:
        raise _Doubt("the body is larger than the part the gate reads")
    if "," in content_type:
        raise _Doubt(f"the Content-Type {content_type!r} names more than one type")
    ctype = content_type.split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Doubt("the body is not UTF-8") from None
    if ctype == "application/graphql":
        return _document(text)
    if ctype == "application/x-www-form-urlencoded":
        return _from_fields(_form_fields(text), from_url=True)
    if ctype.startswith("multipart/"):
        raise _Doubt("GraphQL in a multipart body is not read by the gate")
    data = _json(text)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise _Doubt("an empty batch")
    ops = []
    for item in items:
        if not isinstance(item, dict):
            raise _Doubt("a batch element is not an object")
        ops += _from_fields({k: [v] for k, v in item.items()}, from_url=False)
    return ops


def _from_fields(fields: dict, from_url: bool) -> list:
    """Operations of one request's fields, each name mapped to all of its values."""
    if any(k in fields for k in _ID_KEYS):
        raise _Doubt("a stored document (sent by id or hash) the gate cannot see")
    queries = fields.get("query", [])
    extensions = fields.get("extensions", [])
    if from_url:
        extensions = [_json(e) if isinstance(e, str) else e for e in extensions]
    if any(isinstance(e, dict) and "persistedQuery" in e for e in extensions):
        if len(extensions) != 1 or len(queries) != 1:
            raise _Doubt("a persisted-query hash beside more than one query or extension")
        pq = extensions[0]["persistedQuery"]
        want = pq.get("sha256Hash") if isinstance(pq, dict) else None
        if not isinstance(queries[0], str) or not isinstance(want, str) or \
                hashlib.sha256(queries[0].encode()).hexdigest() != want.lower():
            raise _Doubt("a persisted-query hash without the text it hashes")
    if not queries:
        raise _Doubt("no query document")
    ops = []
    for q in queries:
        if not isinstance(q, str):
            raise _Doubt("a query that is not a string")
        ops += _document(q)
    return ops


def _document(text: str) -> list:
    from graphql import (
        FieldNode,
        FragmentDefinitionNode,
        FragmentSpreadNode,
        GraphQLError,
        InlineFragmentNode,
        OperationDefinitionNode,
        parse,
    )
    try:
        doc = parse(text, no_location=True, max_tokens=MAX_TOKENS)
    except (GraphQLError, RecursionError):
        raise _Doubt("the document does not parse") from None
    fragments = {d.name.value: d for d in doc.definitions if isinstance(d, FragmentDefinitionNode)}

    def fields(selection_set, depth=0):
        if depth > MAX_FRAGMENT_DEPTH:
            raise _Doubt("fragments nested too deep")
        out = []
        for sel in selection_set.selections:
            if isinstance(sel, FieldNode):
                out.append(sel.name.value)
            elif isinstance(sel, InlineFragmentNode):
                out += fields(sel.selection_set, depth + 1)
            elif isinstance(sel, FragmentSpreadNode):
                frag = fragments.get(sel.name.value)
                if frag is None:
                    raise _Doubt(f"the fragment {sel.name.value!r} is not defined")
                out += fields(frag.selection_set, depth + 1)
        return out

    ops = [Operation(d.operation.value, d.name.value if d.name else "",
                     tuple(dict.fromkeys(fields(d.selection_set))))
           for d in doc.definitions if isinstance(d, OperationDefinitionNode)]
    if not ops:
        raise _Doubt("the document has no operation (fragments only)")
    return ops
