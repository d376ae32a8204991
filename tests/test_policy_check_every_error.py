"""`envgit policy check` (issue 26): every error of a policy, not only the first, each with its
file:line:col and the fix; an allow_write that would break every step (`/`, a system directory,
the home directory or one above it) refused by the check and by load, at its line; `envgit
policy presets` lists the network presets and the irreversible rules with what they match."""

import json
import re
from pathlib import Path

from conftest import Env, make_home

ROOT = Path(__file__).resolve().parent.parent


def _project(tmp_path, policy) -> Env:
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    env = Env(home, root)
    env.envgit("init", check=True)
    env.write_policy(policy)
    return env


THREE = """\
version: 1
filesystem:
  deny_reed: []
network:
  allow: ["preset:pipy", example.org]
  ask_timeout: soon
"""


def test_policy_check_lists_every_error_with_its_line_and_column(tmp_path):
    env = _project(tmp_path, THREE)
    f = env.root / "envgit.yaml"
    r = env.envgit("policy", "check")
    assert r.returncode == 2, r.stdout + r.stderr
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith(f"envgit: {f}:")]
    assert [tuple(e.split(":")[2:4]) for e in errs] == [("3", "3"), ("5", "11"), ("6", "16")], r.stderr
    assert "did you mean 'deny_read'?" in errs[0] and "is not a network preset" in errs[1]
    assert "whole number" in errs[2] and "envgit: 3 errors" in r.stderr
    j = json.loads(env.envgit("policy", "check", "--json").stdout)
    assert j["exit"] == 2 and len(j["error"].splitlines()) == 3, j
    # every other reader says the first, and that there are more
    r = env.run("echo should-not-run")
    assert "should-not-run" not in r.stdout, r.stdout
    assert f"{f}:3:3" in r.stderr and "2 more errors" in r.stderr, r.stderr


def test_one_error_is_said_as_before(tmp_path):
    env = _project(tmp_path, "version: 1\nfilesystem:\n  deny_reed: []\n")
    r = env.envgit("policy", "check")
    assert r.returncode == 2 and r.stderr.count("envgit:") == 1 and "more error" not in r.stderr, r.stderr


def test_allow_write_of_root_is_refused_by_check_and_by_load_at_its_line(tmp_path):
    env = _project(tmp_path, 'version: 1\nfilesystem:\n  allow_write:\n    - "."\n    - "/"\n')
    f = env.root / "envgit.yaml"
    r = env.envgit("policy", "check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{f}:5:7:" in r.stderr and "makes / (the whole machine) writable" in r.stderr, r.stderr
    assert "remove it" in r.stderr
    r = env.run("echo should-not-run")
    assert "should-not-run" not in r.stdout and f"{f}:5:" in r.stderr, r.stdout + r.stderr
    # the home directory, a directory above it, /usr, and one that leaves the project for /:
    # each at its own line, with a format error beside them
    env.write_policy('version: 1\nfilesystem:\n  allow_write:\n    - "~"\n    - /usr\n'
                     f'    - "{env.home.parent}"\n    - "../../../../../../../../.."\n    - build\n'
                     '  alow_read: []\n')
    r = env.envgit("policy", "check")
    lines = [ln.split(":")[2] for ln in r.stderr.splitlines() if ln.startswith(f"envgit: {f}:")]
    assert lines == ["4", "5", "6", "7", "9"], r.stderr
    assert "your home directory" in r.stderr and "system directory" in r.stderr
    assert "holds your home directory" in r.stderr


def test_allow_write_over_the_persons_defaults_is_refused(tmp_path):
    env = _project(tmp_path, 'version: 1\nfilesystem:\n  allow_write: [".", "~/.config"]\n')
    r = env.envgit("policy", "check")
    assert r.returncode == 2 and "holds your policy defaults" in r.stderr, r.stderr
    assert f"{env.root / 'envgit.yaml'}:3:" in r.stderr


def test_policy_presets_lists_each_with_what_it_matches(tmp_path):
    env = _project(tmp_path, "version: 1\n")
    text = env.envgit("policy", "presets", check=True).stdout
    assert "preset:pypi" in text and "files.pythonhosted.org" in text
    block = text[text.index("  git-push "):].split("\n  git-push-webdav")[0]
    assert "methods: POST" in block and "paths: **/git-receive-pack" in block, block
    assert "hosts: any" in block
    npm = text[text.index("  npm-publish "):].split("\n  npm-client-write")[0]
    assert "registry.npmjs.org" in npm and "methods: PUT POST" in npm, npm
    j = json.loads(env.envgit("policy", "presets", "--json", check=True).stdout)
    doc = (ROOT / "docs" / "JSON.md").read_text()
    tables = {n: {re.match(r"\|\s*`([^`]+)`", r).group(1) for r in t.splitlines()[2:]}
              for n, t in re.findall(r"<!-- keys: (\S+) -->\n((?:\|.*\n)+)", doc)}
    assert set(j) == tables["policy.presets"]
    assert all(set(p) == tables["policy.presets.network"] for p in j["network"])
    assert all(set(r) == tables["policy.presets.irreversible"] for r in j["irreversible"])
    push = next(r for r in j["irreversible"] if r["name"] == "git-push")
    assert push["methods"] == ["POST"] and push["paths"] == ["**/git-receive-pack"] and push["hosts"] is None
    pypi = next(p for p in j["network"] if p["name"] == "preset:pypi")
    assert pypi["hosts"] == ["pypi.org", "files.pythonhosted.org"]
