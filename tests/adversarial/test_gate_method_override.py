"""Red team, round 14: `network.l7[host].methods` reads a method-override HEADER but not a
form's `_method` field, which Rails (Rack::MethodOverride), Laravel and Symfony act on.

The gate knows the field (proxy/credentials.py `_methods` reads it for credentials, and the
question of an ask carries it), but `decide_request` builds the set of methods a server may
act on from the request line and the override headers only. A host whose l7 entry allows
GET and POST receives a POST whose form says `_method=DELETE`, and deletes.

Oracle: the server (acting as Rack does) records the DELETE it performed; the header form
of the same override is refused (the control)."""

import shutil
from urllib.parse import parse_qs

import pytest

from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

CURL = "curl -s -o /dev/null -w '%{http_code}\\n'"
ACTED: list = []


def _rack(method, path, headers, body):
    acted = method
    if method == "POST":
        m = headers.get("x-http-method-override")
        if "x-www-form-urlencoded" in (headers.get("content-type") or ""):
            m = (parse_qs((body or b"").decode("latin-1")).get("_method") or [m])[0]
        acted = (m or method).upper()
    ACTED.append((acted, path))
    return 200, {"Content-Type": "application/json"}, b"{}"


@pytest.fixture
def world():
    ACTED.clear()
    with servers(_rack) as (git, stub):
        yield git, stub


def test_l7_methods_see_a_forms_method_override(attacker, world):
    git, stub = world
    api = hostport(stub, "stub.example.test")
    netproject(attacker, git, stub, f"  l7:\n    \"{api}\": {{methods: [GET, POST]}}\n")
    post = f"{CURL} -X POST https://{api}/items/1"
    r = attacker.run(f"{post}; {post} -H 'X-HTTP-Method-Override: DELETE'; "
                     f"{post} -H 'Content-Type: application/x-www-form-urlencoded' --data-binary _method=DELETE",
                     timeout=120)
    codes = r.stdout.split()
    assert codes[:2] == ["200", "403"], (codes, r.stderr)      # POST allowed; header override refused
    assert [a for a in ACTED if a[0] == "DELETE"] == [] and codes[2] != "200", (
        f"network.l7 allows GET and POST only, yet a form's _method=DELETE reached the server: {ACTED}, codes {codes}")


def test_an_irreversible_delete_rule_sees_a_forms_method_override(attacker, world):
    """The same gap in `irreversible:` rules: a rule denying DELETE on /items/** does not see
    a POST whose form says _method=DELETE."""
    git, stub = world
    api = hostport(stub, "stub.example.test")
    netproject(attacker, git, stub, "irreversible:\n  - net: {host: \"stub.example.test\", method: DELETE, "
               "path: \"/items/**\"}\n    action: deny\n    name: no-deletes\n")
    post = f"{CURL} -X POST https://{api}/items/1"
    r = attacker.run(f"{post} -H 'X-HTTP-Method-Override: DELETE'; "
                     f"{post} -H 'Content-Type: application/x-www-form-urlencoded' --data-binary _method=DELETE",
                     timeout=120)
    codes = r.stdout.split()
    assert codes[0] == "403", (codes, r.stderr)                 # the header form is denied
    assert [a for a in ACTED if a[0] == "DELETE"] == [] and codes[1] != "200", (
        f"rule no-deletes denies DELETE /items/**, yet a form's _method=DELETE reached the server: {ACTED}, "
        f"codes {codes}")
