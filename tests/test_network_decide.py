"""decide_request, judge_connect and needs_interception: pure, no network."""

import json

import pytest

from conftest import network_policy
from envgit.policy import PolicyError
from envgit.policy.graphql import classify
from envgit.policy.netpresets import PRESET_NAMES
from envgit.policy.network import Request, decide_request, judge_connect, needs_interception


def pol(allow=("github.com", "api.github.com", "uploads.github.com", "registry.npmjs.org",
               "upload.pypi.org", "crates.io", "ghcr.io", "gitlab.com", "huggingface.co",
               "git.example.test:8443", "files.pythonhosted.org", "npm.internal:4873"),
        l7=None, irreversible=({"preset": "default"},)):
    return network_policy(allow, irreversible, l7)


def req(method, url, body=None, headers=None, tunnel=True, sni=None, **kw):
    scheme, rest = url.split("://")
    authority, _, path = rest.partition("/")
    path, _, query = ("/" + path).partition("?")
    host, _, port = authority.partition(":")
    port = int(port) if port else (443 if scheme == "https" else 80)
    h = {"host": authority}
    h.update(headers or {})
    return Request(scheme, host, port, method, path, query, h, body,
                   connect_host=host if tunnel and scheme == "https" else None,
                   connect_port=port if tunnel and scheme == "https" else None,
                   sni=sni, **kw)


def decide(method, url, body=None, policy=None, **kw):
    return decide_request(policy or pol(), req(method, url, body, **kw))


# --- hosts ---------------------------------------------------------------------------------

def test_hosts_allowed_denied_and_default_ports():
    p = pol(allow=["example.com", "*.corp.test", "svc.test:8443"])
    assert judge_connect(p, "example.com", 443).action == "allow"
    assert decide("GET", "http://example.com/", policy=p).action == "allow"
    assert judge_connect(p, "example.com", 8443).action == "deny"          # bare host: 443/80
    assert judge_connect(p, "a.b.corp.test", 443).action == "allow"
    assert judge_connect(p, "corp.test", 443).action == "deny"             # not the domain itself
    assert judge_connect(p, "svc.test", 8443).action == "allow"
    assert judge_connect(p, "svc.test", 443).action == "deny"
    d = judge_connect(p, "evil.test", 443)
    assert (d.action, d.rule) == ("deny", "network.allow") and "network.allow" in d.hint
    assert judge_connect(p, "EXAMPLE.com.", 443).action == "allow"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1", "2130706433", "0x7f.0.0.1", "10.0.0.5",
                                  "169.254.169.254", "fd00:ec2::254", "::1", "[::1]",
                                  "metadata.google.internal", "localhost", "x.localhost"])
def test_special_addresses_denied_even_by_wildcards(host):
    d = judge_connect(pol(allow=["*.internal", "*.localhost", "github.com"]), host, 443)
    assert (d.action, d.rule) == ("deny", "builtin:special-address")


def test_special_address_allowed_when_named_exactly():
    assert judge_connect(pol(allow=["127.0.0.1:8443"]), "127.0.0.1", 8443).action == "allow"
    assert judge_connect(pol(allow=["[::1]:8443"]), "::1", 8443).action == "allow"


@pytest.mark.parametrize("host,port", [("github.com", 22), ("ssh.github.com", 443),
                                       ("altssh.gitlab.com", 443)])
def test_ssh_refused_outright(host, port):
    d = judge_connect(pol(allow=["github.com:22", "ssh.github.com", "altssh.gitlab.com"]), host, port)
    assert (d.action, d.rule) == ("deny", "builtin:ssh") and "https remote" in d.hint


def test_interception_only_where_a_rule_can_apply():
    p = pol()
    assert judge_connect(p, "github.com", 443).intercept                   # git push: any git host
    assert not judge_connect(p, "files.pythonhosted.org", 443).intercept   # a download host
    bare = pol(allow=["example.com", "api.example.com"], irreversible=[],
               l7={"api.example.com": {"methods": ["GET"]}})
    assert not needs_interception(bare, "example.com", 443)
    assert needs_interception(bare, "api.example.com", 443)
    assert needs_interception(bare, "example.com", 443, sni="other.test")  # to deny readably


# --- tunnels -------------------------------------------------------------------------------

def test_authority_must_match_tunnel():
    r = Request("https", "evil.test", 443, "GET", "/", connect_host="github.com", connect_port=443)
    assert decide_request(pol(), r).rule == "builtin:authority-mismatch"
    r = Request("https", "github.com", 443, "GET", "/", headers={"host": "evil.test"},
                connect_host="github.com", connect_port=443)
    assert decide_request(pol(), r).rule == "builtin:authority-mismatch"
    assert decide("GET", "https://github.com/x", sni="evil.test").rule == "builtin:authority-mismatch"
    r = Request("http", "github.com", 80, "GET", "/", headers={"host": "api.github.com"})
    assert decide_request(pol(), r).action == "deny"
    r = Request("https", "github.com", 443, "GET", "/", headers={":authority": "github.com:443"},
                connect_host="github.com", connect_port=443, sni="github.com")
    assert decide_request(pol(), r).action == "allow"


# --- git -----------------------------------------------------------------------------------

def test_git_push_denied_fetch_and_advert_allowed():
    base = "https://git.example.test:8443/repo.git"
    assert decide("GET", base + "/info/refs?service=git-upload-pack").action == "allow"
    assert decide("POST", base + "/git-upload-pack", b"0032want ...").action == "allow"
    assert decide("GET", base + "/info/refs?service=git-receive-pack").action == "allow"
    d = decide("POST", base + "/git-receive-pack", b"00a0" + b"x" * 156)
    assert (d.action, d.rule, d.kind, d.irreversible) == \
        ("deny", "preset:default/git-push", "git push", True)
    assert d.reason == "git push is irreversible; rule preset:default/git-push"
    # the 4-byte probe before a large push changes nothing and is not asked about
    assert decide("POST", base + "/git-receive-pack", b"0000").action == "allow"


@pytest.mark.parametrize("path", ["/repo.git/git-receive-pack", "/repo.git/git%2Dreceive-pack",
                                  "/repo.git/GIT-RECEIVE-PACK", "/x/../repo.git/git-receive-pack",
                                  "//repo.git//git-receive-pack", "/repo.git/git-receive-pack/"])
def test_git_push_spellings(path):
    assert decide("POST", "https://github.com" + path, b"x").rule == "preset:default/git-push"


def test_git_push_method_override_and_undecodable_body():
    d = decide("GET", "https://github.com/r.git/git-receive-pack",
               headers={"x-http-method-override": "POST"})
    assert d.action == "deny"
    r = req("POST", "https://github.com/r.git/git-receive-pack", None, body_error="bad gzip")
    assert decide_request(pol(), r).action == "deny"


def test_webdav_push():
    assert decide("MKCOL", "https://github.com/r.git/objects/ab/").rule == "preset:default/git-push-webdav"


def test_overrides_disable_and_preset_action():
    url, body = "https://github.com/r.git/git-receive-pack", b"x"
    assert decide("POST", url, body, pol(irreversible=[{"preset": "default"},
                                                       {"rule": "git-push", "action": "allow"}])).action == "allow"
    d = decide("POST", url, body, pol(irreversible=[{"rule": "preset:default/git-push", "action": "ask"}]))
    assert (d.action, d.irreversible) == ("ask", True)
    assert decide("POST", url, body, pol(irreversible=[{"preset": "default", "action": "ask"}])).action == "ask"
    d = decide("POST", url, body, pol(irreversible=[{"preset": "default", "disable": ["git-push"]}]))
    assert (d.action, d.irreversible) == ("allow", False)
    assert decide("POST", url, body, pol(irreversible=[])).action == "allow"


def test_user_rule_wins_over_preset_and_l7():
    p = pol(l7={"api.github.com": {"methods": ["GET"]}},
            irreversible=[{"preset": "default"},
                          {"net": {"host": "api.github.com", "method": "POST",
                                   "path": "/repos/*/*/issues"}, "action": "ask"}])
    d = decide("POST", "https://api.github.com/repos/me/app/issues", b"{}", p)
    assert (d.action, d.rule) == ("ask", "irreversible[1]")
    d = decide("POST", "https://api.github.com/repos/me/app/pulls", b"{}", p)
    assert (d.action, d.rule) == ("deny", "preset:default/github-rest-write")
    d = decide("GET", "https://api.github.com/repos/me/app", policy=p)
    assert (d.action, d.rule) == ("allow", "network.l7[api.github.com]")


def test_l7_methods_and_paths():
    p = pol(allow=["api.example.com"], irreversible=[],
            l7={"api.example.com": {"methods": ["GET", "POST"], "paths": ["/v1/**"]}})
    assert decide("GET", "https://api.example.com/v1/x", policy=p).action == "allow"
    assert decide("DELETE", "https://api.example.com/v1/x", policy=p).rule == "network.l7[api.example.com]"
    assert decide("GET", "https://api.example.com/v2/x", policy=p).action == "deny"
    assert decide("GET", "https://api.example.com/v1/../v2/x", policy=p).action == "deny"
    assert decide("GET", "https://api.example.com/v1/x", policy=p,
                  headers={"x-http-method-override": "DELETE"}).action == "deny"
    # a key without a port applies on whatever port the host is allowed on
    p = pol(allow=["api.example.com:8443"], irreversible=[], l7={"api.example.com": {"methods": ["GET"]}})
    assert needs_interception(p, "api.example.com", 8443)
    assert decide("POST", "https://api.example.com:8443/v1/x", policy=p).rule == "network.l7[api.example.com]"


# --- registries and forges -------------------------------------------------------------------

@pytest.mark.parametrize("method,url,headers,rule", [
    ("PUT", "https://registry.npmjs.org/tiny-pkg", {}, "npm-publish"),
    ("PUT", "https://registry.npmjs.org/@me%2ftiny", {}, "npm-publish"),
    ("POST", "https://registry.npmjs.org/-/stage/package/tiny-pkg", {}, "npm-publish"),
    ("DELETE", "https://registry.npmjs.org/tiny-pkg/-rev/3-abc", {}, "npm-unpublish"),
    ("PUT", "https://registry.npmjs.org/-/package/tiny-pkg/dist-tags/beta", {}, "npm-dist-tag"),
    ("DELETE", "https://registry.npmjs.org/-/package/@me%2ftiny/dist-tags/beta", {}, "npm-dist-tag"),
    ("PUT", "https://registry.npmjs.org/tiny-pkg", {"npm-command": "deprecate"}, "npm-deprecate"),
    ("PUT", "https://npm.internal:4873/tiny-pkg", {"npm-command": "publish"}, "npm-client-write"),
    ("PUT", "https://crates.io/api/v1/crates/new", {}, "cargo-publish"),
    ("DELETE", "https://crates.io/api/v1/crates/foo/1.0.0/yank", {}, "cargo-yank"),
    ("PUT", "https://crates.io/api/v1/crates/foo/owners", {}, "cargo-owners"),
    ("POST", "https://ghcr.io/v2/me/img/blobs/uploads/", {}, "oci-push"),
    ("PATCH", "https://ghcr.io/v2/me/img/blobs/uploads/123-abc", {}, "oci-push"),
    ("PUT", "https://ghcr.io/v2/me/img/manifests/latest", {}, "oci-push"),
    ("DELETE", "https://ghcr.io/v2/me/img/manifests/sha256:abc", {}, "oci-delete"),
    ("POST", "https://api.github.com/repos/me/app/issues", {}, "github-rest-write"),
    ("DELETE", "https://api.github.com/repos/me/app", {}, "github-rest-write"),
    ("POST", "https://uploads.github.com/repos/me/app/releases/1/assets?name=x", {}, "github-rest-write"),
    ("PUT", "https://gitlab.com/api/v4/projects/1/repository/files/x", {}, "gitlab-rest-write"),
    ("POST", "https://huggingface.co/api/repos/create", {}, "huggingface-repo-write"),
    ("DELETE", "https://huggingface.co/api/repos/delete", {}, "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/models/me/m/preupload/main", {}, "huggingface-repo-write"),
    ("POST", "https://huggingface.co/api/datasets/me/d/commit/main", {}, "huggingface-repo-write"),
])
def test_preset_signatures(method, url, headers, rule):
    d = decide(method, url, b"{}", headers=headers)
    assert (d.action, d.rule, d.irreversible) == ("deny", "preset:default/" + rule, True), d


@pytest.mark.parametrize("method,url", [
    ("GET", "https://registry.npmjs.org/tiny-pkg"),
    ("POST", "https://registry.npmjs.org/-/npm/v1/security/advisories/bulk"),   # npm audit
    ("GET", "https://crates.io/api/v1/crates/foo"),
    ("GET", "https://ghcr.io/v2/me/img/manifests/latest"),
    ("HEAD", "https://ghcr.io/v2/me/img/blobs/sha256:abc"),
    ("GET", "https://api.github.com/repos/me/app"),
    ("GET", "https://gitlab.com/api/v4/projects/1"),
    ("POST", "https://huggingface.co/api/models/me/m/paths-info/main"),
])
def test_reads_stay_allowed(method, url):
    assert decide(method, url, b"{}").action == "allow"


def twine_body(action="file_upload"):
    b = "----boundary"
    parts = [(":action", action), ("protocol_version", "1"), ("name", "tiny"), ("version", "0.1")]
    out = "".join(f"--{b}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n" for k, v in parts)
    out += f"--{b}\r\nContent-Disposition: form-data; name=\"content\"; filename=\"tiny-0.1.tar.gz\"\r\n" \
           f"Content-Type: application/octet-stream\r\n\r\n\x1f\x8b...\r\n--{b}--\r\n"
    return out.encode(), {"content-type": f"multipart/form-data; boundary={b}"}


def test_pypi_upload_on_the_upload_host_and_on_any_host():
    body, h = twine_body()
    d = decide("POST", "https://upload.pypi.org/legacy/", body, headers=h)
    assert d.rule == "preset:default/pypi-upload" and d.kind == "PyPI upload"
    d = decide("POST", "https://git.example.test:8443/simple/", body, headers=h)   # a private index
    assert d.rule == "preset:default/pypi-upload"
    assert decide("POST", "https://git.example.test:8443/other", b"{}").action == "allow"


# --- GraphQL -------------------------------------------------------------------------------

GQL = "https://api.github.com/graphql"


def gql(doc, **extra):
    return json.dumps({"query": doc, **extra}).encode()


@pytest.mark.parametrize("body", [
    gql("mutation { addStar(input:{starrableId:\"x\"}) { clientMutationId } }"),
    gql("# just a comment: query {\nmutation M { addStar(input:{}) { x } }"),
    gql("query A { viewer { login } } mutation B { addStar(input:{}) { x } }", operationName="B"),
    gql("query A { viewer { login } } mutation B { addStar(input:{}) { x } }", operationName="A"),
    json.dumps([{"query": "{ viewer { login } }"}, {"query": "mutation { a }"}]).encode(),
    json.dumps({"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "ab" * 32}}}).encode(),
    json.dumps({"id": "stored-op-7", "variables": {}}).encode(),
    gql("{ viewer { login } }", extensions={"persistedQuery": {"version": 1, "sha256Hash": "00" * 32}}),
    b"not json",
    gql("mutation {"),
])
def test_graphql_mutations_and_unknowns_denied(body):
    d = decide("POST", GQL, body, headers={"content-type": "application/json"})
    assert (d.action, d.rule) == ("deny", "preset:default/github-graphql-mutation"), body


def test_graphql_queries_allowed():
    for body in [gql("query { viewer { login } }"), gql("{ viewer { login } }"),
                 gql("# mutation {\n{ viewer { login } }"),
                 gql('{ search(query: "mutation { x }") { n } }'),
                 json.dumps([{"query": "{ a }"}, {"query": "query Q { b }"}]).encode()]:
        assert decide("POST", GQL, body).action == "allow", body


def test_graphql_classify_forms():
    assert classify(b"mutation { a }", "application/graphql") == "mutation"
    assert classify(b"subscription { a }", "application/graphql") == "subscription"
    assert classify(None, "", "query=mutation%20%7B%20a%20%7D") == "mutation"
    assert classify(b"query=%7B+a+%7D", "application/x-www-form-urlencoded") == "query"
    assert classify(b"fragment F on X { a }", "application/graphql") == "unknown"
    assert classify(b"[]", "application/json") == "unknown"


def test_gitlab_graphql():
    d = decide("POST", "https://gitlab.com/api/graphql", gql("mutation { createIssue(input:{}) { x } }"))
    assert d.rule == "preset:default/gitlab-graphql-mutation"
    assert decide("POST", "https://gitlab.com/api/graphql", gql("{ currentUser { id } }")).action == "allow"


def test_user_graphql_body_rule():
    p = pol(allow=["gql.example.test"], irreversible=[
        {"net": {"host": "gql.example.test", "path": "/api"}, "body": {"graphql": "mutation"},
         "action": "ask", "name": "example-mutation"}])
    d = decide("POST", "https://gql.example.test/api", gql("mutation { x }"), p)
    assert (d.action, d.rule, d.kind) == ("ask", "example-mutation", "example-mutation")
    assert decide("POST", "https://gql.example.test/api", gql("{ x }"), p).action == "allow"


# --- schema --------------------------------------------------------------------------------

def test_schema_rejects_unknown_preset_rule(tmp_path):
    from envgit.policy import load_policy
    f = tmp_path / "envgit.yaml"
    f.write_text("version: 1\nirreversible:\n  - preset: default\n    disable: [git-psh]\n")
    with pytest.raises(PolicyError, match="git-push"):
        load_policy(f)
    f.write_text("version: 1\nirreversible:\n  - rule: preset:default/npm-publish\n    action: ask\n")
    assert load_policy(f).irreversible == [{"rule": "preset:default/npm-publish", "action": "ask"}]
    assert "git-push" in PRESET_NAMES


def test_resolved_address_of_an_allowed_name():
    from envgit.policy.network import judge_address
    p = pol(allow=["*.example.test", "db.corp.test"])
    assert judge_address(p, "a.example.test", 443, "93.184.216.34").action == "allow"
    assert judge_address(p, "a.example.test", 443, "10.1.2.3").action == "allow"      # a company network
    for addr in ["127.0.0.1", "169.254.169.254", "::1", "fe80::1", "::ffff:127.0.0.1", "0.0.0.0"]:
        d = judge_address(p, "a.example.test", 443, addr)
        assert (d.action, d.rule) == ("deny", "builtin:resolved-address"), addr
    assert judge_address(pol(allow=["db.corp.test"]), "db.corp.test", 443, "127.0.0.1").action == "allow"
