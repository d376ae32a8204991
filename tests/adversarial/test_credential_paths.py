"""Issue 13: a credential narrowed to paths (`credentials.NAME.paths`) goes only on requests a
server routes to one of them. The oracle is the credential host's record: the real token must
not arrive on a path the credential does not name, and it does arrive within its paths.

Red team 13: the narrowing was matched with the request rules' URL globs, which are
case-insensitive (netrules.url_glob: right for a rule that denies, since it must catch every
spelling a server may read; wrong for a narrowing that allows, since a case-sensitive server
reads another resource). S3 object keys, most git hosts' repository files, Artifactory and
Nexus paths are case-sensitive: `/bucket/public/**` let the real key go to `/bucket/PUBLIC/…`
(another prefix), `/org/repo.git/**` to `/ORG/REPO.git/…`.

Red team 13b: some servers take the path from a header, as others take the method from the
override headers (which the gate reads): `X-Original-URL` / `X-Rewrite-URL` (IIS URL Rewrite
and ARR behind it, Zend Framework 1, Symfony before 2018's CVE-2018-14773, Drupal 7 on IIS).
The gate judged the request line's path only and swapped the real token in."""

import shutil

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


@pytest.mark.parametrize("path", ["/bucket/PUBLIC/secret.txt", "/BUCKET/public/x"])
def test_paths_narrowing_is_exact_about_case(attacker, path):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    paths: [\"/bucket/public/**\"]\n")
        # within its paths: the real value goes
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" https://{api}/bucket/public/a")
        assert [q for q in stub.requests if q["headers"].get("authorization") == f"Bearer {CANARY}"]
        stub.requests.clear()
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" https://{api}{path}")
        got = [q["path"] for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        assert not got, f"the real token went to {got[0]}, outside paths [/bucket/public/**]"


@pytest.mark.parametrize("header", ["X-Original-URL", "X-Rewrite-URL"])
def test_a_rewrite_header_does_not_take_the_credential_past_its_paths(attacker, header):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    paths: [\"/myorg/**\"]\n")
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" https://{api}/other/x")
        assert not [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" https://{api}/myorg/x")
        assert [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        stub.requests.clear()
        attacker.run(f"curl -s -o /dev/null -H \"{header}: /other/admin\" "
                     f"-H \"Authorization: Bearer $MY_TOKEN\" https://{api}/myorg/x")
        used = [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")
                and q["headers"].get(header.lower()) == "/other/admin"]
        assert not used, f"the real token went out on a request the server routes to /other/admin ({header})"
