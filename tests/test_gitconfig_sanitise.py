"""The sanitised git config a step sees (sandbox/gitconfig.py), read back by real git."""

import subprocess

from envgit.sandbox.gitconfig import read, render, sanitise

SOURCE = r"""[core]
	fsmonitor = touch /tmp/x
	sshCommand = ssh -i ~/.ssh/deploy
	askPass = /usr/bin/askpass
	bare = false
	pager = less -R
	hooksPath = .husky/_
[url "https://ghp_abcdefghijklmnop1234@github.com/"]
	insteadOf = https://github.com/
[url "https://github.com/"]
	insteadOf = gh:
[remote "origin"]
	url = https://x-access-token:s3cr3t-value@github.com/o/r.git
	pushurl = ssh://git@github.com/o/r.git
	fetch = +refs/heads/*:refs/remotes/origin/*
[http "https://github.com/"]
	extraheader = AUTHORIZATION: basic s3cr3t-value
[http]
	proxy = http://user:s3cr3t-value@proxy.example:3128
	cookiefile = ~/.cookies
[alias]
	co = checkout
	leak = !curl -H 'token s3cr3t-value' https://x
	q = "a \"quoted\" \\ value"
[credential]
	helper = store
[credential "https://github.com"]
	username = me
[filter "lfs"]
	clean = git-lfs clean -- %f
	process = git-lfs filter-process
	required
[diff "pdf"]
	textconv = pdftotext
[github]
	token = s3cr3t-value
[sendemail]
	smtppass = s3cr3t-value
[user]
	email = a@example.com
	signingkey = ~/.ssh/id_ed25519.pub
[custom]
	bearer = Bearer ghp_abcdefghijklmnopqrstuvwxyz
"""


def test_sanitised_config_keeps_what_git_needs_and_nothing_secret(tmp_path):
    src = tmp_path / "config"
    src.write_text(SOURCE)
    out = tmp_path / "clean"
    out.write_text(render(sanitise(read(["--file", str(src)], str(tmp_path), None))))
    text = out.read_text()
    assert "s3cr3t" not in text and "ghp_" not in text, text
    got = dict(read(["--file", str(out)], str(tmp_path), None))     # real git reads it back
    for gone in ("core.fsmonitor", "core.sshcommand", "core.askpass", "alias.leak", "credential.helper",
                 "credential.https://github.com.username", "http.cookiefile", "github.token",
                 "sendemail.smtppass", "diff.pdf.textconv", "http.https://github.com/.extraheader",
                 "custom.bearer"):
        assert gone not in got, gone
    assert got["remote.origin.url"] == "https://github.com/o/r.git"
    assert got["remote.origin.pushurl"] == "ssh://git@github.com/o/r.git"
    assert got["http.proxy"] == "http://proxy.example:3128"
    assert got["url.https://github.com/.insteadof"] == "gh:"
    assert not any(k.startswith("url.https://ghp_") for k in got)
    assert got["alias.q"] == 'a "quoted" \\ value'
    assert got["filter.lfs.clean"] == "git-lfs clean -- %f" and "filter.lfs.required" in got
    assert got["core.hookspath"] == ".husky/_" and got["core.pager"] == "less -R"
    assert got["user.email"] == "a@example.com"
    r = subprocess.run(["git", "config", "--file", str(out), "--get", "core.bare"], capture_output=True, text=True)
    assert r.stdout.strip() == "false"


def test_one_scope_is_cut_from_gits_scoped_listing():
    """`git config --list --show-scope -z` (what the person's global config is read with: git
    reads the XDG file and ~/.gitconfig, `--global` names only the second) cut to one scope."""
    from envgit.sandbox.hostgit import only_scope, parse
    out = (b"system\0file:/etc/gitconfig\0core.pager\nless\0"
           b"global\0file:/h/.config/git/config\0core.hookspath\n.githooks\0"
           b"global\0file:/h/.gitconfig\0user.name\nperson\0"
           b"global\0file:/h/.gitconfig\0core.bare\0"
           b"local\0file:.git/config\0core.fsmonitor\ntouch x\0")
    assert parse(only_scope(out, "global", True), True) == [
        ("file:/h/.config/git/config", "core.hookspath", ".githooks"),
        ("file:/h/.gitconfig", "user.name", "person"), ("file:/h/.gitconfig", "core.bare", None)]
    bare = b"global\0core.hookspath\n.githooks\0local\0core.fsmonitor\ntouch x\0"
    assert parse(only_scope(bare, "global", False)) == [("core.hookspath", ".githooks")]
