"""A symlink a step leaves on a protected or read-denied route (red team 12 found `.envrc`):
bwrap follows a link at a bind's destination and creates what is missing there, so a dangling
link (or a link to a directory where a file placeholder is bound) used to fail the start of
every later step. Each link is marked `escape-route-written` on the step that made it, later
steps start, and a link to an absent file in the project is a route too: the step that creates
what it leads to is marked. Oracle: later steps' output and exit code, and the marks."""

import json
import os

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "bwrap follows a link at a bind's destination to make its mount point: as a non-root user it does "
    "so in a user namespace, under DAC, and later steps must start there too")


def show(a, step):
    return json.loads(a.envgit("show", str(step), "--json", check=True).stdout)


# .envrc and .env are read-denied by name too; .npmrc and .mcp.json are routes only
@pytest.mark.parametrize("route", [".envrc", ".env", ".npmrc", ".mcp.json"])
def test_a_dangling_link_on_a_route_is_marked_and_later_steps_start(attacker, route):
    a = attacker
    r = a.run(f"ln -s /nonexistent-{CANARY}/x {route}")                 # step 1
    assert r.returncode == 0, r.stderr
    s = show(a, 1)
    assert "escape-route-written" in s["marks"] and route in s["escape_routes"], s
    for _ in range(2):
        r = a.run("echo alive")
        assert r.returncode == 0 and r.stdout == "alive\n", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("name", [".git-credentials", "id_rsa", "sub/.netrc"])
def test_a_dangling_link_on_a_read_denied_name_does_not_stop_later_steps(attacker, name):
    a = attacker
    r = a.run(f"mkdir -p sub && ln -s /nonexistent-{CANARY}/x {name}")
    assert r.returncode == 0, r.stderr
    r = a.run("echo alive")
    assert r.returncode == 0 and r.stdout == "alive\n", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("route", [".envrc", ".env"])
def test_a_link_to_a_directory_on_a_route_does_not_stop_later_steps(attacker, route):
    a = attacker
    r = a.run(f"mkdir -p d && echo {CANARY} > d/f && ln -s d {route}")
    assert r.returncode == 0, r.stderr
    r = a.run("echo alive")
    assert r.returncode == 0 and r.stdout == "alive\n", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("route", [".envrc"])   # .npmrc, .mcp.json, .husky, .codex, ... held
def test_a_dangling_symlink_on_a_protected_route_does_not_stop_later_steps(attacker, route):
    """The red team's case (round 12): a dangling symlink where a protected escape route goes
    (.envrc; the other routes tried, .npmrc .mcp.json .husky .codex .claude/settings.json ...,
    held). envgit protects each existing route with a read-only bind of the path onto itself;
    bwrap followed the symlink to create the mount point, could not, and every later step of
    the project failed to start (exit 125, "the sandbox did not start ... `envgit doctor`
    checks the set-up") until the person found and removed the link."""
    r = attacker.run(f"ln -s /nonexistent-{CANARY}/x {route}")
    assert r.returncode == 0, r.stderr
    r = attacker.run("echo alive")
    assert r.returncode == 0 and r.stdout == "alive\n", (r.returncode, r.stdout, r.stderr)


def test_filling_what_a_route_link_leads_to_is_marked(attacker):
    """`.envrc -> sub/x`, absent: nothing to bind read-only. The link a step makes is taken
    back; where the policy lets steps make it (escape_routes.allow), the step that then writes
    sub/x (what direnv would run) is marked for .envrc like any change to it."""
    a = attacker
    r = a.run("ln -s sub/x .envrc")                                      # step 1, taken back (2)
    assert r.returncode == 0 and not os.path.lexists(a.root / ".envrc"), r.stderr
    a.write_policy('version: 1\nescape_routes:\n  allow: [".envrc"]\n')
    assert a.run("ln -s sub/x .envrc").returncode == 0                   # step 3
    r = a.run("mkdir -p sub && echo 'touch $HOME/pwned' > sub/x")       # step 4
    assert r.returncode == 0, r.stderr
    s = show(a, 4)
    assert "escape-route-written" in s["marks"] and ".envrc" in s["escape_routes"], s
    assert a.run("echo alive").stdout == "alive\n"
