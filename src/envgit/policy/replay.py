"""What a candidate policy would have done to the requests the journal recorded (`envgit policy
replay`): each request record judged again by the gate's own judging (network.decide_request,
network.judge_connect for a tunnel), compared with the decision recorded. Pure: no I/O; the
command (commands/replay.py) reads the journal and loads the candidate.

A record holds the request line (method, scheme, host, port, path, the query's names with their
values redacted), never headers or a body (docs/FORMAT.md). A request is judged again only when
those facts decide it under the candidate: when a rule of the candidate that would be tried on
it reads a body (a push's ref updates, a GraphQL operation, an upload's form, an LFS batch's
operation) or a header, or the recorded decision was made on facts the record does not hold
(a credential's placeholder, an Upgrade header, a Host header or TLS name that disagreed), the
request is listed as "cannot replay: the record lacks X" and counted, never guessed.

Not seen by a replay: method-override and rewrite headers (X-HTTP-Method-Override,
X-Original-URL; the record keeps the request line's method and path only), the address a name
resolved to (network.judge_address), and remembered grants (an ask a grant would answer is
still "ask")."""

import dataclasses
import re
from dataclasses import dataclass
from urllib.parse import unquote_plus

from . import acts, network, urlpath
from .netrequest import Decision, Request
from .netrules import rules_of

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
    "builtin:upgrade": "the request's Upgrade and Connection headers (or the server's 101)",
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


def as_request(rec: dict) -> Request:
    """The request a record describes: its request line, no headers, no body."""
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
    if rule in DECIDED_ON:
        return Outcome(rec, None, DECIDED_ON[rule])
    req = as_request(rec)
    if req.method.upper() == "CONNECT":
        d = network.judge_connect(policy, req.host, req.port)
        if d.action == "allow" and d.intercept and not rec.get("intercepted", True):
            return Outcome(rec, None, "the requests inside the tunnel (the candidate would "
                                      "judge each; they were tunnelled unread then)")
        return Outcome(rec, d)
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
