"""The policy file: strict loading with file:line:col errors, provenance, schema, decisions."""

import json

import pytest

from envgit.policy import PolicyError, decide_command, decide_path, json_schema, load_policy
from envgit.policy.defaults import TEMPLATE

BAD = [
    ("version: 1\nfilesystem:\n  deny_reed: []\n", 3, 3, "did you mean 'deny_read'?"),
    ("version: 1\nfilesystem:\n  deny_read: ~/.ssh\n", 3, 14, "must be a list"),
    ("version: 1\nnetwork:\n  allow: [\"github.com:99999\"]\n", 3, 11, "out of range"),
    ("version: 1\nnetwork:\n  allow: [\"not a host\"]\n", 3, 11, "is not a host"),
    ("version: 1\nfilesystem:\n  deny_read: [\"src/[abc\"]\n", 3, 15, "unclosed '['"),
    ("version: 1\nfilesystem:\n  deny_read: [\"a/***/b\"]\n", 3, 15, "'***'"),
    ("version: 1\nirreversible:\n  - preset: defualt\n", 3, 13, "did you mean 'default'?"),
    ("version: 1\nirreversible:\n  - net: {host: api.github.com}\n", 3, 5, "missing 'action'"),
    ("version: 1\nirreversible:\n  - action: deny\n", 3, 5, "exactly one of"),
    ("version: 1\nfilesystem:\n  deny_read: [a\n", 4, 1, "not valid YAML"),
    ("version: 1\nversion: 1\n", 2, 1, "appears twice"),
    ("version: 2\n", 1, 1, "version 2"),
    ("filesystem: {}\n", 1, 1, "missing 'version'"),
    ("version: one\n", 1, 10, "whole number"),
    ("", 1, 1, "empty"),
    ("version: 1\nsnapshot:\n  max_file_size: lots\n", 3, 18, "not a size"),
    ("version: 1\nfilesystem:\n  deny_read: [\"a\x01b\"]\n", 3, 17, "a control character (U+0001)"),
    ("version: 1\n\x07\n", 2, 1, "a control character (U+0007)"),
]


@pytest.mark.parametrize("text,line,col,needle", BAD)
def test_bad_policies_name_line_column_and_fix(tmp_path, text, line, col, needle):
    p = tmp_path / "envgit.yaml"
    p.write_text(text)
    with pytest.raises(PolicyError) as e:
        load_policy(p)
    assert needle in str(e.value)
    assert (e.value.line, e.value.col) == (line, col), str(e.value)
    assert f"envgit.yaml:{line}:{col}: " in str(e.value)


def test_a_policy_that_is_not_utf8_names_the_line(tmp_path):
    p = tmp_path / "envgit.yaml"
    p.write_bytes(b"version: 1\nfilesystem:\n  deny_read: [\"a\xffb\"]\n")
    with pytest.raises(PolicyError) as e:
        load_policy(p)
    assert "envgit.yaml:3:17: not UTF-8 text (byte 39, 0xff); save it as UTF-8" in str(e.value)


def test_template_is_valid_and_shows_sources(tmp_path):
    p = tmp_path / "envgit.yaml"
    p.write_text(TEMPLATE + "env:\n" if False else TEMPLATE)
    pol = load_policy(p)
    assert "~/.ssh" in pol.deny_read and pol.where["filesystem.deny_read[0]"] == "default"
    assert pol.irreversible == [{"preset": "default"}]


def test_provenance_of_file_values(tmp_path):
    p = tmp_path / "envgit.yaml"
    p.write_text("version: 1\nfilesystem:\n  deny_read:\n    - secrets\n")
    pol = load_policy(p)
    i = pol.deny_read.index("secrets")
    assert pol.where[f"filesystem.deny_read[{i}]"] == f"{p}:4"


def test_json_schema_is_complete():
    s = json_schema()
    assert s["additionalProperties"] is False
    fs = s["properties"]["filesystem"]["properties"]
    assert {"deny_read", "allow_read", "allow_write", "protect"} <= set(fs)
    json.dumps(s)


class P:
    """A policy read from text, for the pure decisions."""
    def __new__(cls, tmp_path, text="version: 1\n"):
        f = tmp_path / "envgit.yaml"
        f.write_text(text)
        return load_policy(f)


def test_decide_path(tmp_path):
    pol = P(tmp_path, "version: 1\nfilesystem:\n  allow_read: ['~/.ssh/known_hosts', '~/.config']\n")
    home, proj = "/home/u", "/home/u/proj"
    def d(p):
        return decide_path(pol, p, proj, home)
    assert d("/home/u/.ssh/id_ed25519").access == "none"
    assert d("/home/u/.ssh/known_hosts").access == "read"
    assert d("/home/u/.config/gh/hosts.yml").access == "none"       # a broader allow does not reopen
    assert d("/home/u/.config/tool.toml").access == "read"
    assert d("/home/u/.bashrc").access == "none"
    assert d("/home/u/proj/src/a.py").access == "write"
    assert d("/home/u/proj/a/b/.env").access == "none"
    assert d("/home/u/proj/.env.example").access == "write"
    assert d("/home/u/proj/.git/hooks/pre-commit").access == "read"
    assert d("/home/u/proj/envgit.yaml").access == "read"
    assert d("/home/u/proj/.envgit/journal.sqlite").access == "none"
    assert d("/etc/shadow").access == "none"
    assert d("/etc/passwd").access == "read"
    assert d("/tmp/x").access == "write"
    assert d("/home/u/.mozilla/firefox/x").access == "none"
    assert d("/work/other").access == "none"


@pytest.mark.parametrize("cmd,action", [
    (["git", "push"], "deny"),
    (["sh", "-c", "cd x && git -c a=b push origin main"], "deny"),
    (["bash", "-lc", "FOO=1 git push"], "deny"),
    (["sh", "-c", "sh -c 'git push'"], "deny"),
    (["git", "commit", "-m", "push"], "allow"),
    (["sh", "-c", "g=git; $g push"], "allow"),         # a courtesy: the network gate enforces
    (["git", "pull"], "allow"),
])
def test_decide_command(tmp_path, cmd, action):
    pol = P(tmp_path, "version: 1\nshell:\n  - deny: ['git push']\n")
    assert decide_command(pol, cmd).action == action
