"""Red team 13b: a credential narrowed to paths goes out on a request the server routes to
another path. As with the method-override headers (which the gate reads), some servers take
the path from a header: `X-Original-URL` / `X-Rewrite-URL` (IIS URL Rewrite and ARR behind it,
Zend Framework 1, Symfony before 2018's CVE-2018-14773, Drupal 7 on IIS). The gate judges the
request line's path only and swaps the real token in. The oracle is the credential host's
record: the real token arrived on a request naming a path outside the credential's `paths`.
Runs as root and as an unprivileged user."""

import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


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
