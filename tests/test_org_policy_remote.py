"""The organisation policy as one object in a remote's bucket (`envgit remote add --policy`):
a real S3 server on 127.0.0.1 (tests/s3server.py: `rclone serve s3`), real `envgit remote`,
`push`, `policy` and real steps. The object binds every project; a push fetches it again; an
invalid object never replaces the last good copy."""

import os

import pytest

from conftest import CANARY
from s3server import S3Server

pytestmark = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml"),
                                reason="a real /etc/envgit/policy.yaml takes precedence here")

ORG = 'version: 1\nfilesystem:\n  deny_read:\n    - "**/*.key"\n'


@pytest.fixture
def world(proj, tmp_path):
    server = S3Server(tmp_path / "s3")
    proj.env.update(server.env)
    proj.env.pop("ENVGIT_ORG_POLICY", None)
    obj = server.root / server.bucket / "envgit" / "org" / "policy.yaml"
    obj.parent.mkdir(parents=True)
    obj.write_text(ORG)
    (proj.root / "prod.key").write_text(CANARY + "\n")
    try:
        yield proj, server, obj
    finally:
        proj.stop()
        server.stop()


def test_a_bucket_object_binds_the_project_and_push_refreshes_it(world):
    proj, server, obj = world
    url = f"s3://{server.bucket}/envgit/org/policy.yaml"
    r = proj.envgit("remote", "add", "ci", server.url(), "--endpoint", server.endpoint,
                    "--policy", "org/policy.yaml")
    assert r.returncode == 0 and f"the organisation policy is now {url}" in r.stderr, r.stderr
    r = proj.run("cat prod.key; echo done")
    assert "done" in r.stdout and CANARY not in r.stdout, r.stdout + r.stderr
    # a loosening project names the object on the bucket and its line
    proj.write_policy("version: 1\nfilesystem:\n  allow_read: [prod.key]\n")
    r = proj.envgit("policy", "check")
    assert r.returncode != 0 and f"which {url}:4 denies" in r.stderr, r.stderr
    proj.write_policy("version: 1\n")
    show = proj.envgit("policy", "show", check=True).stdout
    assert f"loaded under the organisation policy {url}" in show
    assert any(ln.strip().startswith("- **/*.key") and ln.endswith(f"# {url}:4") for ln in show.splitlines()), show
    # an invalid object in the bucket: the push says so, the last good copy stays in force
    obj.write_text("version: 1\nfilesystem:\n  deny_reed: []\n")
    r = proj.envgit("push", "ci")
    assert r.returncode == 0 and "organisation policy was not updated" in r.stderr, r.stderr
    assert f"{url}:3:" in r.stderr, r.stderr
    r = proj.run("cat prod.key; echo still")
    assert "still" in r.stdout and CANARY not in r.stdout, r.stdout
    # the organisation lifts the deny: the next push fetches it, the running daemon applies it
    obj.write_text("version: 1\n")
    r = proj.envgit("push", "ci")
    assert r.returncode == 0 and "the organisation policy is now" in r.stderr, r.stderr
    r = proj.run("cat prod.key")
    assert CANARY in r.stdout, r.stdout + r.stderr
    # `remote set --policy ''` stops using it
    obj.write_text(ORG)
    proj.envgit("remote", "set", "ci", "--policy", "", check=True)
    assert "organisation" not in proj.envgit("policy", "show", check=True).stdout


def test_the_fetched_copy_must_stay_the_persons_own(world):
    proj, server, obj = world
    proj.envgit("remote", "add", "ci", server.url(), "--endpoint", server.endpoint,
                "--policy", "org/policy.yaml", check=True)
    copy = proj.home / ".config" / "envgit" / "org" / "policy.yaml"
    assert copy.read_text() == ORG
    os.chmod(copy, 0o666)                       # anyone could rewrite it now: refused
    r = proj.run("echo should-not-run")
    assert r.returncode == 125 and "should-not-run" not in r.stdout, r.stdout + r.stderr
    assert "writable by everyone" in r.stderr, r.stderr
    os.chmod(copy, 0o644)
    # a project cannot make the copy's directory writable to its steps
    proj.write_policy('version: 1\nfilesystem:\n  allow_write: [".", "~/.config"]\n')
    r = proj.run(f"printf 'version: 1\\n' > {copy}; echo ran")
    assert "ran" not in r.stdout and "holds the organisation policy" in r.stderr, r.stdout + r.stderr
    assert copy.read_text() == ORG
    # the copy gone but the source kept: every step refused, never quietly unbound
    copy.unlink()
    proj.write_policy("version: 1\n")
    r = proj.run("echo should-not-run")
    assert r.returncode == 125 and "is not fetched" in r.stderr, r.stderr
    # an object that is not there: `remote set --policy` refuses, nothing changes
    r = proj.envgit("remote", "set", "ci", "--policy", "org/nosuch.yaml")
    assert r.returncode != 0 and "no such object" in r.stderr, r.stderr
