"""Changes made outside the sandbox while an agent's session is open (`envgit claude`: its
first step, marked `agent-session`, is live until the agent exits): the person's edit of an
escape route (envgit.yaml in their editor, a git hook) is recorded as theirs, an `outside`
step of those paths only, and never as the next step's escape route, while what a sandbox
could have written (the agent's own sandbox, a step) is still charged to a step."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import ENVGIT
from envgit.daemon.client import connect
from envgit.paths import Project
from envgit.sandbox.seccomp import program
from modelserver import Call, ModelServer, agent_bin, agent_command, claude_env


class AgentSession:
    """An agent's session as `envgit claude` opens it, without the agent: the record-only
    step marked agent-session, and a long-lived sandbox of the daemon's `spec` (inner socket
    bound in, as Claude's own) running `script`."""

    def __init__(self, proj, session, script):
        self.proj, self.session = proj, session
        self.conn = connect(Project(str(proj.root)))
        began = self.conn.request({"op": "begin", "record_only": True, "argv": ["claude"], "cwd": str(proj.root),
                                   "env": {}, "pid": os.getpid(), "uid": os.getuid(), "session": session,
                                   "marks": ["agent-session"]})
        self.step = began["step"]
        spec = self.conn.request({"op": "spec", "argv": ["/bin/sh", "-c", script], "cwd": str(proj.root),
                                  "env": proj.env, "session": session, "step": self.step, "inner": True})
        assert "bwrap" in spec, spec
        fd = os.memfd_create("s", 0)
        os.write(fd, program())
        os.lseek(fd, 0, 0)
        self.proc = subprocess.Popen([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]],
                                     env=spec["env"], pass_fds=[fd], start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(fd)
        self.tmp = proj.root / ".envgit" / "sessions" / session / "tmp"    # its /tmp

    def wait_for(self, path, what):
        for _ in range(600):                # 30 s: a sandbox's start on a loaded machine
            if path.exists():
                return
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            time.sleep(0.05)
        raise AssertionError(f"the agent's sandbox never {what}")

    def end(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        return self.conn.request({"op": "end", "step": self.step, "exit_code": 0, "signal": None,
                                  "duration_ms": 1})


def log(proj):
    return {s["id"]: s for s in json.loads(proj.envgit("log", "--json", check=True).stdout)}


def paths_of(step):
    return sorted(p["path"] for p in (step.get("snapshot") or {}).get("paths", []))


def save_by_rename(path, more):
    """An editor's save (vim, emacs, JetBrains): a new file renamed over the old one, which
    detaches a read-only bind a sandbox has on it (the kernel drops a mount on a dentry
    renamed over)."""
    new = path.parent / f".{path.name}.swp"
    new.write_text(path.read_text() + more)
    os.replace(new, path)


def test_the_persons_edit_of_escape_routes_during_an_agent_session_is_theirs(proj):
    """The person saves envgit.yaml and adds a git hook from the host while the agent's
    session is open (before its first step) and its sandbox holds a draft it has not recorded
    yet: the next step
    (`true`) is not told it wrote an escape route, nothing is taken back, and an `outside`
    step holds exactly the person's two paths (the draft is not in it); the hook edited again
    after that step is theirs too when the session ends, not the session step's."""
    assert proj.run("true").returncode == 0
    agent = AgentSession(proj, "claude-outside-1", "echo draft > notes.txt; exec sleep 60")
    try:
        agent.wait_for(proj.root / "notes.txt", "wrote its draft")
        save_by_rename(proj.root / "envgit.yaml", "# the person's note\n")
        hook = proj.root / ".git" / "hooks" / "pre-commit"
        hook.write_text("#!/bin/sh\necho the person's hook\n")
        hook.chmod(0o755)
        r = proj.run("true")
        assert r.returncode == 0, r.stderr
        assert "ESCAPE ROUTE" not in r.stderr and "took back" not in r.stderr, r.stderr
        assert hook.exists() and "the person's note" in (proj.root / "envgit.yaml").read_text()
        steps = log(proj)
        true_step = max(i for i, s in steps.items() if s["argv"] == ["sh", "-c", "true"])
        outside = [s for i, s in steps.items() if agent.step < i < true_step and "outside" in s["marks"]]
        assert len(outside) == 1, steps
        assert paths_of(outside[0]) == [".git/hooks/pre-commit", "envgit.yaml"], outside[0]
        assert "sandbox-alive" not in outside[0]["marks"], outside[0]
        mine = steps[true_step]
        assert "escape-route-written" not in mine["marks"] and not mine.get("escape_routes"), mine
        assert "notes.txt" in paths_of(mine), mine          # the agent's draft is a step's, not the person's
        hook.write_text("#!/bin/sh\necho the person's hook, again\n")    # after the session's last step
        ended = agent.end()
        assert "escape-route-written" not in ended["marks"], ended
        at_end = [s for i, s in log(proj).items() if i > true_step and "outside" in s["marks"]]
        assert [paths_of(s) for s in at_end] == [[".git/hooks/pre-commit"]], at_end
        assert at_end[0]["outside"]["before"] == "agent-end", at_end
    finally:
        agent.end()


def test_what_a_sandbox_could_write_is_still_a_steps_escape_route(proj):
    """The same session, where the agent's own sandbox also writes a `mark` route (writable in
    every sandbox) and creates a protected one that was absent when it started (so never bound
    there), and the next step creates an .envrc: all three are that step's escape routes (said
    loudly, the protected ones taken back); only the person's envgit.yaml edit is theirs."""
    assert proj.run("true").returncode == 0
    agent = AgentSession(proj, "claude-outside-2",
                         "echo '*.bin filter=x' > .gitattributes; echo '{}' > .mcp.json; exec sleep 60")
    try:
        agent.wait_for(proj.root / ".mcp.json", "wrote .mcp.json")
        with open(proj.root / "envgit.yaml", "a") as f:          # the person's editor, in place
            f.write("# the person's note\n")
        r = proj.run("echo 'eval $(curl x)' > .envrc")
        assert "WROTE AN ESCAPE ROUTE" in r.stderr and ".gitattributes" in r.stderr, r.stderr
        assert "took back" in r.stderr and ".envrc" in r.stderr and ".mcp.json" in r.stderr, r.stderr
        assert not (proj.root / ".envrc").exists() and not (proj.root / ".mcp.json").exists()
        steps = log(proj)
        step = max(i for i, s in steps.items() if s["argv"][:2] == ["sh", "-c"] and ".envrc" in s["argv"][2])
        assert sorted(steps[step]["escape_routes"]) == [".envrc", ".gitattributes", ".mcp.json"], steps[step]
        outside = [s for i, s in steps.items() if agent.step < i < step and "outside" in s["marks"]]
        assert [paths_of(s) for s in outside] == [["envgit.yaml"]], outside
    finally:
        agent.end()


def test_a_route_the_person_replaced_is_theirs_and_then_writable_in_the_agents_sandbox(proj):
    """An editor that saves by renaming a new file over envgit.yaml detaches the read-only bind
    the agent's sandbox had on it (the kernel drops a mount on a dentry renamed over): that
    change is the person's; a later write from the agent's sandbox, which it now can make, is
    the next step's escape route, taken back to the person's version."""
    assert proj.run("true").returncode == 0
    agent = AgentSession(proj, "claude-outside-3",
                         "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo '# the agent' >> envgit.yaml; "
                         "touch /tmp/done; exec sleep 60")
    try:
        assert proj.run("true").returncode == 0          # a step of the session before the edit
        policy = proj.root / "envgit.yaml"
        save_by_rename(policy, "# the person's note\n")
        r = proj.run("true")
        assert "ESCAPE ROUTE" not in r.stderr and "took back" not in r.stderr, r.stderr
        (agent.tmp / "go").write_text("")
        agent.wait_for(agent.tmp / "done", "wrote envgit.yaml")
        assert "# the agent" in policy.read_text()
        r = proj.run("true")
        assert "took back" in r.stderr and "envgit.yaml" in r.stderr, r.stderr
        text = policy.read_text()           # back to the person's version
        assert "# the person's note" in text and "# the agent" not in text, text
        steps = log(proj)
        last = max(i for i, s in steps.items() if s["argv"] == ["sh", "-c", "true"])
        assert "escape-route-written" in steps[last]["marks"] and steps[last]["escape_routes"] == ["envgit.yaml"]
        outside = [s for i, s in steps.items() if i > agent.step and "outside" in s["marks"]]
        assert [paths_of(s) for s in outside] == [["envgit.yaml"]], outside
    finally:
        agent.end()


def test_the_persons_edits_while_the_real_claude_waits_for_its_model_are_theirs(proj):
    """The real Claude Code in its sandbox (`envgit claude -p`, the scripted model server):
    between its two Bash calls, while it waits for the model, the person saves envgit.yaml the
    way most editors do (a new file renamed over it, which detaches Claude's read-only bind)
    and adds a git hook. The second call's step wrote no escape route, nothing is taken back,
    the person's two paths are an `outside` step, and the session's step is not charged."""
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (Claude reaches its model only through the gate)")
    claude = agent_bin("claude")
    hook = proj.root / ".git" / "hooks" / "pre-commit"

    def persons_edit():
        save_by_rename(proj.root / "envgit.yaml", "# the person's note\n")
        hook.write_text("#!/bin/sh\necho the person's hook\n")
        hook.chmod(0o755)

    class PersonBetweenCalls(ModelServer):
        def _next(self, body):
            main, item = super()._next(body)
            if main and item[0] == "call" and item[3]["command"] == "echo second":
                persons_edit()          # Claude waits for this answer: its first call has ended
            return main, item

    bash = [Call("Bash", {"command": c, "description": "scripted"}) for c in ("true", "echo second")]
    proj.env["ENVGIT_RESOLVE"] = "model.example.test=127.0.0.1"
    with PersonBetweenCalls(bash) as model:
        proj.write_policy(f'version: 1\nnetwork:\n  allow: ["model.example.test:{model.port}"]\n')
        r = subprocess.run([*agent_command(ENVGIT, "claude"), "-p", "go", "--dangerously-skip-permissions"],
                           cwd=proj.root, env={**proj.env, **claude_env(f"http://model.example.test:{model.port}"),
                                               "ENVGIT_CLAUDE_BIN": claude},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "second" in model.results()[-1][2], model.results()
    assert "escape route" not in r.stderr.lower(), r.stderr      # said at the agent's exit, if any
    assert hook.exists() and "the person's note" in (proj.root / "envgit.yaml").read_text()
    steps = log(proj)
    session = next(s for s in steps.values() if "agent-session" in s["marks"])
    second = next(i for i, s in steps.items() if s["argv"] == ["bash", "-c", "echo second"])
    outside = [s for i, s in steps.items() if session["id"] < i < second and "outside" in s["marks"]]
    assert [paths_of(s) for s in outside] == [[".git/hooks/pre-commit", "envgit.yaml"]], steps
    for s in (steps[second], steps[session["id"]]):
        assert "escape-route-written" not in s["marks"] and not s.get("escape_routes"), s


def test_the_persons_edit_after_the_sessions_last_step_is_theirs_at_its_end(proj):
    """A session that ran no step: the person saves envgit.yaml while it is open. Its end
    records the change as theirs (an `outside` step before the session step's end), neither
    charged to the session step nor taken back to the version it began with."""
    assert proj.run("true").returncode == 0
    agent = AgentSession(proj, "claude-outside-4", "exec sleep 60")
    try:
        time.sleep(0.3)                 # its sandbox is up (it has the project mounted)
        save_by_rename(proj.root / "envgit.yaml", "# the person's note\n")
    finally:
        ended = agent.end()
    assert "escape-route-written" not in ended["marks"] and not ended.get("notices"), ended
    assert "# the person's note" in (proj.root / "envgit.yaml").read_text()
    outside = [s for i, s in log(proj).items() if i > agent.step and "outside" in s["marks"]]
    assert [(paths_of(s), s["outside"]["before"]) for s in outside] == [(["envgit.yaml"], "agent-end")], outside
