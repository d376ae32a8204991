"""What a GraphQL HTTP request would do: "query", "mutation", "subscription" or "unknown".

A real parser (graphql-core), because a regex lets a mutation through after a comment, inside
a string-looking block, or behind an `operationName`. The answer is the most dangerous
operation the request *could* run, never the one the client says it picks:

- every operation of every document counts, whatever `operationName` says: servers differ on
  duplicate JSON keys and on how they pick, and a read-only caller never needs to send a
  mutation it does not run;
- a batched array counts its worst element;
- "unknown" when the request cannot be read as GraphQL at all: a persisted query sent as a hash
  or id only, a hash that does not match the text sent beside it, a document that does not
  parse, a body that is not JSON / form / application/graphql. A rule that matches mutations
  matches "unknown" too (see network.py), so what cannot be read is not let out.

graphql-core is imported on first use: the policy package stays cheap to import.
"""

import hashlib
import json
from urllib.parse import parse_qs

MAX_DOCUMENT = 1024 * 1024          # larger bodies are not parsed: "unknown"
MAX_TOKENS = 50_000                  # bounds parse time on hostile documents
_RANK = {"query": 0, "subscription": 1, "mutation": 2, "unknown": 3}
_ID_KEYS = ("id", "documentId", "doc_id", "queryId", "persistedQueryId", "hash")


def classify(body: bytes | None, content_type: str = "", query_string: str = "") -> str:
    """The worst operation type the request could run (see the module doc)."""
    ops = []
    if query_string:
        fields = {k: v[0] for k, v in parse_qs(query_string).items()}
        if "query" in fields or "extensions" in fields or any(k in fields for k in _ID_KEYS):
            ops.append(_classify_fields(fields, from_url=True))
    if body:
        ops.append(_classify_body(body, content_type.split(";")[0].strip().lower()))
    if not ops:
        return "query" if not body else "unknown"
    return max(ops, key=_RANK.__getitem__)


def _classify_body(body: bytes, ctype: str) -> str:
    if len(body) > MAX_DOCUMENT:
        return "unknown"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "unknown"
    if ctype == "application/graphql":
        return _document_type(text)
    if ctype == "application/x-www-form-urlencoded":
        return _classify_fields({k: v[0] for k, v in parse_qs(text).items()}, from_url=True)
    try:
        data = json.loads(text)
    except ValueError:
        return "unknown"
    items = data if isinstance(data, list) else [data]
    if not items:
        return "unknown"
    return max((_classify_fields(i) for i in items), key=_RANK.__getitem__)


def _classify_fields(fields, from_url=False) -> str:
    if not isinstance(fields, dict):
        return "unknown"
    query = fields.get("query")
    extensions = fields.get("extensions")
    if from_url and isinstance(extensions, str):
        try:
            extensions = json.loads(extensions)
        except ValueError:
            return "unknown"
    if any(k in fields for k in _ID_KEYS):
        return "unknown"                      # a stored document we cannot see
    if isinstance(extensions, dict) and "persistedQuery" in extensions:
        pq = extensions["persistedQuery"]
        want = pq.get("sha256Hash") if isinstance(pq, dict) else None
        if not isinstance(query, str) or not isinstance(want, str) or \
                hashlib.sha256(query.encode()).hexdigest() != want.lower():
            return "unknown"                  # hash only, or text that is not the hashed one
    if not isinstance(query, str):
        return "unknown"
    return _document_type(query)


def _document_type(text: str) -> str:
    from graphql import GraphQLError, OperationDefinitionNode, parse
    try:
        doc = parse(text, no_location=True, max_tokens=MAX_TOKENS)
    except (GraphQLError, RecursionError):
        return "unknown"
    kinds = [d.operation.value for d in doc.definitions if isinstance(d, OperationDefinitionNode)]
    if not kinds:
        return "unknown"                      # fragments only: nothing a server would run
    return max(kinds, key=_RANK.__getitem__)
