"""Red team 15: the VM tier's write-back (vm/sync.py's collect), attacked from inside a step.

The guest holds its own copy of the project; after each step the daemon writes what the guest
changed onto the host. Three holes found there:

1. A removal is applied on the host recursively: the guest removes a directory (or turns it
   into a file) and the daemon's `_remove` deletes the whole host directory, with what the
   guest never saw and a step may never touch: a denied secret (`sub/.env`), a nested git
   repository (`lib/.git`, never synced: its protected config), a protected agent config
   (`.claude/settings.json`). The default tier's `rm -rf` fails on those (masked / read-only).
   What is deleted is neither in the guest nor in any file snapshot (denied, or .git): gone.
2. The write-back overwrites blindly: a file the person edits on the host while a step runs is
   overwritten at the step's end by the guest's older copy (written before the person's edit),
   and the person's edit is recorded nowhere. In the default tier the later write wins.
3. The write-back's view is the policy's globs only: what the default tier also binds read-only
   from git itself (the `core.hooksPath` directory, files a git config includes) is written
   back, and the person's next `git commit` / `git status` runs the step's code on the host.

Real QEMU (TCG here): one boot per test and attacker. The oracle: files on the host.
"""

import os
import re
import select
import subprocess
import time

import pytest

from conftest import CANARY

pytestmark = [
    pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v qemu-system-x86_64"],
                                      capture_output=True).returncode != 0,
                       reason="QEMU is not installed (dev/run test installs it)"),
    pytest.mark.both_uids(
        "the write-back writes and removes the person's host files as the daemon's uid (its runtime directory is "
        "per uid, and DAC decides for a non-root person): what it refuses must hold for both; not sure the uid can "
        "change it, kept for safety"),
]

def vm_project(attacker, image):
    attacker.stop()
    attacker.write_policy("version: 1\nbackend: vm\nvm: { memory: 256MiB, cpus: 1 }\n")
    attacker.env["ENVGIT_VM_CACHE"] = image


def test_vm_removing_a_directory_does_not_delete_what_the_guest_never_had(attacker, shared_image):
    vm_project(attacker, shared_image)
    root = attacker.root
    (root / "sub").mkdir()
    (root / "sub" / "code.py").write_text("x = 1\n")
    (root / "sub" / ".env").write_text(f"TOKEN={CANARY}\n")            # denied: never in the guest
    (root / "other").mkdir()
    (root / "other" / "a.txt").write_text("a\n")
    (root / "other" / ".env").write_text(f"TOKEN={CANARY}\n")
    subprocess.run(["git", "init", "-q", str(root / "lib")], check=True)  # a nested repository
    (root / "lib" / "mod.py").write_text("y = 2\n")
    (root / ".claude").mkdir()
    (root / ".claude" / "settings.json").write_text('{"hooks": {}}\n')    # protected
    (root / ".claude" / "notes.md").write_text("n\n")
    attacker.own(root / "sub", root / "other", root / "lib", root / ".claude")
    r = attacker.envgit("run", "--", "sh", "-c",
                        "rm -rf sub lib .claude; rm -rf other && echo file > other; echo done",
                        timeout=400)
    assert "done" in r.stdout, r.stdout + r.stderr
    lost = [p for p in ("sub/.env", "other/.env", "lib/.git/config", ".claude/settings.json")
            if not (root / p).exists()]
    assert not lost, f"the VM step's write-back deleted host paths the step may not touch: {lost}"
    assert "they were left: " in r.stderr and "other" in r.stderr, r.stderr   # said on the step


def test_vm_a_persons_edit_during_a_step_is_not_overwritten_by_the_guests_older_copy(attacker, shared_image):
    vm_project(attacker, shared_image)
    notes = attacker.root / "notes.txt"
    notes.write_text("v0\n")
    attacker.own(notes)
    p = subprocess.Popen(attacker._argv([*_envgit(), "run", "--", "sh", "-c",
                                         "echo guest > notes.txt; echo WROTE; sleep 20; echo END"]),
                         cwd=attacker.root, env=attacker.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        buf = b""
        deadline = time.monotonic() + 400
        while b"WROTE" not in buf and time.monotonic() < deadline and p.poll() is None:
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if ready:
                buf += os.read(p.stdout.fileno(), 4096)
        assert b"WROTE" in buf, buf
        notes.write_text("the person's edit, made after the guest's write\n")   # on the host
        attacker.own(notes)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert b"END" in buf + out, (buf + out, err)
    got = notes.read_text()
    assert "the person's version was kept" in err.decode(), err   # said on the step
    assert "the person's edit" in got, (
        f"the person's later edit was overwritten by the guest's older copy: {got!r}")


def _envgit():
    from conftest import ENVGIT
    return [ENVGIT]


def test_vm_write_back_keeps_what_git_reads_read_only_as_the_default_tier_does(attacker, shared_image):
    """The default tier binds read-only what git obeys beyond the fixed list (sandbox/routes.py,
    gitroutes.py): the directory `core.hooksPath` names and the files a git config includes.
    The VM tier's write-back (sync.View) knows only the policy's globs: a guest rewrites the
    hook and the included config, they land on the host, and the person's next `git commit` /
    `git status` runs the step's code on the host."""
    vm_project(attacker, shared_image)
    root, home = attacker.root, attacker.home
    (root / ".githooks").mkdir()
    (root / ".githooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(root / ".githooks" / "pre-commit", 0o755)
    (root / "tools").mkdir()
    (root / "tools" / "git.cfg").write_text("[color]\n\tui = auto\n")
    attacker.own(root / ".githooks", root / "tools")
    r = attacker.host("git config core.hooksPath .githooks && git config include.path ../tools/git.cfg")
    assert r.returncode == 0, r.stderr
    hook_marker, cfg_marker = home / "HOOK_RAN", home / "FSMONITOR_RAN"
    r = attacker.envgit("run", "--", "sh", "-c",
                        f"printf '#!/bin/sh\\ntouch {hook_marker}\\nexit 0\\n' > .githooks/pre-commit; "
                        f"printf '[core]\\n\\tfsmonitor = \"touch {cfg_marker}; false\"\\n' >> tools/git.cfg; "
                        "echo done", timeout=400)
    assert "done" in r.stdout, r.stdout + r.stderr
    # the person, later, on the host
    attacker.host("git status >/dev/null 2>&1; git -c user.email=p@example.test -c user.name=p "
                  "commit -q --allow-empty -m person >/dev/null 2>&1")
    ran = [str(m) for m in (hook_marker, cfg_marker) if m.exists()]
    assert not ran, f"a VM step's write-back planted code git ran on the host: {ran}"


SPARSE_STEP = r'''
import os
st = os.stat("in.bin")
with open("in.bin", "rb") as f:
    head = f.read(5)
    f.seek(80 << 20)
    mid = f.read(6)
print("IN", st.st_size, st.st_blocks * 512, head, mid, flush=True)
with open("out.bin", "wb") as f:         # 2 GiB with 14 bytes of data: the rest is holes
    f.write(b"START")
    f.seek(1 << 30)
    f.write(b"MIDDLE")
    f.seek((2 << 30) - 3)
    f.write(b"END")
print("OUT", os.stat("out.bin").st_blocks * 512, flush=True)
'''


def test_vm_a_sparse_file_keeps_its_holes_both_ways(attacker, shared_image):
    """A 2 GiB file of 14 data bytes made in the guest (`truncate -s 2G`, `dd seek=`) was
    written back byte for byte, 2 GiB of real host disk; a sparse host file was pushed into the
    guest's RAM-backed copy the same way (a 96 MiB hole took 96 MiB of a 256 MiB guest's RAM; a
    larger one filled the guest). Holes stay holes: only data extents cross the agent's port, at
    their offsets."""
    vm_project(attacker, shared_image)
    root = attacker.root
    with open(root / "in.bin", "wb") as f:
        f.write(b"HELLO")
        f.seek(80 << 20)
        f.write(b"INSIDE")
        f.truncate(96 << 20)
    attacker.own(root / "in.bin")
    r = attacker.envgit("run", "--", "python3", "-c", SPARSE_STEP, timeout=900)
    wrong = []
    got = re.search(r"IN (\d+) (\d+) (b'.*?') (b'.*?')", r.stdout)
    if not got or got.groups() != (str(96 << 20), got.group(2), "b'HELLO'", "b'INSIDE'") \
            or int(got.group(2)) > 16 << 20:
        wrong.append(f"pushed into the guest: {got and got.groups()} (size, allocated, head, middle)")
    out = root / "out.bin"
    if not out.exists():
        wrong.append("out.bin was not written back")
    else:
        st = out.stat()
        with open(out, "rb") as f:
            parts = [f.read(5)]
            f.seek(1 << 30)
            parts.append(f.read(6))
            f.seek((2 << 30) - 3)
            parts.append(f.read())
            f.seek(4096)
            parts.append(f.read(4096).strip(b"\0"))     # a hole reads as zeros
        if st.st_size != 2 << 30 or parts != [b"START", b"MIDDLE", b"END", b""]:
            wrong.append(f"written back wrong: size {st.st_size}, {parts}")
        if st.st_blocks * 512 > 16 << 20:
            wrong.append(f"written back dense: {st.st_blocks * 512} bytes allocated on the host")
    assert not wrong, f"{wrong}\n{r.stdout}\n{r.stderr[-2000:]}"
