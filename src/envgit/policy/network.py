"""Network decisions, pure: which hosts a step may reach, which connections need TLS terminated
to be judged, and what happens to each request. No I/O: the proxy (envgit.proxy) builds a
`Request`, calls `decide_request`, and acts on the `Decision`.

Host entries (`network.allow`, the keys of `network.l7`, `net.host` of a rule):
  `host`         in network.allow: that host on the standard ports, 443 and 80 (plain HTTP
                 gets the same rules); as an l7 key or a rule's host: that host on any port
  `host:port`    that host on that port only
  `*.domain`     any name under domain (at any depth), not domain itself; `*.domain:port` too
Names compare case-insensitively, a trailing dot ignored. IP literals (also the legacy forms
`127.1`, `2130706433`), `localhost`, and the cloud metadata names are reachable only when an
entry names them exactly (no wildcard reaches them). Port 22 and the ssh-over-443 hosts are
refused whatever the policy says: a push inside SSH cannot be inspected.

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

An `ask` is answered for one effect, `approval_effect(decision, request)`: for a git push the
repository and its exact ref updates (old -> new, hence create/delete/force) and push options;
for GraphQL every operation (type, name, top-level fields); for any other request the methods
(acts.methods), host, port, paths (acts.paths) and query. A different effect is asked again.
"""

import dataclasses
import ipaddress
import json
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from . import acts, graphql, receivepack, urlpath

# What the gate buffers of a request body to judge it (the rest is streamed on once judged):
# a push's pkt-line command section (about 100 bytes a ref) and any real GraphQL document fit.
BODY_CAP = 1 << 20

# --- requests and decisions --------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    scheme: str                              # "http" | "https" (of the request, not the proxy)
    host: str                                # where it goes: URL authority, Host, or CONNECT
    port: int
    method: str
    path: str                                # as sent, without the query
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)   # lower-case names
    body: bytes | None = None                # with Content-Encoding undone; None: none or unreadable
    body_error: str = ""                     # why the body could not be decoded, if it could not
    body_complete: bool = True               # False: `body` is its first BODY_CAP bytes only
    connect_host: str | None = None          # the CONNECT target, when inside a tunnel
    connect_port: int | None = None
    sni: str | None = None                   # TLS server name the client sent, if any


@dataclass(frozen=True)
class Decision:
    action: str                              # "allow" | "deny" | "ask"
    rule: str                                # citable: preset:default/git-push, network.allow, …
    reason: str                              # one line, no newline (it goes into git's output)
    irreversible: bool = False               # the request is an irreversible action
    kind: str = ""                           # e.g. "git push"
    intercept: bool = False                  # (CONNECT) terminate TLS to judge each request
    hint: str = ""                           # what to do instead (for people and models)
    body_rule: str = ""                      # the body predicate of the rule that matched, if any
    watch: "Watch | None" = None             # what to look for in the rest of a body past BODY_CAP


@dataclass(frozen=True)
class Watch:
    """A rule that would match if the part of the body past BODY_CAP (streamed on, not
    judged whole) held every one of `markers`: the gate scans the stream, and cuts the request
    off (the server never receives the chunk that completes them) with `decision`."""
    markers: tuple
    decision: Decision

    def scanner(self):
        return MarkerScan(self.markers)


class MarkerScan:
    """Feed a body chunk by chunk; feed() is True once every marker has been seen (a marker
    split across chunks too), before the chunk that completes them is let through."""

    def __init__(self, markers):
        self.missing = set(markers)
        self.keep = max(map(len, markers)) - 1
        self.tail = b""

    def feed(self, chunk: bytes) -> bool:
        hay = self.tail + chunk
        self.missing = {m for m in self.missing if m not in hay}
        self.tail = hay[-self.keep:] if self.keep else b""
        return not self.missing


# --- the preset ----------------------------------------------------------------------------

PRESET = "default"

WRITES = "POST PUT PATCH DELETE"             # "any write" for REST APIs (OPTIONS is a preflight)

# Forges and registries whose hosts the host-scoped rules below name.
GITHUB_API = ("api.github.com", "uploads.github.com")
GITLAB = ("gitlab.com", "gitlab.*")
NPM = ("registry.npmjs.org", "registry.yarnpkg.com", "npm.pkg.github.com")
PYPI_UPLOAD = ("upload.pypi.org", "test.pypi.org")
HUGGINGFACE = ("huggingface.co", "hf.co")
HF_REPO_TYPES = ("models", "datasets", "spaces", "buckets", "repos")
# GraphQL endpoints, also with a format suffix (Rails routes `/api/graphql(.:format)`) and a
# trailing slash (spelled out: a not_paths list must hold every reading, urlpath.py).
GITHUB_GRAPHQL = [p + s for p in ("/graphql", "/graphql.*") for s in ("", "/")]
GITLAB_GRAPHQL = [p + s for p in ("/api/graphql", "/api/graphql.*") for s in ("", "/")]

# Download hosts: no irreversible action is known on them, so the rules that apply to any
# host (git push, OCI push, …) skip them, and they are tunnelled untouched (no TLS
# termination; this is where bulk downloads happen). A user's own rule still applies.
DOWNLOAD_HOSTS = (
    "files.pythonhosted.org", "pypi.org", "static.crates.io", "index.crates.io",
    "objects.githubusercontent.com", "raw.githubusercontent.com", "codeload.github.com",
    "release-assets.githubusercontent.com", "pkg-containers.githubusercontent.com",
    "media.githubusercontent.com", "production.cloudflare.docker.com", "proxy.golang.org",
    "sum.golang.org", "storage.googleapis.com", "deb.debian.org", "security.debian.org",
    "archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com", "dl-cdn.alpinelinux.org",
    "nodejs.org", "repo.maven.apache.org", "repo1.maven.org", "cdn-lfs.huggingface.co",
    "cdn-lfs.hf.co", "cdn-lfs-us-1.hf.co", "cas-bridge.xethub.hf.co",
)

# The default preset, as data. Fields: name (cited as preset:default/<name>), kind (what the
# person reads), hosts (None: any host but DOWNLOAD_HOSTS), methods ("*": any), not_methods
# (the rule matches only if a method of the request, or an override, is not among them), paths (URL globs: `*`
# within a segment, `**` across), not_paths, header (name, values) that must be present,
# body (a predicate name from BODY_PREDICATES), hint.
PRESET_RULES: list[dict] = [
    dict(name="git-push", kind="git push", methods="POST", paths=["**/git-receive-pack"],
         body="git-ref-updates",
         hint="a push cannot be taken back; push from outside envgit, or set "
              "'- rule: git-push' with 'action: ask' in envgit.yaml"),
    dict(name="git-push-webdav", kind="git push (WebDAV)",
         methods="PUT MKCOL MOVE COPY LOCK UNLOCK PROPPATCH DELETE",
         paths=["**/objects/**", "**/refs/**", "**/info/refs"]),
    dict(name="git-lfs-upload", kind="git lfs push", methods="POST",
         paths=["**/info/lfs/objects/batch"], body="lfs-upload"),
    dict(name="npm-dist-tag", kind="npm dist-tag", hosts=NPM, methods="PUT DELETE POST",
         paths=["/-/package/**/dist-tags/**", "/-/package/**/dist-tags"]),
    dict(name="npm-access", kind="npm access/owner/team change", hosts=NPM, methods=WRITES,
         paths=["/-/package/**", "/-/org/**", "/-/team/**"]),
    dict(name="npm-unpublish", kind="npm unpublish", hosts=NPM, methods="PUT DELETE",
         paths=["/**/-rev/*"]),
    dict(name="npm-deprecate", kind="npm deprecate", hosts=NPM, methods="PUT",
         header=("npm-command", ("deprecate", "undeprecate"))),
    dict(name="npm-publish", kind="npm publish", hosts=NPM, methods="PUT POST",
         paths=["/*", "/@*/*", "/-/stage/package/**"], not_paths=["/-/user/**", "/-/v1/**"]),
    # A private registry is any host: the npm client says what it is doing in a header.
    dict(name="npm-client-write", kind="npm write", methods=WRITES,
         header=("npm-command", ("publish", "unpublish", "dist-tag", "deprecate", "undeprecate",
                                 "owner", "access", "team", "org", "star", "unstar", "hook"))),
    dict(name="pypi-upload", kind="PyPI upload", methods="POST", body="pypi-upload"),
    dict(name="pypi-legacy-upload", kind="PyPI upload", hosts=PYPI_UPLOAD, methods=WRITES),
    dict(name="cargo-publish", kind="cargo publish", methods="PUT", paths=["/api/v1/crates/new"]),
    dict(name="cargo-yank", kind="cargo yank", methods="DELETE PUT",
         paths=["/api/v1/crates/*/*/yank", "/api/v1/crates/*/*/unyank"]),
    dict(name="cargo-owners", kind="cargo owner change", methods="PUT DELETE",
         paths=["/api/v1/crates/*/owners"]),
    dict(name="oci-push", kind="image push", methods="POST PATCH PUT",
         paths=["/v2/**/blobs/uploads", "/v2/**/blobs/uploads/**", "/v2/**/manifests/*"]),
    dict(name="oci-delete", kind="image delete", methods="DELETE",
         paths=["/v2/**/manifests/*", "/v2/**/blobs/*"]),
    dict(name="github-graphql-mutation", kind="GitHub GraphQL mutation", hosts=("api.github.com",),
         methods="POST GET", paths=GITHUB_GRAPHQL, body="graphql-mutation"),
    # Only GET and POST are read as GraphQL: what a server does with a document sent by any
    # other method is not known, so that is irreversible (deny on doubt).
    dict(name="github-graphql-method", kind="GitHub GraphQL request by another method",
         hosts=("api.github.com",), methods="*", not_methods="GET POST", paths=GITHUB_GRAPHQL),
    dict(name="github-rest-write", kind="GitHub API write", hosts=GITHUB_API, methods=WRITES,
         not_paths=GITHUB_GRAPHQL),
    dict(name="gitlab-graphql-mutation", kind="GitLab GraphQL mutation", hosts=GITLAB,
         methods="POST GET", paths=GITLAB_GRAPHQL, body="graphql-mutation"),
    dict(name="gitlab-graphql-method", kind="GitLab GraphQL request by another method",
         hosts=GITLAB, methods="*", not_methods="GET POST", paths=GITLAB_GRAPHQL),
    dict(name="gitlab-rest-write", kind="GitLab API write", hosts=GITLAB, methods=WRITES,
         paths=["/api/v4/**"]),
    # Every request but a read on a repository's API is a write (commit, branch, tag,
    # super-squash, discussion merge, settings, Space secrets/hardware/restart, LFS file
    # deletion, …): an allow-list of reads, not a list of the writes known today. The one
    # read sent as POST, paths-info, stays a read (repo id: one or two segments).
    dict(name="huggingface-repo-write", kind="Hugging Face repo write", hosts=HUGGINGFACE,
         methods="*", not_methods="GET HEAD OPTIONS",
         paths=[p for t in HF_REPO_TYPES for p in (f"/api/{t}", f"/api/{t}/**")],
         not_paths=[f"/api/{t}/{r}/paths-info/*{s}" for t in HF_REPO_TYPES if t != "repos"
                    for r in ("*", "*/*") for s in ("", "/")]),
    # Uploads: a write capability for the Xet storage (a GET, but what it grants is a write),
    # and the LFS endpoints past the batch (verify, multipart completion, locks). The LFS
    # batch itself is judged by git-lfs-upload (a download batch stays allowed).
    dict(name="huggingface-upload", kind="Hugging Face upload", hosts=HUGGINGFACE,
         methods="*", paths=["/api/**/xet-write-token", "/api/**/xet-write-token/**"]),
    dict(name="huggingface-lfs-write", kind="Hugging Face upload", hosts=HUGGINGFACE,
         methods="*", not_methods="GET HEAD OPTIONS",
         paths=["/**/info/lfs/**", "/api/complete_multipart", "/api/complete_multipart/**"],
         not_paths=["/**/info/lfs/objects/batch"]),
]
PRESET_NAMES = tuple(r["name"] for r in PRESET_RULES)


def _git_ref_updates(req):
    # git's 4-byte probe before a large push carries no ref update: it changes nothing.
    return req.body != b"0000"


PYPI_MARKERS = (b":action", b"file_upload")


def _form_typed(req):
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
    return not req.body_complete and _form_typed(req) and _encoded(req)


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


BODY_PREDICATES = {
    "git-ref-updates": _git_ref_updates,
    "pypi-upload": _pypi_upload,
    "lfs-upload": _lfs_upload,
    "graphql-mutation": _graphql("mutation"),
    "graphql-subscription": _graphql("subscription"),
}


def preset_rule_name(name: str) -> str | None:
    """The preset rule `name` refers to (`git-push`, `default/git-push`,
    `preset:default/git-push`), or None."""
    short = name.removeprefix("preset:").removeprefix(PRESET + "/")
    return short if short in PRESET_NAMES else None


# --- hosts ---------------------------------------------------------------------------------

SSH_OVER_443 = ("ssh.github.com", "altssh.gitlab.com", "altssh.bitbucket.org",
                "ssh.dev.azure.com", "vs-ssh.visualstudio.com")
METADATA_NAMES = ("metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                  "instance-data.ec2.internal", "metadata.azure.internal")
METADATA_IPS = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
                ipaddress.ip_address("100.100.100.200"))
SSH_HINT = ("use an https remote: git remote set-url origin https://HOST/OWNER/REPO.git")
_LEGACY_V4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$")


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def norm_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def ip_literal(host: str):
    """The address `host` spells, also in the legacy IPv4 forms a resolver accepts, or None."""
    h = norm_host(host)
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if _LEGACY_V4.match(h):
        try:
            return ipaddress.ip_address(socket.inet_aton(h))   # pure parsing, no lookup
        except OSError:
            return None
    return None


_NAT64_WKP = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def embedded_v4(ip) -> tuple:
    """The IPv4 addresses an IPv6 address leads to: `::ffff:a.b.c.d`, and NAT64 (RFC 6052):
    the well-known prefix 64:ff9b::/96 and the local-use 64:ff9b:1::/48, whose prefix length
    the network chooses (/48, /56, /64 or /96: every embedding is taken)."""
    if ip.version != 6:
        return ()
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    b = ip.packed
    if ip in _NAT64_WKP:
        return (ipaddress.IPv4Address(b[12:16]),)
    if ip in _NAT64_LOCAL:
        return tuple(ipaddress.IPv4Address(x) for x in (b[6:8] + b[9:11], b[7:8] + b[9:12],
                                                        b[9:13], b[12:16]))
    return ()


def is_special(host: str) -> str | None:
    """Why `host` is reachable only when named exactly, or None for an ordinary name."""
    h = norm_host(host)
    ip = ip_literal(h)
    if ip is not None:
        if ip in METADATA_IPS or any(v4 in METADATA_IPS for v4 in embedded_v4(ip)):
            return "a cloud metadata address"
        return "an IP address; name the host instead"
    if h in METADATA_NAMES:
        return "a cloud metadata name"
    if h == "localhost" or h.endswith(".localhost"):
        return "a loopback name"
    return None


# Suffixes no public host is under (RFC 6762 .local, RFC 6761 .localhost, the cloud providers'
# and home routers' private zones, reverse lookups): a name under one is a place inside.
_PRIVATE_SUFFIXES = ("internal", "local", "localhost", "localdomain", "lan", "home", "corp",
                     "intranet", "private", "arpa")


def not_suggested(host: str) -> str | None:
    """Why envgit must never offer a line that allows `host` (a step chose it: a raw DNS query
    or a request to the gate costs it nothing), or None for a host it may suggest. The one
    place that decides it: the gate's own special addresses (is_special: every IP literal in
    any spelling, the metadata names, localhost), and any name not under a public-looking
    suffix (a single label, .internal, .local, ...). A person who means such a host names it
    in network.allow themselves."""
    h = norm_host(host)
    special = is_special(h)
    if special:
        return special.split(";")[0]
    labels = h.split(".")
    if len(labels) < 2 or "" in labels:
        return "a single-label name"
    tld = labels[-1]
    if tld in _PRIVATE_SUFFIXES or not (tld.isalpha() or tld.startswith("xn--")) or len(tld) < 2:
        return "a name under a private suffix"
    return None


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def split_entry(entry: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]:port`, `*.domain` -> (normalised host pattern, port or None)."""
    e = entry.strip()
    if e.startswith("["):
        host, _, rest = e[1:].partition("]")
        return norm_host(host), int(rest[1:]) if rest.startswith(":") else None
    if e.count(":") == 1:
        host, port = e.split(":")
        return norm_host(host), int(port)
    return norm_host(e), None


def host_matches(pattern: str, host: str) -> bool:
    """`pattern` is a name, `*.domain` (names under domain) or a preset `name.*` (a name
    starting with that label)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    if pattern.endswith(".*"):
        return host.startswith(pattern[:-1])
    if pattern == host:
        return True
    a, b = ip_literal(pattern), ip_literal(host)
    return a is not None and a == b


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def canonical_host(host: str) -> str:
    """The one spelling of the place `host` names, as the gate compares places: every loopback
    spelling (localhost, 127.0.0.0/8, ::1, ::ffff:127.x.y.z, legacy forms) is 'localhost' (the
    gate takes them for one authority on a port: _same_place); an IPv4-mapped IPv6 address is
    its IPv4 address (a dual-stack socket connects there); any other IP literal its compressed
    form; a name as norm_host spells it."""
    h = norm_host(host)
    if h == "localhost":
        return h
    ip = ip_literal(h)
    if ip is None:
        return h
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return "localhost" if ip.is_loopback else str(ip)


@lru_cache(maxsize=4096)
def places(host: str) -> frozenset:
    """Every canonical place a connection to `host` can reach: canonical_host, and for an IPv6
    address that leads to IPv4 through NAT64 (embedded_v4) those IPv4 addresses too."""
    c = canonical_host(host)
    ip = ip_literal(c)
    return frozenset((c, *(canonical_host(str(v4)) for v4 in (embedded_v4(ip) if ip else ()))))


def rule_host_matches(pattern: str, host: str) -> bool:
    """Does a rule's host pattern (an irreversible `net:` rule, a network.deny entry, a
    network.l7 key) apply to `host`? As host_matches, and also for every other spelling of the
    same place (places): a rule that restricts 127.0.0.1 restricts localhost and [::1] on that
    port, one on 192.168.1.10 restricts [::ffff:192.168.1.10]. (network.allow stays exact:
    allowing one spelling does not open the others.)"""
    return host_matches(pattern, host) or bool(places(pattern) & places(host))


def entry_matches(entry: str, host: str, port: int, exact: bool = False) -> bool:
    pat, eport = split_entry(entry)
    if exact and pat.startswith("*."):
        return False
    return host_matches(pat, norm_host(host)) and (port in (80, 443) if eport is None else port == eport)


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
        hint = (f"add '{_hostport(h, port)}' to network.allow in envgit.yaml (only a person "
                "outside the sandbox can)") if not_suggested(h) is None else ""
        return Decision("deny", "network.allow", f"{_hostport(h, port)} is not in network.allow",
                        hint=hint)
    return Decision("allow", "network.allow", f"{_hostport(h, port)} is allowed by "
                    f"network.allow entry {entry!r}")


def _hostport(host, port):
    host = f"[{host}]" if ":" in host else host
    return host if port in (80, 443) else f"{host}:{port}"


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
                    hint=f"name '{_hostport(norm_host(host), port)}' exactly in network.allow "
                         "if this is intended")


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
    return any(_rule_host(e, host, port) for e in hosts)


def _rule_host(entry, host, port):
    pat, eport = split_entry(entry)
    return rule_host_matches(pat, norm_host(host)) and (eport is None or eport == port)


@lru_cache(maxsize=4096)
def url_glob(pattern: str) -> re.Pattern:
    """`*` within a path segment, `**` across segments, `?` one character; case-insensitive."""
    out = []
    for tok in re.split(r"(\*\*|\*|\?)", pattern):
        out.append({"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(tok, re.escape(tok)))
    return re.compile("".join(out), re.I)


def _methods(spec) -> frozenset | None:
    if spec is None or spec == "*":
        return None
    return frozenset(m.upper() for m in (spec.split() if isinstance(spec, str) else spec))


def _preset_rule(d, action) -> Rule:
    return Rule(name=f"preset:{PRESET}/{d['name']}", kind=d["kind"], action=action,
                hosts=d.get("hosts"), methods=_methods(d.get("methods")),
                not_methods=_methods(d.get("not_methods")) or frozenset(),
                paths=tuple(url_glob(p) for p in d["paths"]) if "paths" in d else None,
                not_paths=tuple(url_glob(p) for p in d.get("not_paths", ())),
                header=d.get("header"), body=d.get("body"), hint=d.get("hint", ""))


def _user_rule(i, entry) -> Rule:
    net = entry["net"]
    name = entry.get("name") or f"irreversible[{i}]"
    method = net.get("method")
    kind = entry.get("name") or " ".join(x for x in (method, net["host"] + net.get("path", "")) if x)
    body = entry.get("body", {}).get("graphql")
    return Rule(name=name, kind=kind, action=entry["action"], hosts=(net["host"],), methods=_methods(method),
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


def _l7_entry(policy, host, port):
    # A key without a port applies on every port network.allow lets the host be reached on.
    host = norm_host(host)
    exact = [k for k in policy.l7 if not split_entry(k)[0].startswith("*.") and _rule_host(k, host, port)]
    wild = [k for k in policy.l7 if split_entry(k)[0].startswith("*.") and _rule_host(k, host, port)]
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
            return f"the request names {_hostport(*target)} inside a tunnel to {_hostport(*tunnel)}"
    if req.sni and norm_host(req.sni) != target[0]:
        return f"TLS server name {req.sni!r} is not {target[0]}"
    for name in ("host", ":authority"):
        if name in req.headers:
            h = _authority(req.headers[name], default)
            if not _same_place((norm_host(h[0]), h[1]), target):
                return f"{name.lstrip(':').capitalize()} {req.headers[name]!r} is not {_hostport(*target)}"
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
                not req.body_complete and _form_typed(req):
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
    spellings, doubt = set(), ""
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
                    f"an upgrade to {want or 'another protocol'!r} on {_hostport(norm_host(req.host), req.port)} "
                    "is refused: what flows after it would not be judged",
                    hint=f"set 'websocket: allow' under network.l7 for {norm_host(req.host)} in envgit.yaml "
                         "if the step needs WebSockets there (their messages are not judged)")


# --- what an approval covers -----------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    key: tuple                               # equal keys: the same effect (within one step)
    shown: dict                              # what the person is asked about
    doubt: str = ""                          # why the effect cannot be known: deny, do not ask


def approval_effect(d: Decision, req: Request) -> Effect:
    """What an `ask` about `req` (decided `d`) is a question about, and so what one answer
    covers (see the module doc). With doubt, nobody can be asked about it."""
    where = (norm_host(req.host), req.port)
    if d.body_rule == "git-ref-updates":
        if req.body_error:
            return Effect((), {}, f"the push cannot be read ({req.body_error})")
        push = receivepack.read_push(req.body or b"")
        if push.doubt:
            return Effect((), {}, push.doubt)
        repo = req.path.rsplit("/", 1)[0] or "/"
        return Effect(("git push", *where, req.path, push.updates, push.options),
                      {"repository": repo, "refs": [u.to_json() for u in push.updates],
                       "options": list(push.options)})
    if d.body_rule.startswith("graphql-"):
        if req.body_error:
            return Effect((), {}, f"the GraphQL request cannot be read ({req.body_error})")
        r = graphql.read(req.body, req.headers.get("content-type", ""), req.query, req.body_complete)
        if r.doubt:
            return Effect((), {}, f"its GraphQL operations cannot be read: {r.doubt}")
        return Effect(("graphql", *where, req.path, r.operations),
                      {"operations": [o.to_json() for o in r.operations]})
    overrides = sorted(acts.methods(req) - {req.method.upper()})
    rewrites = acts.paths(req)[1:]
    shown = {"method_override": overrides} if overrides else {}
    if rewrites:
        shown["rewrite_paths"] = rewrites
    return Effect(("request", req.method.upper(), *overrides, *where, req.path, req.query,
                   "rewrite_paths", *rewrites), shown)


def _override_hint(rule: Rule) -> str:
    short = rule.name.rsplit("/", 1)[-1]
    return (f"this cannot be taken back; a person can change it in envgit.yaml with "
            f"'- rule: {short}' and 'action: ask' (or 'allow')")
