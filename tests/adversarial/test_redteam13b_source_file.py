"""Red team 13b: a credential's `file:` source is readable from inside the step.

The daemon reads the real value from the file the policy names; the sandbox's system view is
masked only where others cannot read (as root) and by the default deny list. A token file
outside the home that others can read (Docker's and Compose's secrets in /run/secrets are
0444, Kubernetes' service-account token 0644, a team's /opt/<app>/token, /etc/<tool>/token)
is there in the step, though envgit knows its path (`envgit doctor` says "resolves") and
promises the real value is never in a step's files. The oracle is the canary (the file's
content) in the step's output. Runs as root and as an unprivileged user."""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


@pytest.fixture
def token_file():
    d = Path("/opt") / f"envgit-rt13b-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    os.chmod(d, 0o755)
    (d / "token").write_text(CANARY + "\n")
    os.chmod(d / "token", 0o444)            # as Docker mounts a secret
    try:
        yield d / "token"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_credentials_source_file_is_not_readable_inside(attacker, token_file):
    with servers() as (git, stub):
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ file: {token_file} }}\n    hosts: [\"{api}\"]\n")
        r = attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $GITHUB_TOKEN\" https://{api}/; "
                         f"cat {token_file}; echo done")
        assert "done" in r.stdout, r.stdout + r.stderr
        assert [q for q in stub.requests if q["headers"].get("authorization") == f"Bearer {CANARY}"], \
            "the swap did not happen"
        assert CANARY not in r.stdout + r.stderr, \
            f"the credential's source file {token_file} is readable inside the step"
