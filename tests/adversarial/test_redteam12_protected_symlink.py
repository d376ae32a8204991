"""Red team 12: a step leaves a dangling symlink where a protected escape route goes (.envrc;
the other routes tried, .npmrc .mcp.json .husky .codex .claude/settings.json ..., held). envgit protects each existing route with a read-only
bind of the path onto itself; bwrap follows the symlink to create the mount point, cannot, and
every later step of the project fails to start (exit 125, "the sandbox did not start ...
`envgit doctor` checks the set-up") until the person finds and removes the link.

Oracle: the next step's output and exit code.
"""

import pytest

from harness import CANARY, attacker  # noqa: F401  (the fixture)


@pytest.mark.parametrize("route", [".envrc"])   # .npmrc, .mcp.json, .husky, .codex, ... held
def test_a_dangling_symlink_on_a_protected_route_does_not_stop_later_steps(attacker, route):
    r = attacker.run(f"ln -s /nonexistent-{CANARY}/x {route}")
    assert r.returncode == 0, r.stderr
    r = attacker.run("echo alive")
    assert r.returncode == 0 and r.stdout == "alive\n", (r.returncode, r.stdout, r.stderr)
