"""Red team, continued (test_landlock_attacks.py has the why): what a Landlock step leaves
behind it (processes, hooks, the state's link, a half-finished step whose client was killed),
and what a root step may do to the host's files and the policy of a step beside it. Each case
fails when the attack works; the cases of one uid share one project (`every_case`)."""

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from harness import every_case, steps_of
from kit import nouserns
from landlockkit import kill_client, py, remove, start, stop_pid_in, wait_for

# what a case's step runs once it has done its work: its pid in ll-started (killed_midway)
STARTED = "echo $$ > ll-started"

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("landlock"),
              pytest.mark.skipif(not nouserns.available(), reason="making a host without user "
                                 "namespaces needs root and user namespaces (kit/nouserns.py)")]


@pytest.mark.both_uids("the daemon that restores the link and takes routes back runs as the step's uid")
def test_what_a_landlock_step_leaves_behind(ll):
    """Claims: processes a step leaves behind end with it, however the step ends (its command
    returning, or its `envgit run` killed: an agent's timeout); the `.envgit` link comes back
    after any step, so `envgit log`, `fsck` and `rewind` keep working; the project's state
    (journal, snapshots, the daemon's socket) out of the step's reach, its modes included, and
    a journal that cannot be read said, never shown as empty; an escape route a step
    wrote is taken back, so the person's next `git commit` runs nothing of the step's; how a
    step ended is recorded as it was (its reporter, under bubblewrap its pid 1, is out of its
    reach). Each case is one step; a marker file written, a hook run, a mode changed, `envgit
    log` failing or a forged exit recorded is the attack working."""
    a = ll
    link = a.root / ".envgit"
    state = os.readlink(link)
    started, late = a.root / "ll-started", a.root / "ll-late"
    hook, hook_ran = a.root / ".git" / "hooks" / "pre-commit", a.home / "ll-hook-ran"

    def relink():
        """Put the project back as the person would, for the next case."""
        os.chmod(a.root, 0o755)
        if os.path.islink(link) and os.readlink(link) == state:
            return
        if os.path.lexists(link):
            remove(link)
        os.symlink(state, link)
        if a.user:
            import pwd
            pw = pwd.getpwnam(a.user)
            os.lchown(link, pw.pw_uid, pw.pw_gid)
        for p in a.root.glob(".envgit-left-by-step-*"):
            remove(p)

    def killed_midway(script):
        """`script` runs as a step that writes its pid to ll-started (STARTED) once it has done
        what the case needs; once it has, the client is killed, and the daemon's end of the
        interrupted step (and the take-back it records) is waited for: a fixed two seconds was
        not always enough on a loaded machine, nor was a marker written before the case's work."""
        remove(started, late)
        with tempfile.TemporaryFile() as out:
            p = start(a, script, out)
            try:
                assert wait_for(started), "the step never started"
            finally:
                kill_client(p)
        t0 = time.monotonic()
        while not interrupted_end_done(script) and time.monotonic() - t0 < 60:
            time.sleep(0.2)

    def interrupted_end_done(script):
        try:
            steps = steps_of(a)
        except AssertionError:      # no `.envgit` link (yet): no command finds the project
            return False
        mine = [s for s in steps if s["argv"] == ["sh", "-c", script]]
        if not mine or mine[-1]["status"] == "running":
            return False
        if not mine[-1].get("taken_back"):
            return True
        back = [s for s in steps if s["argv"] == ["envgit", "take-back", str(mine[-1]["id"])]]
        return bool(back) and back[-1]["status"] != "running"

    def thread_child():
        """A process forked by a thread of a background process is not in
        /proc/PID/task/PID/children of that process: the launcher does not see it to kill it,
        then waits for it once it is its own child (nothing ends it)."""
        remove(late)
        code = ("import os, threading, time\n"
                "if os.fork() == 0:\n"
                "    def t():\n"
                "        if os.fork() == 0:\n"
                "            time.sleep(3); open('ll-late', 'w').write('late'); os._exit(0)\n"
                "        time.sleep(60)\n"
                "    threading.Thread(target=t, daemon=True).start()\n"
                "    time.sleep(60); os._exit(0)\n")
        try:
            a.run(py(code), timeout=90)
            time.sleep(1)
            assert not late.exists(), "a process the step left behind ran on after its command ended"
        finally:
            remove(late)

    def client_killed():
        """No pid namespace dies with the launcher: only it and the reporter are killed (their
        parent-death signal), and the command is left running, unsandboxed by nothing but its
        Landlock domain, and recorded by nothing."""
        try:
            killed_midway(f"{STARTED}; sleep 4; echo late > ll-late")
            time.sleep(4)
            assert not late.exists(), "the step's command ran on after its `envgit run` was killed"
        finally:
            stop_pid_in(started)
            remove(started, late)

    def link_gone_interrupted():
        """The link removed by a step whose client is then killed: the daemon's end of an
        interrupted step does not restore it, and with no `.envgit` no envgit command finds
        the project (not even `envgit run`, whose step's end would)."""
        try:
            killed_midway(f"rm -f .envgit; {STARTED}; exec sleep 20")
            r = a.envgit("log")
            assert r.returncode == 0, f"after the step, envgit log: {r.stderr.strip()}"
            r = a.envgit("fsck")
            assert r.returncode == 0, f"after the step, envgit fsck: {r.stderr.strip()}"
        finally:
            stop_pid_in(started)
            remove(started)
            relink()

    def link_gone_root_read_only():
        """The link removed and the project's root made read-only (chmod is no Landlock
        right): a daemon that is not root cannot make the link again."""
        try:
            a.run("rm -f .envgit; chmod 555 .", timeout=60)
            r = a.envgit("log")
            assert r.returncode == 0, f"after the step, envgit log: {r.stderr.strip()}"
        finally:
            relink()

    def hook_interrupted():
        """.git/hooks is writable under Landlock and kept only by the take-back at the step's
        end; a step whose client is killed gets an `interrupted` end, which takes nothing
        back."""
        remove(hook, hook_ran)
        try:
            killed_midway(f"printf '#!/bin/sh\\ntouch {hook_ran}\\n' > .git/hooks/pre-commit; "
                          f"chmod +x .git/hooks/pre-commit; {STARTED}; exec sleep 20")
            a.host("git -c user.email=a@b -c user.name=a commit -q --allow-empty -m ll")
            assert not hook_ran.exists(), "the person's git commit ran a hook a step wrote"
        finally:
            stop_pid_in(started)
            remove(started, hook, hook_ran)

    def reporter_killed():
        """The reporter is the step's pid 1 under bubblewrap (no signal from inside reaches
        it); here it is a process of the step's own domain and uid: killed, the step's end
        says SIGKILL for a command that exited 0."""
        a.run("kill -9 $PPID; exit 0")
        got = json.loads(a.envgit("show", "last", "--json", check=True).stdout)
        assert got.get("exit_code") == 0, f"recorded {got.get('exit_code')} / {got.get('signal')} for `exit 0`"

    def journal_through_tmpdir():
        """The step's TMPDIR is a directory of the project's state (step-tmp/N): its parents
        hold the journal and the snapshots, reached by no rule of the step's."""
        r = a.run("cat $TMPDIR/../../journal.sqlite | head -c 64; ls $TMPDIR/../..; "
                  "ln -s ../../journal.sqlite $TMPDIR/j && head -c 64 $TMPDIR/j; "
                  "echo planted > $TMPDIR/../../ll-planted; mkdir $TMPDIR/../99; true")
        assert "SQLite format" not in r.stdout and "journal" not in r.stdout, r.stdout
        assert not os.path.exists(os.path.join(state, "ll-planted"))
        assert not os.path.exists(os.path.join(state, "step-tmp", "99"))

    def modes_of_state():
        st = os.path.join(state, "journal.sqlite"), os.path.join(state, "daemon.sock")
        return {p: os.stat(p).st_mode & 0o7777 for p in (state, *st) if os.path.exists(p)}

    saved_modes = modes_of_state()

    def put_modes_back():
        for p, m in saved_modes.items():
            os.chmod(p, m)

    def state_opened():
        """chmod(2) is no Landlock right, and it follows the `.envgit` link to the state dir
        the step cannot open: the daemon's socket (steps, approvals, rewinds as the person)
        and the journal opened to every user of the host."""
        try:
            a.run("chmod 0777 .envgit/ .envgit/daemon.sock .envgit/journal.sqlite; true")
            now = modes_of_state()
            assert not now[state] & 0o077 and all(not m & 0o022 for m in now.values()), \
                {os.path.basename(p): oct(m) for p, m in now.items()}
        finally:
            put_modes_back()

    def state_closed():
        """The same, the other way: the state dir made unreadable to its owner, envgit's
        commands (run as a user, whom no capability lets past a mode) cannot read it."""
        before = len(steps_of(a))
        try:
            a.run("chmod 0 .envgit/; true")
            r = a.envgit("log", "--json")
            got = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
            got = got.get("steps", got) if isinstance(got, dict) else got
            assert got is not None and len(got) > before, \
                f"after the step, envgit log shows {got if got is None else len(got)} steps of " \
                f"{before + 1}, and says: {r.stderr.strip() or r.stdout.strip()[:200]}"
        finally:
            put_modes_back()

    cases = {
        "the journal and the state dir through the step's TMPDIR": journal_through_tmpdir,
        "the state dir, its socket and journal opened to every user": state_opened,
        "a child of a thread of a background process": thread_child,
        "the command, when its envgit run is killed": client_killed,
        "a hook written, the step interrupted": hook_interrupted,
        "the reporter killed": reporter_killed,
        "the link removed, the step interrupted": link_gone_interrupted,
        "the link removed, the project's root made read-only": link_gone_root_read_only,
        "the state dir made unreadable": state_closed,
    }
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        relink()
    # every step above, however it ended, says it ran with the weaker sandbox
    ran = [s for s in steps_of(a) if s["argv"][:1] == ["sh"]]
    assert ran and all("sandbox-degraded" in s["marks"] for s in ran), ran


# --- the policy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ll", ["root"], indirect=True)
def test_a_root_landlock_step(ll):
    """Claims, for a root step (uid 0 on the host here, its capabilities dropped): nothing
    outside the project, its TMPDIR and the project cache writable; a step cannot choose its
    policy; no chown of another's file; no setuid or setgid bit set by any call. Under Landlock
    envgit.yaml is writable (WEAKER), taken back at the step's end; a step that rewrites it and
    keeps running widens the policy the daemon reads for every step begun meanwhile (an
    agent's next tool call, or its own background one). Oracles: a file outside, writable by
    anyone on the host, unchanged; owners and modes on disk."""
    a = ll
    base = Path(tempfile.mkdtemp(prefix="envgit-llp-"))
    os.chmod(base, 0o755)
    outside = base / "outside.txt"
    outside.write_text("outside\n")
    os.chmod(outside, 0o666)
    ready, done = a.root / "ll-a-ready", a.root / "ll-b-done"
    policy = (a.root / "envgit.yaml").read_bytes()

    def policy_beside():
        widen = py("import os, time\n"
                   "t = open('envgit.yaml').read()\n"
                   f"t = t.replace('allow_write: [\".\"]', 'allow_write: [\".\", \"{outside}\"]')\n"
                   "open('envgit.yaml', 'w').write(t)\n"
                   "open('ll-a-ready', 'w').write('x')\n"
                   "t0 = time.time()\n"
                   "while not os.path.exists('ll-b-done') and time.time() - t0 < 40: time.sleep(0.1)\n")
        assert b'allow_write: ["."]' in policy, "the template changed: this case needs its allow_write line"
        try:
            with tempfile.TemporaryFile() as out:
                p = start(a, widen, out)
                try:
                    assert wait_for(ready), "step A never widened envgit.yaml"
                    a.run(f"echo written-by-step-b > {outside}; true", timeout=60)
                    done.write_text("x")
                    p.wait(60)
                finally:
                    if p.poll() is None:
                        kill_client(p)
            assert outside.read_text() == "outside\n", \
                "a step begun while another had rewritten envgit.yaml wrote outside the project"
        finally:
            remove(ready, done)
            (a.root / "envgit.yaml").write_bytes(policy)

    def chown_others():
        theirs, mine = a.root / "ll-theirs", a.root / "ll-mine"
        theirs.write_text("x")
        os.chown(theirs, 12345, 12345)
        try:
            take = py("import os\nos.lchown('ll-theirs', 0, 0)")
            a.run(f"chown 0:0 ll-theirs; echo y > ll-mine; chown 12345:12345 ll-mine; {take}; true")
            assert os.stat(theirs).st_uid == 12345, "a root step took another user's file"
            assert os.stat(mine).st_uid == 0, "a root step gave a file away (CAP_CHOWN)"
        finally:
            remove(theirs, mine)

    def special_bits():
        d = a.root / "ll-bits"
        code = ("import os\n"
                "for f, how in [('o', lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o4755))),\n"
                "               ('c', lambda p: (open(p, 'w').close(), os.chmod(p, 0o4755))),\n"
                "               ('f', lambda p: (open(p, 'w').close(), os.chmod(os.open(p, os.O_RDONLY), 0o2755))),\n"
                "               ('d', lambda p: os.mkdir(p, 0o2755)),\n"
                "               ('n', lambda p: os.mknod(p, 0o4755))]:\n"
                "    try:\n        how('ll-bits/' + f)\n    except OSError:\n        pass\n")
        try:
            a.run("mkdir -p ll-bits; cp /bin/true ll-bits/t; chmod u+s ll-bits/t; "
                  f"install -m 4755 /bin/true ll-bits/i; {py(code)}; true")
            for p in d.iterdir():
                assert not os.lstat(p).st_mode & 0o6000, f"{p.name}: {oct(os.lstat(p).st_mode)}"
        finally:
            remove(d)

    cases = {
        "envgit.yaml rewritten by a step still running": policy_beside,
        "chown another user's file, give one away": chown_others,
        "setuid and setgid bits by every call": special_bits,
    }
    try:
        every_case(cases, lambda name: cases[name]())
    finally:
        (a.root / "envgit.yaml").write_bytes(policy)
        shutil.rmtree(base, ignore_errors=True)
