"""`envgit claude`: the real Claude Code (pinned, from npm) in `-p` mode against the scripted
model server. Each Bash tool call is a step carrying its tool_use id (the shell prefix shim),
each Write/Edit a recorded step with a snapshot (the PostToolUse hook)."""

import json
import shutil
import subprocess

import pytest

from conftest import CANARY, ENVGIT, Env, make_home
from gitserver import GitServer
from modelserver import Call, ModelServer, agent_bin, agent_command, claude_env, clone_for_push

from envgit.agents.claude_shim import model_command


@pytest.fixture(scope="session")
def claude_bin():
    return agent_bin("claude")


def run_claude(env: Env, claude_bin, script, prompt="go", timeout=240):
    with ModelServer(script) as model:
        r = subprocess.run([*agent_command(ENVGIT, "claude"), "-p", prompt, "--dangerously-skip-permissions",
                            "--output-format", "stream-json", "--verbose"],
                           cwd=env.root, env={**env.env, **claude_env(model.url), "ENVGIT_CLAUDE_BIN": claude_bin},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return r, model


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def bash(cmd):
    return Call("Bash", {"command": cmd, "description": "scripted"})


def test_the_shim_finds_the_model_command_in_claudes_string():
    tail = " < /dev/null && pwd -P >| /tmp/claude-0215-cwd"
    head = "source /root/.claude/shell-snapshots/snapshot-bash-1-x.sh 2>/dev/null || true && "
    assert model_command(head + "eval 'echo '\\''a b'\\'' | wc -l'" + tail) == \
        ("echo 'a b' | wc -l", "/tmp/claude-0215-cwd")
    assert model_command(head + "eval pwd" + tail) == ("pwd", "/tmp/claude-0215-cwd")
    assert model_command("cat > /tmp/hook-input.json") is None             # a hook command
    assert model_command("npx -y @modelcontextprotocol/server-filesystem .") is None   # an MCP server


def test_steps_are_the_tool_calls_in_order(proj, claude_bin):
    path = str(proj.root / "notes.txt")
    r, model = run_claude(proj, claude_bin, [
        bash("echo from-the-model; echo to-stderr >&2"),
        Call("Write", {"file_path": path, "content": "first line\n"}),
        bash("wc -l notes.txt"),
    ])
    assert r.returncode == 0, r.stderr
    (c1, _, out1), (c2, _, _), (c3, _, out3) = model.results()
    assert "from-the-model" in out1 and "to-stderr" in out1 and "1 notes.txt" in out3
    got = [(s["argv"], s["tool_call_id"]) for s in steps(proj)]
    assert got == [(["bash", "-c", "echo from-the-model; echo to-stderr >&2"], c1),
                   (["claude:Write", path], c2),
                   (["bash", "-c", "wc -l notes.txt"], c3)]
    edit = steps(proj)[1]
    assert "agent-edit" in edit["marks"]
    assert {"path": "notes.txt", "status": "added"} in edit["snapshot"]["paths"]
    sessions = {s["session"] for s in steps(proj)}
    assert len(sessions) == 1 and sessions.pop().startswith("claude-")


def test_an_edit_can_be_rewound(proj, claude_bin):
    app = proj.root / "app.py"
    app.write_text("print('one')\n")
    proj.run("true")        # step 1: the tree before the edit (a first step's baseline is taken at its begin)
    r, model = run_claude(proj, claude_bin, [
        Call("Read", {"file_path": str(app)}),
        Call("Edit", {"file_path": str(app), "old_string": "one", "new_string": "two"}),
        bash("cat app.py"),
    ])
    assert r.returncode == 0, r.stderr
    assert app.read_text() == "print('two')\n"
    _, edit, cat = steps(proj)
    assert edit["argv"] == ["claude:Edit", str(app)] and "print('two')" in model.results()[-1][2]
    assert edit["tool_call_id"] == model.results()[1][0]
    assert {"path": "app.py", "status": "modified"} in edit["snapshot"]["paths"]
    proj.envgit("rewind", "1", "--yes", check=True)                      # back to before the edit
    assert app.read_text() == "print('one')\n"


def test_reading_the_ssh_key_through_the_read_tool_is_refused(proj, claude_bin):
    key = str(proj.home / ".ssh" / "id_ed25519")
    r, model = run_claude(proj, claude_bin, [
        Call("Read", {"file_path": key}),
        bash(f"cat {key}"),
    ])
    assert r.returncode == 0, r.stderr
    (_, _, read), (_, _, cat) = model.results()
    assert "deny_read ~/.ssh" in read, read
    assert "No such file" in cat or "Permission denied" in cat, cat
    assert CANARY not in json.dumps([e.body for e in model.log])


@pytest.fixture
def remote(tmp_path):
    with GitServer(root=tmp_path / "srv") as srv:
        yield srv


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed (the network gate needs it)")
def test_push_behind_a_variable_is_refused_at_the_request(tmp_path, remote, claude_bin):
    home = make_home(tmp_path)
    env = Env(home, home / "app", {"ENVGIT_RESOLVE": remote.resolve,
                                   "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    clone_for_push(env, remote)
    try:
        before = remote.refs()
        r, model = run_claude(env, claude_bin, [
            bash("echo change >> README && git commit -qam change"),
            bash("g=git; $g push origin main"),
        ])
        assert r.returncode == 0, r.stderr
        (_, _, _), (push_call, _, pushed) = model.results()
        assert "[remote rejected]" in pushed and "preset:default/git-push" in pushed, pushed
        assert remote.refs() == before
        push = steps(env)[-1]
        assert push["argv"] == ["bash", "-c", "g=git; $g push origin main"] and push["exit_code"] != 0
        assert push["tool_call_id"] == push_call
        assert any(q["decision"] == "deny" and "git-receive-pack" in q["path"] for q in push["requests"])
    finally:
        env.stop()
