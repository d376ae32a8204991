"""`envgit ls N [PATH]`, `envgit cat N:PATH`, `envgit restore N --target DIR [-- PATH…]`
(issue 12, section 5): what a step's snapshot holds, read and written elsewhere without
touching the project, through the real CLI, daemon, bwrap and git.
"""

import json
import os
import pty
import select
import stat
import subprocess
import time

from conftest import CANARY, ENVGIT
from faults.faultlib import tree_of
from test_cli_conventions import documented_keys


def raw(proj, *args):
    """The CLI with stdout as bytes (cat's output is the file's bytes)."""
    return subprocess.run([ENVGIT, *args], cwd=proj.root, env=proj.env, capture_output=True, timeout=120)


def commit_in_a_step(proj, script, message):
    r = proj.run(f"{script} && git add -A . && git -c user.name=agent -c user.email=a@example.test "
                 f"commit -qm '{message}'")
    assert r.returncode == 0, r.stderr


def made_tree(proj):
    """Step 1 makes every kind of entry a snapshot keeps."""
    r = proj.run("mkdir -p sub/deeper && printf 'hello\\n' > a.txt && printf '#!/bin/sh\\necho hi\\n' > run.sh "
                 "&& chmod 750 run.sh && ln -s a.txt link && ln -s ../a.txt sub/up "
                 "&& head -c 3000000 /dev/urandom > sub/big.bin && printf 'x' > sub/deeper/f "
                 "&& chmod 700 sub/deeper && printf '\\000\\001\\377' > bin.dat")
    assert r.returncode == 0, r.stderr


def test_ls_lists_names_types_modes_and_sizes(proj):
    made_tree(proj)
    assert proj.run("echo changed > a.txt && rm link").returncode == 0
    j = json.loads(proj.envgit("ls", "last~1", "--json", check=True).stdout)
    assert j["step"] == 1 and j["path"] == "" and not j["recursive"]
    got = {e["path"]: e for e in j["entries"]}
    assert set(got) >= {"a.txt", "run.sh", "link", "sub", "bin.dat", ".git", "envgit.yaml"}
    assert all("/" not in p for p in got)                           # one level
    assert got["a.txt"] == {"path": "a.txt", "type": "file", "mode": "0644", "size": 6, "target": None,
                            "id": got["a.txt"]["id"]}
    assert got["run.sh"]["type"] == "exec" and got["run.sh"]["mode"] == "0750"
    assert got["link"]["type"] == "symlink" and got["link"]["target"] == "a.txt"
    assert got["sub"]["type"] == "dir" and got["sub"]["size"] == 0
    doc = documented_keys()
    assert set(j) == doc["ls"] and all(set(e) == doc["ls.entries"] for e in j["entries"])

    # one directory, recursively, as the file system has it
    j = json.loads(proj.envgit("ls", "1", "sub", "-r", "--json", check=True).stdout)
    rows = {e["path"]: e for e in j["entries"]}
    assert set(rows) == {"sub/big.bin", "sub/deeper", "sub/deeper/f", "sub/up"}
    for p, e in rows.items():
        st = os.lstat(proj.root / p)
        assert e["mode"] == f"{stat.S_IMODE(st.st_mode):04o}", p
        if e["type"] == "file":
            assert e["size"] == st.st_size
    assert rows["sub/up"]["target"] == "../a.txt"

    # the text form: mode string, size, name; a directory with a slash, a link with its target
    text = proj.envgit("ls", "1", check=True).stdout.splitlines()
    assert "-rw-r--r--           6  a.txt" in text
    assert f"-rwxr-x---  {os.lstat(proj.root / 'run.sh').st_size:>10}  run.sh" in text
    assert any(line.startswith("lrwxrwxrwx") and line.endswith("link -> a.txt") for line in text)
    assert any(line.startswith("drwxr-xr-x") and line.endswith(" sub/") for line in text)
    # a file: itself; the later step no longer has the link
    assert proj.envgit("ls", "1", "sub/big.bin", check=True).stdout.split()[1] == "3000000"
    assert "link" not in proj.envgit("ls", "last", check=True).stdout

    r = proj.envgit("ls", "1", "nope")
    assert r.returncode == 2 and r.stderr.startswith("envgit: nope: not in this snapshot") and not r.stdout
    r = proj.envgit("ls", "9")
    assert r.returncode == 2 and "no step 9" in r.stderr
    r = proj.envgit("ls", "last~7")
    assert r.returncode == 2 and "no step last~7" in r.stderr


def test_cat_prints_the_bytes_of_a_step(proj):
    made_tree(proj)
    assert proj.run("echo changed > a.txt").returncode == 0
    r = raw(proj, "cat", "1:a.txt")
    assert r.returncode == 0 and r.stdout == b"hello\n"
    assert raw(proj, "cat", "last:a.txt").stdout == b"changed\n"
    assert raw(proj, "cat", "last~1:a.txt").stdout == b"hello\n"
    assert raw(proj, "cat", "1:bin.dat").stdout == b"\x00\x01\xff"
    big = raw(proj, "cat", "1:./sub/big.bin").stdout               # chunked in the store
    assert big == (proj.root / "sub" / "big.bin").read_bytes() and len(big) == 3000000
    assert raw(proj, "cat", "1:link").stdout == b"a.txt"             # a symlink: its target
    r = proj.envgit("cat", "1:sub")
    assert r.returncode == 2 and "a directory" in r.stderr and "envgit ls 1 sub" in r.stderr
    r = proj.envgit("cat", "1:missing.txt")
    assert r.returncode == 2 and "not in the snapshot of step 1" in r.stderr
    r = proj.envgit("cat", "1")
    assert r.returncode == 2 and "STEP:PATH" in r.stderr
    r = proj.envgit("cat", "first:a.txt")
    assert r.returncode == 2 and "last~K" in r.stderr


def test_cat_on_a_terminal_shows_escapes_instead_of_obeying_them(proj):
    assert proj.run("printf 'title\\033]0;owned\\007 and \\033[2J\\n' > t.txt").returncode == 0
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(proj.root)
        os.execve(ENVGIT, [ENVGIT, "cat", "last:t.txt"], proj.env)
    seen, t0 = b"", time.monotonic()
    while time.monotonic() - t0 < 30:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    os.waitpid(pid, 0)
    assert b"\x1b" not in seen and b"\\x1b]0;owned\\x07" in seen and b"\\x1b[2J" in seen


def test_denied_files_are_withheld_by_cat_unless_asked(proj):
    # the person's .env (a step cannot write it: it is denied), in the snapshot all the same
    (proj.root / ".env").write_text(f"TOKEN={CANARY}\n")
    (proj.root / "server.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{CANARY}\n")
    (proj.root / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\npublic\n")
    assert proj.run("echo hi > a.txt").returncode == 0
    for path in (".env", "server.pem"):
        r = raw(proj, "cat", f"last:{path}")
        assert r.returncode == 1 and r.stdout == b"" and CANARY.encode() not in r.stderr
        assert b"content withheld; --show-secrets shows it" in r.stderr and b"deny_read" in r.stderr
        r = raw(proj, "cat", f"last:{path}", "--show-secrets")
        assert r.returncode == 0 and CANARY.encode() in r.stdout
    assert raw(proj, "cat", "last:ca.pem").stdout.startswith(b"-----BEGIN CERTIFICATE")   # not a secret
    # the policy decides: allowing the file by name lifts it
    policy = (proj.root / "envgit.yaml").read_text()
    assert "  allow_read: []\n" in policy
    (proj.root / "envgit.yaml").write_text(policy.replace("  allow_read: []\n", "  allow_read: [.env]\n", 1))
    assert raw(proj, "cat", "last:.env").stdout == f"TOKEN={CANARY}\n".encode()


def test_restore_writes_a_step_elsewhere_byte_for_byte(proj, tmp_path):
    made_tree(proj)
    commit_in_a_step(proj, "true", "first")
    after_commit = tree_of(proj.root)
    commit_in_a_step(proj, "echo two > a.txt && rm -r sub", "second")
    assert proj.run("git reset -q --hard HEAD~1").returncode == 0
    before = tree_of(proj.root)

    target = tmp_path / "restored"
    r = proj.envgit("restore", "2", "--target", str(target), check=True)
    assert "restored step 2" in r.stdout and str(target) in r.stdout
    assert tree_of(target) == after_commit                            # bytes, modes, symlinks, .git
    assert tree_of(proj.root) == before                               # the project untouched
    log = subprocess.run(["git", "-C", str(target), "log", "--format=%s"], capture_output=True, text=True)
    assert log.stdout.split() == ["first"]
    assert subprocess.run(["git", "-C", str(target), "fsck", "--strict"], capture_output=True).returncode == 0

    # a later step, by reference, into a new directory, --json
    target2 = tmp_path / "later" / "x"
    j = json.loads(proj.envgit("restore", "last~1", "--target", str(target2), "--json", check=True).stdout)
    assert j["step"] == 3 and j["target"] == str(target2) and j["files"] > 0 and j["symlinks"] == 1
    assert set(j) == documented_keys()["restore"]
    assert (target2 / "a.txt").read_text() == "two\n" and not (target2 / "sub").exists()


def test_restore_some_paths_and_what_it_refuses(proj, tmp_path):
    made_tree(proj)
    before = tree_of(proj.root)
    target = tmp_path / "t"
    proj.envgit("restore", "1", "--target", str(target), "--", "sub/deeper", "a.txt", check=True)
    got = tree_of(target)
    assert set(got) == {"a.txt", "sub", "sub/deeper", "sub/deeper/f"}
    assert got["sub/deeper"] == ("dir", 0o700) and got["a.txt"] == before["a.txt"]

    # not empty: refused unless --force, which replaces what the snapshot has and deletes nothing
    r = proj.envgit("restore", "1", "--target", str(target))
    assert r.returncode == 2 and "not empty" in r.stderr and "--force" in r.stderr
    (target / "a.txt").write_text("mine\n")
    (target / "keep.txt").write_text("kept\n")
    os.symlink("/", target / "link")                # in the way of the snapshot's own symlink
    proj.envgit("restore", "1", "--target", str(target), "--force", check=True)
    got = tree_of(target)
    assert got["a.txt"] == before["a.txt"] and got["keep.txt"][2] == b"kept\n"
    assert got["link"] == ("link", "a.txt")
    assert {k: v for k, v in got.items() if k != "keep.txt"} == before

    # a directory where the snapshot has a file: refused, nothing written
    other = tmp_path / "o"
    (other / "a.txt").mkdir(parents=True)
    r = proj.envgit("restore", "1", "--target", str(other), "--force")
    assert r.returncode == 2 and "a directory where the snapshot has a file" in r.stderr
    assert os.listdir(other) == ["a.txt"]

    for bad, why in ((proj.root / "inside", "inside the project"), (proj.root, "inside the project"),
                     (proj.root.parent, "holds the project"), (tmp_path / "n", "not in the snapshot")):
        r = proj.envgit("restore", "1", "--target", str(bad), *(["--", "nope"] if "snapshot" in why else []))
        assert r.returncode == 2 and why in r.stderr, (bad, r.stderr)
        assert not (tmp_path / "n").exists()
    assert tree_of(proj.root) == before
    r = proj.envgit("restore", "1")
    assert r.returncode == 2 and "--target" in r.stderr


def test_a_damaged_store_or_a_dropped_snapshot_writes_nothing(proj, tmp_path):
    made_tree(proj)
    assert proj.run("echo 2 > a.txt").returncode == 0
    assert proj.run("echo 3 > a.txt").returncode == 0
    r = proj.envgit("gc", "--keep-last", "1", check=True)
    for argv in (("ls", "1"), ("cat", "1:a.txt"), ("restore", "1", "--target", str(tmp_path / "g"))):
        r = proj.envgit(*argv)
        assert r.returncode == 2 and "dropped by `envgit gc`" in r.stderr, (argv, r.stderr)
    assert not (tmp_path / "g").exists()
    proj.stop()
    packs = sorted((proj.root / ".envgit" / "objects" / "packs").rglob("*.pack"), key=lambda p: p.stat().st_size)
    big = packs[-1]                             # the one holding sub/big.bin's chunks
    data = bytearray(big.read_bytes())
    data[len(data) // 2] ^= 0xFF
    big.write_bytes(bytes(data))
    r = proj.envgit("restore", "last", "--target", str(tmp_path / "d"))
    assert r.returncode == 4 and "fsck" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # every other path is written and the damaged file named (issue 32, case 2)
    assert "sub/big.bin:" in r.stderr and not (tmp_path / "d" / "sub" / "big.bin").exists()
    assert (tmp_path / "d" / "a.txt").read_bytes() == b"3\n"
