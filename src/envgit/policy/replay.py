"""What a candidate policy would have done to the requests the journal recorded (`envgit policy
replay`): each request record judged again by the gate's own judging (network.decide_request,
network.judge_connect for a tunnel), compared with the decision recorded. Pure: no I/O; the
command (commands/replay.py) reads the journal and loads the candidate.

A record holds the request line (method, scheme, host, port, path, the query's names with their
values redacted), and, on records made since the gate records them (`facts`, proxy/record.py
with `request_facts` here, docs/FORMAT.md), the facts the request rules read beyond it: every
other method a server may act on and every path a rewrite header routes to (policy/acts.py),
the value of each header a rule reads (`npm-command`, among the values rules name), whether
it asks for an upgrade (and whether to WebSocket), and each
body predicate's outcome (netrules.BODY_PREDICATES: a push's ref updates, an upload, an LFS
batch's operation, a GraphQL mutation or subscription), never a body or a header's other
values. A record with facts is judged as a request rebuilt from them: the methods and paths as
override and rewrite headers, the header, and a body chosen from a few made-up ones that the
gate's own predicates find to have exactly the recorded outcomes.

When the record lacks what a rule of the candidate that would be tried on the request reads
(a record from before `facts`), or the recorded decision was made on facts no record holds (a
credential's placeholder, an Upgrade header, a Host header or TLS name that disagreed), the
request is listed as "cannot replay: the record lacks X" and counted, never guessed.

Not seen by a replay: the address a name resolved to (network.judge_address), and remembered
grants (an ask a grant would answer is still "ask")."""

import dataclasses
import json
import re
from dataclasses import dataclass
from urllib.parse import unquote_plus

from . import acts, network, urlpath
from .netpresets import PRESET_RULES
from .netrequest import Decision, Request
from .netrules import BODY_PREDICATES, rules_of

# What a body predicate reads (netrules.BODY_PREDICATES), as a person names it.
BODY_FACTS = {
    "git-ref-updates": "the push's ref updates",
    "pypi-upload": "the upload form's fields",
    "lfs-upload": "the LFS batch's operation",
    "graphql-mutation": "the GraphQL operation",
    "graphql-subscription": "the GraphQL operation",
}

# Decisions made by a part of the gate on facts the record does not hold.
DECIDED_ON = {
    "credential-misuse": "where the credential's placeholder was (the credential gate decided it)",
    # (a request's upgrade is a fact recorded since `facts`; the server's 101 is not)
    "builtin:upgrade": "the request's Upgrade and Connection headers, or the server's 101",
    "builtin:authority-mismatch": "the request's Host header, TLS server name and tunnel target",
    "builtin:resolved-address": "the address the name resolved to",
}

# Recorded rules that are not irreversible rules (everything else a record cites is one: a
# preset rule, a `net:` rule by name or `irreversible[i]`, `network.deny HOST`).
_NOT_IRREVERSIBLE = ("network.allow", "network.l7[", "builtin:", "credential-misuse")

LABELS = {"allow": "newly allowed", "deny": "newly denied", "ask": "newly asked",
          "cannot": "cannot replay"}


@dataclass(frozen=True)
class Outcome:
    """One recorded request judged again."""
    record: dict
    now: Decision | None          # None: cannot replay
    lacks: str = ""               # what the record lacks to judge it again

    @property
    def then(self) -> str:
        return str(self.record.get("decision") or "")

    @property
    def change(self) -> str:
        """"" (the same), "allow"/"deny"/"ask" (newly so) or "cannot"."""
        if self.now is None:
            return "cannot"
        return "" if self.now.action == self.then else self.now.action

    @property
    def irreversible(self) -> bool:
        """Newly allowed, and an irreversible rule covers it: it refused or asked then, or it
        allows it now (an irreversible rule whose action is allow)."""
        return self.change == "allow" and (self.now is not None and self.now.irreversible
                                           or irreversible_rule(self.record))


def irreversible_rule(rec: dict) -> bool:
    """Was the recorded decision an irreversible rule's?"""
    rule = str(rec.get("rule") or "")
    return bool(rule) and not rule.startswith(_NOT_IRREVERSIBLE) and \
        (bool(rec.get("kind")) or bool(rec.get("irreversible")))


# --- the facts recorded beside the request line (proxy/record.py) ---------------------------

# The headers request rules read, and the values they compare (any other is "(other)").
RULE_HEADERS: dict[str, frozenset] = {}
for _d in PRESET_RULES:
    if _d.get("header"):
        _name, _values = _d["header"]
        RULE_HEADERS[_name] = RULE_HEADERS.get(_name, frozenset()) | frozenset(_values)
OTHER = "(other)"
_METHOD = re.compile(r"[A-Z][A-Z-]{0,31}|\(UNKNOWN\)")


def request_facts(req: Request) -> dict:
    """What the request rules read of `req` beyond its request line, as facts (never a body, a
    query value or a header's value other than those rules name): `methods` every other method a
    server may act on (an odd spelling as "(other)"), `paths` the rewrite headers' paths, `headers`
    the value of each header a rule reads, `upgrade` the protocol an upgrade asks for ("" none
    named, "websocket", "(other)"), `body` each body predicate's outcome (a body that could not
    be decoded matches every one, as in network.decide_request), `body_complete` false when the
    body was judged on its first BODY_CAP bytes."""
    out: dict = {"body": {name: bool(req.body_error) or bool(pred(req))
                          for name, pred in BODY_PREDICATES.items()}}
    if not req.body_complete:       # judged on its first BODY_CAP bytes; the rest was watched
        out["body_complete"] = False
    others = sorted({m if _METHOD.fullmatch(m) else OTHER for m in acts.methods(req) - {req.method.upper()}})
    if others:
        out["methods"] = others[:16]
    if acts.paths(req)[1:]:
        out["paths"] = acts.paths(req)[1:]
    heads = {}
    for name, values in RULE_HEADERS.items():
        if name in req.headers:
            v = req.headers[name].strip().lower()
            heads[name] = v if v in values else OTHER
    if heads:
        out["headers"] = heads
    conn = req.headers.get("connection", "").lower()
    if "upgrade" in req.headers or "upgrade" in conn:     # as network.decide_request tells one
        want = req.headers.get("upgrade", "").strip().lower()
        out["upgrade"] = want if want in ("", "websocket") else OTHER
    return out


def _bodies():
    """Made-up bodies (content type, bytes) to find one with a record's predicate outcomes."""
    yield "", None
    yield "", b"0000"
    for lfs in (None, "download"):
        for gql in (None, "mutation { a }", "subscription { a }", "query { a }", "id"):
            for upload in (False, True):
                doc: dict = {}
                if lfs:
                    doc["operation"] = lfs
                if gql == "id":
                    doc["id"] = "x"             # a stored document: the gate cannot read it
                elif gql:
                    doc["query"] = gql
                if upload:
                    doc["note"] = ":action file_upload"
                yield "application/json", json.dumps(doc).encode()


def rebuilt(req: Request, facts: dict) -> Request | None:
    """`req` with what `facts` say it carried: override and rewrite headers, the rule headers,
    and a body the gate's predicates find to have the recorded outcomes (None: no made-up body
    has them). The query is dropped: its values are redacted, and what rules read of it (a
    `_method` field, GraphQL, an upload's fields) is in the facts."""
    headers = {}
    if facts.get("methods"):
        headers["x-http-method-override"] = ", ".join(facts["methods"])
    for name, path in zip(acts.PATH_HEADERS, facts.get("paths") or (), strict=False):   # one each
        headers[name] = path
    for name, value in (facts.get("headers") or {}).items():
        headers[name] = "x-other" if value == OTHER else value
    if "upgrade" in facts:
        headers["connection"] = "upgrade"
        if facts["upgrade"]:
            headers["upgrade"] = "x-other" if facts["upgrade"] == OTHER else facts["upgrade"]
    want = facts.get("body") or {}
    for ctype, body in _bodies():
        h = {**headers, "content-type": ctype} if ctype else headers
        r = dataclasses.replace(req, query="", headers=h, body=body)
        if all(bool(BODY_PREDICATES[n](r)) == v for n, v in want.items() if n in BODY_PREDICATES):
            return r
    return None


def as_request(rec: dict) -> Request:
    """The request a record describes: its request line, no headers, no body (for git over
    ssh, the HTTPS request it was judged as: proxy/sshgit.py's `judged_as`)."""
    if isinstance(rec.get("judged_as"), dict):
        rec = {**rec, **rec["judged_as"]}
    path, _, query = str(rec.get("path") or "").partition("?")
    return Request(scheme=str(rec.get("scheme") or "http"), host=str(rec.get("host") or ""),
                   port=int(rec.get("port") or 0), method=str(rec.get("method") or ""),
                   path=path, query=query)


def _method_field(query: str) -> bool:
    return any(acts.is_method_field(unquote_plus(item.partition("=")[0]))
               for item in re.split("[&;]", query) if item)


def _rule_lacks(policy, req: Request, d: Decision) -> str:
    """What the record lacks for the candidate's rules to judge `req`, or ""."""
    if d.action == "deny" and (d.rule == "network.allow" or d.rule.startswith("builtin:")):
        return ""                   # decided before any request rule is tried
    methods = acts.methods(req)
    spellings: set[str] = set()
    for p in acts.paths(req):
        spellings |= urlpath.readings(p).spellings
    for rule in rules_of(policy):
        head = dataclasses.replace(rule, header=None) if rule.header else rule
        if not head.matches_head(req, methods, spellings):
            continue
        if rule.body:
            return f"{BODY_FACTS.get(rule.body, 'the body')} (rule {rule.name} reads it)"
        if rule.header:
            return f"the {rule.header[0]} header (rule {rule.name} reads it)"
        return ""                   # this rule decides, on the request line alone
    return ""


def judge(policy, rec: dict) -> Outcome:
    """One record judged again by `policy` (the candidate)."""
    rule = str(rec.get("rule") or "")
    facts = rec.get("facts")
    if rule in DECIDED_ON and not (rule == "builtin:upgrade" and rec.get("kind") != "upgrade"
                                   and isinstance(facts, dict)):
        return Outcome(rec, None, DECIDED_ON[rule])
    req = as_request(rec)
    if req.method.upper() == "CONNECT":
        d = network.judge_connect(policy, req.host, req.port)
        if d.action == "allow" and d.intercept and not rec.get("intercepted", True):
            return Outcome(rec, None, "the requests inside the tunnel (the candidate would "
                                      "judge each; they were tunnelled unread then)")
        return Outcome(rec, d)
    if isinstance(facts, dict) and isinstance(facts.get("body"), dict) and \
            set(BODY_PREDICATES) <= set(facts["body"]) and facts.get("body_complete", True):
        r = rebuilt(req, facts)
        if r is None:
            return Outcome(rec, None, "a body with the recorded facts "
                                      f"{sorted(k for k, v in facts['body'].items() if v)}")
        return Outcome(rec, network.decide_request(policy, r))
    if _method_field(req.query):
        return Outcome(rec, None, "the value of the query's _method field (redacted)")
    d = network.decide_request(policy, req)
    lacks = _rule_lacks(policy, req, d)
    if lacks:
        return Outcome(rec, None, lacks)
    return Outcome(rec, d)


def replay(policy, steps) -> dict:
    """`steps`: [(step id, [request record, ...])] in order. Returns the report: per step the
    requests whose decision changes or that cannot be replayed, and the counts."""
    out_steps, counts = [], dict.fromkeys(
        ("requests", "unchanged", "newly_allowed", "newly_denied", "newly_asked", "cannot_replay",
         "irreversible_newly_allowed"), 0)
    key = {"allow": "newly_allowed", "deny": "newly_denied", "ask": "newly_asked", "cannot": "cannot_replay",
           "": "unchanged"}
    for step, records in steps:
        listed = []
        for rec in records:
            o = judge(policy, rec)
            counts["requests"] += 1
            counts[key[o.change]] += 1
            counts["irreversible_newly_allowed"] += o.irreversible
            if o.change:
                listed.append(_shown(o))
        if listed:
            out_steps.append({"step": step, "requests": listed})
    return {"steps": out_steps, "summary": counts}


def _shown(o: Outcome) -> dict:
    r = o.record
    return {"change": LABELS[o.change],
            "method": r.get("method"), "host": r.get("host"), "port": r.get("port"),
            "path": r.get("path"), "then": {"decision": o.then, "rule": r.get("rule"), "answer": r.get("answer")},
            "now": None if o.now is None else {"decision": o.now.action, "rule": o.now.rule,
                                               "reason": o.now.reason},
            "irreversible": o.irreversible, "lacks": o.lacks or None}
