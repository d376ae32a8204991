"""Red team 13: a credential narrowed to paths goes out on paths outside them.

`credentials.NAME.paths` narrows where the real value may go. It is matched with the request
rules' URL globs, which are case-insensitive (network.url_glob: right for a rule that denies,
since it must catch every spelling a server may read; wrong for a narrowing that allows, since
a case-sensitive server reads another resource). S3 object keys, most git hosts' repository
files, Artifactory and Nexus paths are case-sensitive: `/bucket/public/**` lets the real key go
to `/bucket/PUBLIC/…` (another prefix), `/org/repo.git/**` to `/ORG/REPO.git/…`. The oracle is the
credential host's record: the real token arrived on a path the credential does not name."""

import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

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
