"""Network decisions, pure: which hosts a step may reach, which connections need TLS terminated
to be judged, and what happens to each request. No I/O: the proxy (envgit.proxy) builds a
`Request`, calls `decide_request`, and acts on the `Decision`. The judging is here; what it
judges with is beside it: netrequest.py (Request, Decision, BODY_CAP), hostnames.py (how hosts
are spelled and compared), netpresets.py (the default preset, as data), netrules.py (the
irreversible rules compiled, with their body predicates), approval.py (what an `ask` covers).

Host entries (`network.allow`, the keys of `network.l7`, `net.host` of a rule):
  `host`         in network.allow: that host on the standard ports, 443 and 80 (plain HTTP
                 gets the same rules); as an l7 key or a rule's host: that host on any port
  `host:port`    that host on that port only
  `*.domain`     any name under domain (at any depth), not domain itself; `*.domain:port` too
Names compare case-insensitively, a trailing dot ignored. IP literals (also the legacy forms
`127.1`, `2130706433`), `localhost`, and the cloud metadata names are reachable only when an
entry names them exactly (no wildcard reaches them). Port 22 and the ssh-over-443 hosts are
refused whatever the policy says: a push inside SSH cannot be inspected (git over SSH goes
through the gate's own ssh socket instead, judged as the HTTPS request: proxy/sshgit.py).

Order of judgement for one request:
  1. the request must go where its tunnel goes: Host, :authority, SNI and an absolute-form
     target must agree with the CONNECT target (else an allowed tunnel reaches another host);
  2. the host must be allowed (above);
  3. the first irreversible rule matching decides, with its action: the user's `net:` rules
     in file order, then the preset's rules in table order. An irreversible rule is the more
     specific statement, so it wins over `l7` (an `ask` on POST /repos/*/*/issues works on a
     host whose l7 allows only GET);
  4. `network.l7[host]`: the method and path must be among those listed;
  5. otherwise allowed.

Irreversible matching errs towards matching: a rule matches if the path matches in any of the
readings a server may give it (urlpath.py: percent-decoded, `;params` dropped, trailing dots
dropped, dot-segments resolved, any case, …) of any path a server may route it to (acts.paths:
the request line's, X-Original-URL, X-Rewrite-URL), if any method a server may act on matches
(acts.methods: the request line's, override headers, a `_method` field; an unreadable one
matches every rule), and a body rule matches a body it cannot read (undecodable,
or larger than BODY_CAP where the part it needs is past it). An l7 allow-list admits a path
only if every reading is on it, and checks every method. A path with no trustworthy readings
(a control character, a `..` above the root) is denied on every judged host.

An upgrade (WebSocket or any other protocol) on a judged host is refused: what flows after it
is not HTTP and would not be judged. `network.l7[host].websocket: allow` lets WebSocket
upgrades to that host through (the handshake itself is judged like any request).

An `ask` is answered for one effect, `approval.approval_effect(decision, request)`: for a git push the
repository and its exact ref updates (old -> new, hence create/delete/force) and push options;
for GraphQL every operation (type, name, top-level fields); for any other request the methods
(acts.methods), host, port, paths (acts.paths) and query. A different effect is asked again.
"""

import dataclasses

from . import acts, urlpath
from .hostnames import (
    METADATA_IPS,
    canonical_host,
    embedded_v4,
    entry_matches,
    hostport,
    ip_literal,
    is_special,
    norm_host,
    not_suggested,
    rule_entry_matches,
    split_entry,
)
from .netrequest import BODY_CAP, Decision, Request, Watch
from .netrules import BODY_PREDICATES, PYPI_MARKERS, Rule, form_typed, rules_of, url_glob

SSH_OVER_443 = ("ssh.github.com", "altssh.gitlab.com", "altssh.bitbucket.org",
                "ssh.dev.azure.com", "vs-ssh.visualstudio.com")
SSH_HINT = ("git fetch and push over ssh go through envgit's own ssh in a step (judged as "
            "over HTTPS); for anything else use an https remote: git remote set-url origin "
            "https://HOST/OWNER/REPO.git")


def allowed_by(policy, host: str, port: int) -> str | None:
    """The network.allow entry that lets `host:port` be reached, or None."""
    exact = is_special(host) is not None
    return next((e for e in policy.network_allow if entry_matches(e, host, port, exact)), None)


def judge_host(policy, host: str, port: int) -> Decision:
    h = norm_host(host)
    if port == 22 or h in SSH_OVER_443:
        return Decision("deny", "builtin:ssh", f"SSH to {h}:{port} is refused: what is pushed "
                        "inside SSH cannot be inspected", hint=SSH_HINT)
    special = is_special(h)
    entry = allowed_by(policy, h, port)
    if entry is None:
        if special:
            return Decision("deny", "builtin:special-address", f"{h} is {special}; it is "
                            "reachable only when network.allow names it exactly",
                            hint="envgit does not suggest allowing it: a person who means it "
                                 "names it exactly in network.allow themselves")
        hint = (f"add '{hostport(h, port)}' to network.allow in envgit.yaml (only a person "
                "outside the sandbox can)") if not_suggested(h) is None else ""
        return Decision("deny", "network.allow", f"{hostport(h, port)} is not in network.allow",
                        hint=hint)
    return Decision("allow", "network.allow", f"{hostport(h, port)} is allowed by "
                    f"network.allow entry {entry!r}")


def judge_address(policy, host: str, port: int, address: str) -> Decision:
    """The address a name resolved to, before connecting: an allowed name must not lead to a
    loopback, link-local or metadata address unless network.allow names the host exactly.
    (Private networks stay reachable: a company's git server has a 10.x address.) An IPv6
    address that leads to an IPv4 one (embedded_v4) is judged by it: any but a global one is
    refused."""
    ip = ip_literal(address)
    if ip is None or is_special(host) or not (
            ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast or
            ip in METADATA_IPS or any(not v4.is_global for v4 in embedded_v4(ip))):
        return Decision("allow", "network.allow", f"{host} resolved to {address}")
    if any(entry_matches(e, host, port, exact=True) for e in policy.network_allow):
        return Decision("allow", "network.allow", f"{host} resolved to {address}, named exactly")
    return Decision("deny", "builtin:resolved-address",
                    f"{host} resolved to {address}, a loopback/link-local/metadata address",
                    hint=f"name '{hostport(norm_host(host), port)}' exactly in network.allow "
                         "if this is intended")



def _l7_entry(policy, host, port):
    # A key without a port applies on every port network.allow lets the host be reached on.
    host = norm_host(host)
    exact = [k for k in policy.l7 if not split_entry(k)[0].startswith("*.") and rule_entry_matches(k, host, port)]
    wild = [k for k in policy.l7 if split_entry(k)[0].startswith("*.") and rule_entry_matches(k, host, port)]
    # The most specific entry: host:port before host before the longest wildcard.
    exact.sort(key=lambda k: split_entry(k)[1] is None)
    wild.sort(key=lambda k: -len(k))
    return (exact + wild or [None])[0]


def needs_interception(policy, host: str, port: int, sni: str | None = None) -> bool:
    """Must TLS to `host:port` be terminated, because a request-level rule can apply to it?
    Also when the client's TLS server name is another host: terminated, its requests get a
    readable denial (decide_request) instead of a tunnel to somewhere else."""
    if sni and norm_host(sni) != norm_host(host):
        return True
    if _l7_entry(policy, host, port) is not None:
        return True
    if getattr(policy, "credentials", None):
        # Every host, not only the credentials' own: a placeholder (or an echoed real value)
        # is seen, and denied, only in the clear; a tunnel would carry it out unseen.
        return True
    return any(r.applies_to_host(host, port) for r in rules_of(policy))


def judge_connect(policy, host: str, port: int) -> Decision:
    """The CONNECT itself: may the tunnel open, and must its TLS be terminated?"""
    d = judge_host(policy, host, port)
    if d.action != "allow":
        return d
    return Decision("allow", d.rule, d.reason, intercept=needs_interception(policy, host, port))


# --- requests ------------------------------------------------------------------------------

_OVERRIDE_HEADERS = acts.OVERRIDE_HEADERS


def _authority(value: str, default_port: int) -> tuple[str, int]:
    host, port = split_entry(value) if value else ("", None)
    return host, port or default_port


def _loopback(host: str) -> bool:
    return canonical_host(host) == "localhost"


def _same_place(a: tuple, b: tuple) -> bool:
    """Do two (host, port) name the same place? Equal, or two spellings of this machine's
    loopback on the same port (a client of the loopback forwarder says Host: 127.0.0.1:P
    inside a tunnel to localhost:P; sandbox/loopback.py)."""
    return a == b or (a[1] == b[1] and _loopback(a[0]) and _loopback(b[0]))


def _mismatch(req: Request) -> str | None:
    """Why the request would not go where its tunnel (or its URL) says, or None."""
    default = 443 if req.scheme == "https" else 80
    target = (norm_host(req.host), req.port)
    if req.connect_host is not None:
        tunnel = (norm_host(req.connect_host), req.connect_port)
        if not _same_place(target, tunnel):
            return f"the request names {hostport(*target)} inside a tunnel to {hostport(*tunnel)}"
    if req.sni and norm_host(req.sni) != target[0]:
        return f"TLS server name {req.sni!r} is not {target[0]}"
    for name in ("host", ":authority"):
        if name in req.headers:
            h = _authority(req.headers[name], default)
            if not _same_place((norm_host(h[0]), h[1]), target):
                return f"{name.lstrip(':').capitalize()} {req.headers[name]!r} is not {hostport(*target)}"
    return None


def decide_request(policy, req: Request) -> Decision:
    """What happens to one HTTP request (inside a tunnel or plain): see the module doc."""
    why = _mismatch(req)
    if why:
        return Decision("deny", "builtin:authority-mismatch", why,
                        hint="send each request to the host its connection was opened for")
    d = judge_host(policy, req.host, req.port)
    if d.action != "allow":
        return d
    paths = _path_readings(req)
    if paths.doubt:
        return Decision("deny", "builtin:ambiguous-path", f"the path is ambiguous: {paths.doubt}",
                        hint="send the path in its plain form (no encoded control characters, "
                             "no '..' above the root)")
    key = _l7_entry(policy, req.host, req.port)
    if "upgrade" in req.headers or "connection" in req.headers and \
            "upgrade" in req.headers["connection"].lower():
        refused = _judge_upgrade(policy, req, key)
        if refused is not None:
            return refused
    methods = acts.methods(req)
    watch = None
    for rule in rules_of(policy):
        if not rule.matches_head(req, methods, paths.spellings):
            continue
        if rule.body is None or req.body_error or BODY_PREDICATES[rule.body](req):
            d = Decision(rule.action, rule.name, f"{rule.kind} is irreversible; rule {rule.name}",
                         irreversible=True, kind=rule.kind, hint=rule.hint or _override_hint(rule),
                         body_rule=rule.body or "")
            return d if watch is None or d.action == "deny" else dataclasses.replace(d, watch=watch)
        if watch is None and rule.body in _WATCHED and rule.action != "allow" and \
                not req.body_complete and form_typed(req):
            watch = Watch(_WATCHED[rule.body], Decision(
                "deny", rule.name, f"{rule.kind} is irreversible; rule {rule.name} (found past the "
                f"first {BODY_CAP >> 20} MiB of the body: the request was cut off there)",
                irreversible=True, kind=rule.kind, hint=rule.hint or _override_hint(rule)))
    d = _judge_l7(policy, req, key, methods, paths, d)
    return d if watch is None or d.action == "deny" else dataclasses.replace(d, watch=watch)


# Body rules that can be judged on a stream: their markers.
_WATCHED = {"pypi-upload": PYPI_MARKERS}


def _judge_l7(policy, req, key, methods, paths, d):
    if key is not None:
        spec = policy.l7[key]
        allowed_methods = {m.upper() for m in spec.get("methods", ["*"])}
        if "*" not in allowed_methods and not methods <= allowed_methods:
            return Decision("deny", f"network.l7[{key}]", f"{_methods_text(req, methods)} is not among "
                            f"the methods network.l7[{key}] allows ({', '.join(sorted(allowed_methods))})",
                            hint=f"change network.l7 for {key} in envgit.yaml if the step needs it")
        if "paths" in spec and not all(any(url_glob(p).fullmatch(s) for p in spec["paths"])
                                       for s in paths.spellings):
            return Decision("deny", f"network.l7[{key}]", f"{req.path} is not among the paths "
                            f"network.l7[{key}] allows",
                            hint=f"change network.l7 for {key} in envgit.yaml if the step needs it")
        return Decision("allow", f"network.l7[{key}]", f"{req.method} {req.path} is allowed by "
                        f"network.l7[{key}]")
    return d


def _methods_text(req, methods) -> str:
    others = sorted(methods - {req.method.upper()})
    return req.method + (f" (acted on as {', '.join(others)})" if others else "")


def _path_readings(req) -> urlpath.Readings:
    """The readings of every path a server may route the request to (acts.paths), together."""
    spellings: set[str] = set()
    doubt = ""
    for p in acts.paths(req):
        r = urlpath.readings(p)
        spellings |= r.spellings
        doubt = doubt or r.doubt
    return urlpath.Readings(frozenset(spellings), doubt)


def _judge_upgrade(policy, req: Request, key) -> Decision | None:
    """An upgrade request on a judged host: refused (None: let through to be judged as a
    request), unless network.l7[host] says `websocket: allow` and it is a WebSocket upgrade."""
    if not needs_interception(policy, req.host, req.port):
        return None                 # no request-level rule here: as unjudged as a tunnel
    want = req.headers.get("upgrade", "").strip().lower()
    if want == "websocket" and key is not None and policy.l7[key].get("websocket") == "allow":
        return None
    return Decision("deny", "builtin:upgrade",
                    f"an upgrade to {want or 'another protocol'!r} on {hostport(norm_host(req.host), req.port)} "
                    "is refused: what flows after it would not be judged",
                    hint=f"set 'websocket: allow' under network.l7 for {norm_host(req.host)} in envgit.yaml "
                         "if the step needs WebSockets there (their messages are not judged)")


def _override_hint(rule: Rule) -> str:
    short = rule.name.rsplit("/", 1)[-1]
    return (f"this cannot be taken back; a person can change it in envgit.yaml with "
            f"'- rule: {short}' and 'action: ask' (or 'allow')")
