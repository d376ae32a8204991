"""Issue 26: the person's own policy defaults (`~/.config/envgit/policy.yaml`, read under every
project's envgit.yaml) must not be writable from a step: a step that rewrote them, or planted
them where there are none, would widen every later step of every project. From inside a step
(as root, and as an unprivileged user) it writes, removes and symlinks the file, creates it
where it is missing, and points $XDG_CONFIG_HOME at a file of its own; a project's allow_write
that would bring the directory into a step's view is refused. The oracle: the file's content
(or its absence), and the hosts the next step's policy allows."""

import json

import pytest

EVIL = 'version: 1\\nnetwork:\\n  allow: [\\"*.evil.example\\"]\\n'


def _attempt(mine) -> str:
    """Every way a step might write the file at `mine` (and at ~/.config, the step's $HOME)."""
    out = [f"printf '{EVIL}' > evil.yaml"]
    for f in dict.fromkeys((str(mine), "$HOME/.config/envgit/policy.yaml")):
        d = f.rsplit("/", 1)[0]
        out += [f"printf '{EVIL}' > {f} 2>/dev/null", f"printf '{EVIL}' >> {f} 2>/dev/null",
                f"rm -f {f} 2>/dev/null", f'ln -sf "$PWD/evil.yaml" {f} 2>/dev/null',
                f"mkdir -p {d} 2>/dev/null && printf '{EVIL}' > {f} 2>/dev/null",
                f"cp evil.yaml {f} 2>/dev/null"]
    out += [f"mkdir -p conf/envgit && printf '{EVIL}' > conf/envgit/policy.yaml",
            'export XDG_CONFIG_HOME="$PWD/conf"', "echo attempted"]
    return "\n".join(out)


def _mine(a):
    """The person's defaults file. runuser gives the test user its own $HOME (not a.home), so
    for that user $XDG_CONFIG_HOME names the directory in a.home: the same file either way."""
    if not a.is_root:
        a.env["XDG_CONFIG_HOME"] = str(a.home / ".config")
    return a.home / ".config" / "envgit" / "policy.yaml"


def _allowed(a) -> list:
    return json.loads(a.envgit("policy", "show", "--json", check=True).stdout)["network_allow"]


@pytest.mark.both_uids("the file is the person's own (root's or the test user's): a root step could "
                       "write anywhere the view lets it, a non-root one only its own files; "
                       "neither may change it")
def test_a_step_cannot_write_the_persons_policy_defaults(attacker):
    a = attacker
    mine = _mine(a)
    mine.parent.mkdir(parents=True)
    mine.write_text("version: 1\nnetwork:\n  allow: [mine.example]\n")
    a.own(mine.parent)
    before = mine.read_bytes()
    r = a.run(_attempt(mine))
    assert "attempted" in r.stdout, r.stdout + r.stderr
    assert mine.read_bytes() == before and not mine.is_symlink()
    assert _allowed(a) == ["mine.example"]
    # none there yet: a step cannot plant one
    mine.unlink()
    r = a.run(_attempt(mine))
    assert "attempted" in r.stdout, r.stdout + r.stderr
    assert not mine.exists() and not mine.is_symlink()
    assert _allowed(a) == []


@pytest.mark.both_uids("as above: the refusal must not depend on who runs the step")
def test_allow_write_cannot_open_the_persons_defaults_to_a_step(attacker):
    a = attacker
    mine = _mine(a)
    mine.parent.mkdir(parents=True)
    mine.write_text("version: 1\n")
    a.own(mine.parent)
    before = mine.read_bytes()
    tilde = ("~/.config", "~/.config/envgit") if a.is_root else ()      # ~ is a.home for root only
    for entry in (*tilde, str(mine.parent), str(mine.parent.parent), "../.config"):
        a.write_policy(f'version: 1\nfilesystem:\n  allow_write: [".", "{entry}"]\n')
        r = a.run(f"printf '{EVIL}' > {mine}; echo ran")
        assert "ran" not in r.stdout, (entry, r.stdout)
        assert "envgit.yaml:3:" in r.stderr and "holds your policy defaults" in r.stderr, r.stderr
    assert mine.read_bytes() == before
