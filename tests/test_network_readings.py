"""How the gate reads what a request would do, pure (no network): URL paths in every reading a
server may give them, GraphQL in every field that carries it, a push's command section, what
one approval covers, bounded body decoding, upgrades."""

import gzip
import hashlib
import json
import zlib

import pytest

from conftest import network_policy
from envgit.policy import graphql, receivepack, urlpath
from envgit.policy.approval import approval_effect
from envgit.policy.network import BODY_CAP, Decision, decide_request
from test_network_decide import pol, req

# --- paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "/r.git/git-receive-pack;x", "/r.git/git-receive-pack%3Bx", "/r.git/git-receive-pack.",
    "/r.git/git-receive-pack%20", "/r.git/git-receive-pack%2E", "/r.git%2Fgit-receive-pack",
    "/r.git%2fgit-receive-pack", "/r.git/x/%2e%2e/git-receive-pack", "/r.git/x/..;/git-receive-pack",
    "/r.git/./git-receive-pack", "/r.git//git-receive-pack", "/R.GIT/Git-Receive-Pack",
    "/r.git%5Cgit-receive-pack", "/r.git/git-receive-pack%3Fx", "/r.git/git-receive-pack%23x",
    "/r.git/git%252Dreceive-pack", "/r.git/git-receive-pack/",
])
def test_push_path_spellings_are_judged_as_a_server_reads_them(path):
    d = decide_request(pol(), req("POST", "https://github.com" + path, b"00a0" + b"x" * 156))
    assert (d.action, d.rule) == ("deny", "preset:default/git-push"), path


@pytest.mark.parametrize("path", ["/../x", "/a/%2e%2e/%2e%2e/x", "/a%00b", "/a%0d%0aX-Injected:1",
                                  "/a%2F..%2F..%2Fetc"])
def test_ambiguous_paths_are_denied(path):
    d = decide_request(pol(allow=["files.pythonhosted.org"]), req("GET", "https://files.pythonhosted.org" + path))
    assert (d.action, d.rule) == ("deny", "builtin:ambiguous-path"), d


@pytest.mark.parametrize("path,ok", [
    ("/v1/x", True), ("/v1/a%2Fb", True), ("/v1/x;jsessionid=1", True),
    ("/v1/..;/v2/x", False), ("/v1/%2e%2e/v2/x", False), ("/v1%2F..%2Fv2/x", False),
    ("/v1/%252e%252e/v2", False), ("/v1/x/../../v2", False), ("/v1\\..\\v2", False),
])
def test_l7_allow_list_admits_only_paths_every_reading_of_which_is_on_it(path, ok):
    p = pol(allow=["api.example.com"], irreversible=[], l7={"api.example.com": {"paths": ["/v1/**"]}})
    d = decide_request(p, req("GET", "https://api.example.com" + path))
    assert (d.action == "allow") == ok, (path, d)


def test_plain_paths_have_one_reading_and_are_cheap():
    assert urlpath.readings("/repo.git/info/refs").spellings == {"/repo.git/info/refs"}
    assert urlpath.readings("/a/b/").spellings == {"/a/b/", "/a/b"}
    r = urlpath.readings("/" + "%25" * 200 + "x")
    assert r.doubt == "" or "readings" in r.doubt


# --- GraphQL -------------------------------------------------------------------------------

Q, M = "{ viewer { login } }", "mutation { addStar(input: {}) { x } }"
FORM = "application/x-www-form-urlencoded"


def form(*pairs):
    from urllib.parse import quote
    return "&".join(f"{k}={quote(v)}" for k, v in pairs)


@pytest.mark.parametrize("body,ctype,qs", [
    (form(("query", Q), ("query", M)), FORM, ""),                 # Rack runs the last
    (form(("query", M), ("query", Q)), FORM, ""),                 # others the first
    (None, "", form(("query", Q), ("query", M))),
    ("a=1;query=" + M.replace(" ", "+"), FORM, ""),               # ; as a separator (old Rack)
    (form(("query", Q)), FORM, form(("query", M))),               # URL and body, merged
    ('{"query": "' + Q + '", "query": "' + M + '"}', "application/json", ""),
    ('{"query": "' + Q + '", "extensions": {"a": 1, "a": 2}}', "application/json", ""),
    (json.dumps([{"query": Q}, {"query": M}]), "application/json", ""),
    (form(("query[]", Q)), FORM, ""),
    (json.dumps({"query": Q}), "application/json, application/x-www-form-urlencoded", ""),
    (form(("query", Q)), "multipart/form-data; boundary=x", ""),
    (json.dumps({"query": Q, "extensions": {"persistedQuery": {"sha256Hash": "00" * 32}}}), "application/json", ""),
])
def test_graphql_every_value_is_judged_and_doubt_is_unknown(body, ctype, qs):
    kind = graphql.classify(body.encode() if body else None, ctype, qs)
    assert kind in ("mutation", "unknown"), (body, ctype, qs, kind)
    d = decide_request(pol(), req("POST", "https://api.github.com/graphql" + ("?" + qs if qs else ""),
                                  body.encode() if body else None, headers={"content-type": ctype}))
    assert (d.action, d.rule) == ("deny", "preset:default/github-graphql-mutation")


def test_graphql_reads_that_stay_allowed():
    for body, ctype in [(form(("query", Q), ("query", "query B { a }")), FORM),
                        (json.dumps({"query": Q, "operationName": None}), "application/json"),
                        (json.dumps([{"query": Q}, {"query": "{ b }"}]), "application/json")]:
        assert graphql.classify(body.encode(), ctype) == "query", body
    # an operation name in the URL (clients add it for logs) is not a second request
    assert graphql.classify(json.dumps({"query": Q}).encode(), "application/json", "operationName=Foo") == "query"
    h = hashlib.sha256(Q.encode()).hexdigest()
    body = json.dumps({"query": Q, "extensions": {"persistedQuery": {"version": 1, "sha256Hash": h}}})
    assert graphql.classify(body.encode(), "application/json") == "query"


def test_graphql_past_the_cap_is_unknown():
    body = json.dumps({"query": Q}).encode()
    assert graphql.classify(body, "application/json", body_complete=False) == "unknown"


def test_graphql_operations_name_type_and_fields_through_fragments():
    doc = ("mutation Del { ...F  x: renameRepo { id } } fragment F on Mutation { deleteRepo { id } } "
           "query { viewer { login } }")
    r = graphql.read(json.dumps({"query": doc}).encode(), "application/json")
    assert [o.to_json() for o in r.operations] == [
        {"type": "mutation", "name": "Del", "fields": ["deleteRepo", "renameRepo"]},
        {"type": "query", "name": "", "fields": ["viewer"]}]


# --- pushes --------------------------------------------------------------------------------

def pkt(s: bytes) -> bytes:
    return b"%04x" % (len(s) + 4) + s


OLD, NEW, ZERO = "1" * 40, "2" * 40, "0" * 40


def test_push_command_section_read_strictly():
    body = (pkt(f"{OLD} {NEW} refs/heads/main\0report-status push-options\n".encode()) +
            pkt(f"{ZERO} {NEW} refs/heads/new\n".encode()) + b"0000" +
            pkt(b"merge_request.create\n") + b"0000PACK...")
    p = receivepack.read_push(body)
    assert p.doubt == "" and [u.to_json()["action"] for u in p.updates] == ["update", "create"]
    assert p.options == ("merge_request.create",)
    assert receivepack.read_push(b"0000") == receivepack.Push()
    for bad in [pkt(f"{OLD} {NEW} refs/heads/main\0x\n".encode()),            # no flush
                pkt(f"{OLD} {NEW}\n".encode()) + b"0000",                       # not an update
                pkt(b"push-cert\0report-status\n") + b"0000",                   # signed
                pkt(f"{OLD} {NEW} refs/heads/a\0x".encode()) + b"0001" + b"0000",
                b"zzzz"]:
        assert receivepack.read_push(bad).doubt, bad


# --- what an approval covers -----------------------------------------------------------------

def _effect(method, url, body=None, rule="git-ref-updates", **kw):
    d = Decision("ask", "r", "x", body_rule=rule)
    return approval_effect(d, req(method, url, body, **kw))


def test_effects_of_pushes():
    url = "https://github.com/me/app.git/git-receive-pack"
    a = pkt(f"{OLD} {NEW} refs/heads/feature\0report-status\n".encode()) + b"0000PACK"
    b = pkt(f"{OLD} {'3' * 40} refs/heads/main\0report-status\n".encode()) + b"0000PACK"
    ea, eb = _effect("POST", url, a), _effect("POST", url, b)
    assert ea.key != eb.key and ea.key == _effect("POST", url, a + b"more pack").key
    assert ea.shown["refs"] == [{"ref": "refs/heads/feature", "old": OLD, "new": NEW, "action": "update"}]
    assert ea.key != _effect("POST", "https://github.com/me/other.git/git-receive-pack", a).key
    assert _effect("POST", url, a[:20]).doubt
    assert _effect("POST", url, a, body_error="bad gzip").doubt


def test_effects_of_graphql_and_plain_requests():
    url = "https://api.github.com/graphql"
    e1 = _effect("POST", url, json.dumps({"query": "mutation A { addStar { x } }"}).encode(), "graphql-mutation")
    e2 = _effect("POST", url, json.dumps({"query": "mutation A { deleteRepo { x } }"}).encode(), "graphql-mutation")
    assert e1.key != e2.key and not e1.doubt
    assert _effect("POST", url, b"{nope", "graphql-mutation").doubt
    r1 = _effect("POST", "https://x.test/api/one", rule="")
    assert r1.key != _effect("POST", "https://x.test/api/two", rule="").key
    assert r1.key != _effect("POST", "https://x.test/api/one?force=1", rule="").key
    assert r1.key != _effect("PUT", "https://x.test/api/one", rule="").key
    assert r1.key == _effect("POST", "https://x.test/api/one", b"other body", rule="").key
    over = _effect("POST", "https://x.test/api/one", rule="", headers={"x-http-method-override": "DELETE"})
    assert over.key != r1.key and over.shown == {"method_override": ["DELETE"]}


# --- bodies --------------------------------------------------------------------------------

def test_bodies_past_the_cap_are_watched_or_doubted_where_the_rule_needs_more():
    big = b"x" * BODY_CAP
    p = pol(allow=["pypi.internal.test"])
    multipart = {"content-type": "multipart/form-data; boundary=b"}
    d = decide_request(p, req("POST", "https://pypi.internal.test/legacy/", big, body_complete=False,
                              headers=multipart))
    assert d.action == "allow" and d.watch.markers == (b":action", b"file_upload")
    assert d.watch.decision.rule == "preset:default/pypi-upload" and d.watch.decision.action == "deny"
    d = decide_request(p, req("POST", "https://pypi.internal.test/legacy/", big, body_complete=False,
                              headers={**multipart, "content-encoding": "gzip"}))
    assert d.rule == "preset:default/pypi-upload"                # encoded: cannot be scanned
    d = decide_request(p, req("POST", "https://pypi.internal.test/other", big, body_complete=False,
                              headers={"content-type": "application/octet-stream"}))
    assert d.action == "allow" and d.watch is None
    d = decide_request(p, req("POST", "https://pypi.internal.test/x", big, body_complete=True,
                              headers=multipart))
    assert d.watch is None


def test_marker_scan_sees_markers_split_across_chunks():
    from envgit.policy.netrequest import MarkerScan
    s = MarkerScan((b":action", b"file_upload"))
    assert not s.feed(b"...:act") and not s.feed(b"ion=...file_up")
    assert s.feed(b"load...")


def test_decode_is_bounded():
    from envgit.proxy import bodies
    bomb = gzip.compress(b"\0" * (64 * BODY_CAP))
    out, complete, err = bodies.decode(bomb, "gzip", True)
    assert len(out) == BODY_CAP and complete is False and err == ""
    out, complete, err = bodies.decode(gzip.compress(b"abc") + b"junk", "gzip", True)
    assert err
    out, complete, err = bodies.decode(gzip.compress(b"abc") + gzip.compress(b"def"), "gzip", True)
    assert err                                  # a second member: servers differ
    assert bodies.decode(zlib.compress(b"abc"), "deflate", True) == (b"abc", True, "")
    assert bodies.decode(b"abc", "compress", True)[2]


# --- upgrades ------------------------------------------------------------------------------

def test_upgrades_refused_on_judged_hosts_unless_the_policy_allows_websockets():
    ws = {"upgrade": "websocket", "connection": "Upgrade"}
    p = network_policy(["ws.example.test", "files.pythonhosted.org"], [{"preset": "default"}])
    d = decide_request(p, req("GET", "https://ws.example.test/socket", headers=ws))
    assert (d.action, d.rule) == ("deny", "builtin:upgrade") and "websocket: allow" in d.hint
    p2 = network_policy(["ws.example.test"], [{"preset": "default"}],
                        {"ws.example.test": {"websocket": "allow"}})
    assert decide_request(p2, req("GET", "https://ws.example.test/socket", headers=ws)).action == "allow"
    d = decide_request(p2, req("GET", "https://ws.example.test/x", headers={"upgrade": "tcp", "connection": "upgrade"}))
    assert d.rule == "builtin:upgrade"
    # a host no request-level rule applies to is as unjudged as a tunnel to it
    assert decide_request(p, req("GET", "http://files.pythonhosted.org/x", headers=ws)).action == "allow"


def test_websocket_key_in_the_schema(tmp_path):
    from envgit.policy import PolicyError, load_policy
    f = tmp_path / "envgit.yaml"
    f.write_text("version: 1\nnetwork:\n  allow: [ws.example.test]\n  l7:\n    ws.example.test: {websocket: allow}\n")
    assert load_policy(f).l7["ws.example.test"]["websocket"] == "allow"
    f.write_text("version: 1\nnetwork:\n  l7:\n    ws.example.test: {websocket: yes}\n")
    with pytest.raises(PolicyError):
        load_policy(f)


# --- what the gate remembers of an answer ------------------------------------------------------

def test_an_answer_covers_its_effect_and_allow_rule_its_rule_on_its_host_and_port(tmp_path):
    import asyncio

    from envgit.proxy import Gate
    asked, answers = [], ["allow", "allow-rule", "deny", "deny", "allow"]

    async def ask(step, q):
        asked.append((step, q["host"], q["port"]))
        return answers.pop(0), "tester", "test"

    gate = Gate(lambda: None, tmp_path, {}, lambda s, r: None, ask)
    d = Decision("ask", "preset:default/git-push", "x")
    gh, gl, gh2 = ({"host": "github.com", "port": 443}, {"host": "gitlab.com", "port": 443},
                   {"host": "github.com", "port": 8443})

    async def seq():
        out = []
        for step, effect, q in [(1, "a", gh), (1, "a", gh), (1, "b", gh), (1, "c", gh),
                                (1, "c", gl), (1, "c", gh2), (2, "a", gh)]:
            out.append((await gate.ask_once(step, ("git push", effect), q, d))[0])
        return out
    assert asyncio.run(seq()) == ["allow", "allow", "allow", "allow", "deny", "deny", "allow"]
    assert asked == [(1, "github.com", 443), (1, "github.com", 443), (1, "gitlab.com", 443),
                     (1, "github.com", 8443), (2, "github.com", 443)]
    gate.close_step(1)
    assert not [k for k in gate._answers if k[0] == 1]


# --- preset gaps: Hugging Face writes, GraphQL spellings and methods, NAT64 -----------------

def _decide(method, url, body=b"{}", headers=None):
    return decide_request(pol(allow=["huggingface.co", "hf.co", "api.github.com", "gitlab.com"]),
                          req(method, url, body, headers))


@pytest.mark.parametrize("method,url,rule", [
    ("POST", "https://huggingface.co/api/models/o/m/super-squash/main", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/models/o/m/discussions/1/merge", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/models/o/m/discussions", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/spaces/o/s/secrets", "huggingface-repo-write"),
    ("DELETE", "https://huggingface.co/api/spaces/o/s/secrets", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/spaces/o/s/hardware", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/spaces/o/s/restart", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/spaces/o/s/duplicate", "huggingface-repo-write"),
    ("PUT", "https://huggingface.co/api/datasets/o/d/settings", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/datasets/o/d/lfs-files/batch", "huggingface-repo-write"),
    ("DELETE", "https://huggingface.co/api/models/o/m/branch/dev", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/buckets/o/b/batch", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/repos/create", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/repos/move", "huggingface-repo-write"),
    ("PROPPATCH", "https://huggingface.co/api/models/o/m/settings", "huggingface-repo-write"),
    ("POST", "https://hf.co/api/models/o/m/super-squash/main", "huggingface-repo-write"),
    # paths-info is a read only where the path says paths-info as the server routes it
    ("POST", "https://huggingface.co/api/models/o/paths-info/super-squash/main", "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/models/o/m/paths-info/..%2Fsuper-squash/main", "huggingface-repo-write"),
    ("GET", "https://huggingface.co/api/models/o/m/xet-write-token/main", "huggingface-upload"),
    ("POST", "https://huggingface.co/o/m.git/info/lfs/objects/verify", "huggingface-lfs-write"),
    ("POST", "https://huggingface.co/api/complete_multipart?uploadId=1", "huggingface-lfs-write"),
])
def test_huggingface_writes_are_irreversible_whatever_the_endpoint(method, url, rule):
    d = _decide(method, url)
    assert (d.action, d.rule, d.irreversible) == ("deny", "preset:default/" + rule, True), (url, d)
    # a method override does not make a write a read
    if method != "GET":
        d = _decide("GET", url, headers={"x-http-method-override": method})
        assert d.action == "deny", (url, d)


@pytest.mark.parametrize("method,url,body", [
    ("GET", "https://huggingface.co/api/models/o/m", b""),
    ("GET", "https://huggingface.co/api/models/o/m/tree/main", b""),
    ("HEAD", "https://huggingface.co/api/models/o/m/revision/main", b""),
    ("GET", "https://huggingface.co/api/models/o/m/xet-read-token/main", b""),
    ("POST", "https://huggingface.co/api/models/o/m/paths-info/main", b"paths=a"),
    ("POST", "https://huggingface.co/api/datasets/o/d/paths-info/main", b"paths=a"),
    ("POST", "https://huggingface.co/api/models/bert-base-uncased/paths-info/main", b"paths=a"),
    ("POST", "https://huggingface.co/o/m.git/info/lfs/objects/batch",
     b'{"operation": "download", "objects": []}'),
    ("POST", "https://huggingface.co/o/m.git/git-upload-pack", b"0000"),
])
def test_huggingface_reads_stay_allowed(method, url, body):
    assert _decide(method, url, body).action == "allow", url


MUTATION = json.dumps({"query": "mutation { addStar(input: {}) { x } }"}).encode()
QUERY = json.dumps({"query": "{ viewer { login } }"}).encode()
GQL_JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("url,rule", [
    ("https://gitlab.com/api/graphql", "gitlab-graphql-mutation"),
    ("https://gitlab.com/api/graphql.json", "gitlab-graphql-mutation"),
    ("https://gitlab.com/api/graphql.xml", "gitlab-graphql-mutation"),
    ("https://gitlab.com/api/graphql/", "gitlab-graphql-mutation"),
    ("https://gitlab.com/api/graphql.json/", "gitlab-graphql-mutation"),
    ("https://gitlab.com/api/graphql%2Ejson", "gitlab-graphql-mutation"),
    ("https://gitlab.example.org/api/graphql.json", "gitlab-graphql-mutation"),
    ("https://api.github.com/graphql.json", "github-graphql-mutation"),
    ("https://api.github.com/graphql/", "github-graphql-mutation"),
])
def test_graphql_endpoints_with_a_format_suffix_are_judged_as_graphql(url, rule):
    p = pol(allow=["gitlab.com", "gitlab.example.org", "api.github.com"])
    d = decide_request(p, req("POST", url, MUTATION, GQL_JSON))
    assert (d.action, d.rule) == ("deny", "preset:default/" + rule), (url, d)
    assert decide_request(p, req("POST", url, QUERY, GQL_JSON)).action == "allow", url


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE", "PROPFIND", "OPTIONS"])
@pytest.mark.parametrize("url,rule", [
    ("https://api.github.com/graphql", "github-graphql-method"),
    ("https://api.github.com/graphql.json", "github-graphql-method"),
    ("https://gitlab.com/api/graphql", "gitlab-graphql-method"),
    ("https://gitlab.com/api/graphql.json/", "gitlab-graphql-method"),
])
def test_graphql_by_any_method_but_get_and_post_is_irreversible(method, url, rule):
    for body in (MUTATION, QUERY):
        d = _decide(method, url, body, GQL_JSON)
        assert (d.action, d.rule, d.irreversible) == ("deny", "preset:default/" + rule, True), (url, d)
    # nor through an override on a POST whose body is a query
    d = _decide("POST", url, QUERY, {**GQL_JSON, "x-http-method-override": method})
    assert (d.action, d.rule) == ("deny", "preset:default/" + rule), (url, d)
    # GET and POST keep being judged by operation
    assert _decide("POST", url, QUERY, GQL_JSON).action == "allow"
    assert _decide("GET", url + "?query=%7Bviewer%7Blogin%7D%7D", b"").action == "allow"


@pytest.mark.parametrize("addr", ["64:ff9b::7f00:1", "64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe",
                                  "64:ff9b::0.0.0.0", "64:ff9b::a00:1", "64:ff9b:1:7f00:0:100::",
                                  "64:ff9b:1::7f00:1", "::ffff:127.0.0.1"])
def test_nat64_addresses_are_judged_by_their_embedded_ipv4_address(addr):
    from envgit.policy.network import is_special, judge_address
    p = pol(allow=["*.example.test"])
    d = judge_address(p, "a.example.test", 443, addr)
    assert (d.action, d.rule) == ("deny", "builtin:resolved-address"), addr
    assert judge_address(pol(allow=["a.example.test"]), "a.example.test", 443, addr).action == "allow"
    assert is_special(addr) is not None


def test_nat64_of_public_and_metadata_addresses():
    from envgit.policy.network import is_special, judge_address
    p = pol(allow=["*.example.test"])
    for addr in ["64:ff9b::8.8.8.8", "64:ff9b::5db8:d822", "2606:4700::1"]:      # DNS64 networks
        assert judge_address(p, "a.example.test", 443, addr).action == "allow", addr
    assert is_special("64:ff9b::169.254.169.254") == "a cloud metadata address"
    assert is_special("[64:ff9b::a9fe:a9fe]") == "a cloud metadata address"
