"""Class 8: files host tools obey (npm, dev containers, editors' and agents' MCP configs, husky,
a virtualenv's .pth files). A step writes a planted command into each; the oracle is that
command in the file the tool would read. Those that run code or route credentials are
read-only when they exist, and their creation is marked and told; the rest (.pth: pip writes
them) are writable, and every change is marked and told."""

import json

import pytest

from harness import every_case, put_back, taken_back

PLANT = "touch /tmp/pwned-by-host-tool"
PROTECTED = [".npmrc", "packages/web/.npmrc", ".yarnrc.yml", ".devcontainer/devcontainer.json",
             ".devcontainer.json", ".vscode/mcp.json", ".cursor/mcp.json", ".gemini/settings.json",
             ".zed/settings.json", "opencode.json", ".husky/pre-commit", ".gitmodules"]


def last_step(a):
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    return steps[-1]


@pytest.mark.both_uids("an existing route is protected by a read-only bind in the step's view: as a non-root user "
                       "bwrap builds it in a user namespace, where DAC lets the person write their own file: the bind "
                       "must hold there too")
def test_an_existing_one_is_read_only(attacker):
    """Every route its own steps in one project: the person's file is there before its steps
    and removed after them, with the directories made for it."""
    a = attacker

    def check(rel):
        with put_back(a, rel, f"{rel}.new"):             # the .new its mv could not move
            p = a.root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("original\n")
            a.own(a.root)
            r = a.run(f"echo '{PLANT}' >> {rel}; echo '{PLANT}' > {rel}.new && mv {rel}.new {rel}")
            assert r.returncode != 0, r.stdout + r.stderr
            assert p.read_text() == "original\n"
            # the project around it stays writable
            assert a.run("echo ok > notes.txt && rm notes.txt").returncode == 0

    every_case(PROTECTED, check)


@pytest.mark.both_uids("the take-back restores as the daemon, through directory fds: a non-root person's step "
                       "files are theirs")
def test_a_new_one_is_taken_back_and_told(attacker):
    """Nothing to bind read-only before it exists: the step may create it, and at its end it is
    taken back (the host tool never reads it), its version kept in the step's snapshot. Every
    route its own step in one project; the directories its step made are removed after it."""
    a = attacker

    def check(rel):
        with put_back(a, rel):
            r = a.run(f"mkdir -p $(dirname {rel}) && echo '{PLANT}' > {rel}")
            assert r.returncode == 0, r.stderr
            s = taken_back(a, r, rel)
            assert not (a.root / rel).exists()
            assert rel in a.envgit("diff", str(s["id"])).stdout

    every_case(PROTECTED, check)


def test_escape_routes_allow_keeps_one_a_step_creates(attacker):
    """`escape_routes.allow` is the way back to marking only, for the globs it names."""
    a = attacker
    a.write_policy('version: 1\nescape_routes:\n  allow: [".husky/**", "**/.npmrc"]\n')
    r = a.run(f"mkdir -p .husky web && echo '{PLANT}' > .husky/pre-commit && echo x=1 > web/.npmrc && "
              f"echo '{PLANT}' > .envrc")
    assert r.returncode == 0, r.stderr
    s = taken_back(a, r, ".envrc")
    assert (a.root / ".husky" / "pre-commit").exists() and (a.root / "web" / ".npmrc").exists()
    assert not (a.root / ".envrc").exists()
    assert {".husky/pre-commit", "web/.npmrc"} <= set(s["escape_routes"]) - set(s["taken_back"]), s
    assert "ESCAPE ROUTE" in r.stderr


def test_a_pth_file_is_writable_and_marked(attacker):
    a = attacker
    site = ".venv/lib/python3.12/site-packages"
    r = a.run(f"mkdir -p {site} && echo 'import os; os.system(\"{PLANT}\")' > {site}/evil.pth")
    assert r.returncode == 0, r.stderr
    s = last_step(a)
    assert "escape-route-written" in s["marks"] and f"{site}/evil.pth" in s["escape_routes"], s
    assert f"{site}/evil.pth" in r.stderr
    # an ordinary file in the same venv is not an escape route
    r = a.run(f"echo x > {site}/module.py")
    assert r.returncode == 0 and "escape-route-written" not in last_step(a)["marks"]


def test_the_list_is_printed_from_one_place(attacker):
    from envgit.policy import defaults
    out = attacker.envgit("policy", "protected", check=True).stdout
    for pattern, _action, _ in defaults.ESCAPE_ROUTES:
        assert pattern in out
    assert set(defaults.PROTECT) | set(defaults.MARK) == {p for p, _, _ in defaults.ESCAPE_ROUTES}


def test_a_packages_own_copies_do_not_pin_node_modules(attacker):
    """The legitimate use: `rm -rf node_modules` (npm ci does it) still works when a published
    package carries its own .yarnrc or .gitmodules, which no tool reads there."""
    a = attacker
    pkg = a.root / "node_modules" / "left-pad"
    pkg.mkdir(parents=True)
    for name in (".yarnrc", ".gitmodules", ".npmrc", "index.js"):
        (pkg / name).write_text("x\n")
    a.own(a.root)
    r = a.run("rm -rf node_modules && echo gone")
    assert r.returncode == 0 and "gone" in r.stdout, r.stderr
    assert not (a.root / "node_modules").exists()
