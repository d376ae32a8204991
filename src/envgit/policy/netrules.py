"""The irreversible rules, compiled: the body predicates a rule may name, and a policy's
`irreversible` list (its own `net:` rules, the default preset's rules, overrides) turned into
`Rule`s in the order network.py tries them. Pure: no I/O."""

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from . import acts, graphql
from .hostnames import norm_host, rule_entry_matches
from .netpresets import DOWNLOAD_HOSTS, PRESET, PRESET_RULES, preset_rule_name
from .netrequest import Request


def _git_ref_updates(req):
    # git's 4-byte probe before a large push carries no ref update: it changes nothing.
    return req.body != b"0000"


PYPI_MARKERS = (b":action", b"file_upload")


def form_typed(req):
    """Would a server's form parser read this body (multipart or urlencoded)?"""
    ctype = req.headers.get("content-type", "").lower()
    return ctype.startswith("multipart/") or "x-www-form-urlencoded" in ctype


def _pypi_upload(req):
    # A byte search, not a multipart parser: whatever spelling the server's parser accepts,
    # the field name and value are in the body (or the query). Past BODY_CAP, a form body
    # may hold them further on: an unencoded one is watched as it streams (see Watch), an
    # encoded one is doubt.
    hay = (req.body or b"") + req.query.encode()
    if all(m in hay for m in PYPI_MARKERS):
        return True
    return not req.body_complete and form_typed(req) and _encoded(req)


def _encoded(req):
    return req.headers.get("content-encoding", "").strip().lower() not in ("", "identity")


def _lfs_upload(req):
    if not req.body_complete:
        return True
    try:
        return json.loads(req.body).get("operation") != "download"
    except (TypeError, ValueError, AttributeError):
        return True


def _graphql(wanted):
    def match(req):
        kind = graphql.classify(req.body, req.headers.get("content-type", ""), req.query,
                                req.body_complete)
        return kind in (wanted, "unknown")
    return match


def _once(name, pred):
    """`pred`, its outcome kept on the request (Request.memo): every rule, the record's facts
    and a learn step's second judgement ask the same question of the same body."""
    def run(req):
        memo = req.memo
        if name not in memo:
            memo[name] = pred(req)
        return memo[name]
    return run


BODY_PREDICATES = {name: _once(name, pred) for name, pred in {
    "git-ref-updates": _git_ref_updates,
    "pypi-upload": _pypi_upload,
    "lfs-upload": _lfs_upload,
    "graphql-mutation": _graphql("mutation"),
    "graphql-subscription": _graphql("subscription"),
}.items()}



# --- compiled rules ------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str
    action: str
    hosts: tuple | None          # entries; None: any host but DOWNLOAD_HOSTS
    methods: frozenset | None
    not_methods: frozenset
    paths: tuple | None          # compiled URL globs
    not_paths: tuple
    header: tuple | None
    body: str | None
    hint: str

    def applies_to_host(self, host: str, port: int) -> bool:
        return _hosts_apply(self.hosts, host, port)

    def matches(self, req: Request, methods: set, paths: set) -> bool:
        if not self.matches_head(req, methods, paths):
            return False
        if self.body is None:
            return True
        # A body that could not be decoded cannot be shown harmless.
        return bool(req.body_error) or BODY_PREDICATES[self.body](req)

    def matches_head(self, req: Request, methods: set | frozenset, paths: set | frozenset) -> bool:
        """Everything but the body matches."""
        if not self.applies_to_host(req.host, req.port):
            return False
        if self.methods is not None and not (methods & self.methods) and acts.UNKNOWN not in methods:
            return False
        if self.not_methods and methods <= self.not_methods:
            return False
        if self.paths is not None and not any(rx.fullmatch(p) for rx in self.paths for p in paths):
            return False
        if self.not_paths and all(any(rx.fullmatch(p) for rx in self.not_paths) for p in paths):
            return False
        if self.header is not None:
            name, values = self.header
            if req.headers.get(name, "").strip().lower() not in values:
                return False
        return True


@lru_cache(maxsize=4096)
def _hosts_apply(hosts, host, port) -> bool:
    if hosts is None:
        return norm_host(host) not in DOWNLOAD_HOSTS
    return any(rule_entry_matches(e, host, port) for e in hosts)



@lru_cache(maxsize=4096)
def url_glob(pattern: str) -> re.Pattern:
    """`*` within a path segment, `**` across segments, `?` one character; case-insensitive.
    A run of `*` is one wildcard (`**` when it is two or more): `.*` after `.*` matches the same
    but backtracks polynomially, a dozen of them for hours on a long path."""
    out = []
    for tok in re.split(r"(\*+|\?)", pattern):
        out.append(".*" if tok.startswith("**") else {"*": "[^/]*", "?": "[^/]"}.get(tok, re.escape(tok)))
    return re.compile("".join(out), re.I)


def method_set(spec) -> frozenset | None:
    if spec is None or spec == "*":
        return None
    return frozenset(m.upper() for m in (spec.split() if isinstance(spec, str) else spec))


def _preset_rule(d, action) -> Rule:
    return Rule(name=f"preset:{PRESET}/{d['name']}", kind=d["kind"], action=action,
                hosts=d.get("hosts"), methods=method_set(d.get("methods")),
                not_methods=method_set(d.get("not_methods")) or frozenset(),
                paths=tuple(url_glob(p) for p in d["paths"]) if "paths" in d else None,
                not_paths=tuple(url_glob(p) for p in d.get("not_paths", ())),
                header=d.get("header"), body=d.get("body"), hint=d.get("hint", ""))


def _user_rule(i, entry) -> Rule:
    net = entry["net"]
    name = entry.get("name") or f"irreversible[{i}]"
    method = net.get("method")
    kind = entry.get("name") or " ".join(x for x in (method, net["host"] + net.get("path", "")) if x)
    body = entry.get("body", {}).get("graphql")
    return Rule(name=name, kind=kind, action=entry["action"], hosts=(net["host"],), methods=method_set(method),
                not_methods=frozenset(), paths=(url_glob(net["path"]),) if "path" in net else None,
                not_paths=(), header=None, body=f"graphql-{body}" if body else None,
                hint=f"change the action of {name} in envgit.yaml (only a person outside the "
                     "sandbox can)")


@lru_cache(maxsize=64)
def _compile(irreversible_json: str) -> tuple[Rule, ...]:
    entries = json.loads(irreversible_json)
    user, overrides, preset_action, disabled = [], {}, None, set()
    for i, e in enumerate(entries):
        if "net" in e:
            user.append(_user_rule(i, e))
        elif "rule" in e:
            name = preset_rule_name(e["rule"])
            if name:
                overrides[name] = e["action"]
        elif e.get("preset") == PRESET:
            preset_action = e.get("action", "deny")
            disabled |= {preset_rule_name(n) for n in e.get("disable", ())}
    preset = []
    for d in PRESET_RULES:
        # A `rule:` override brings its rule in even without `preset: default`.
        action = overrides.get(d["name"], preset_action)
        if action is not None and (d["name"] not in disabled or d["name"] in overrides):
            preset.append(_preset_rule(d, action))
    return tuple(user + preset)


def rules_of(policy) -> tuple[Rule, ...]:
    """The policy's irreversible rules in the order they are tried."""
    return _compile(json.dumps(policy.irreversible, sort_keys=True))
