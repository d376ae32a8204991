"""`envgit claude`: the real Claude Code (pinned, from npm) in `-p` mode, running inside envgit's
sandbox, against the scripted model server. Claude reaches the model only through the
network gate (the server is on the host's loopback, which the sandbox cannot reach: the
daemon resolves model.example.test to it), so every one of its requests is recorded on the
session's step. Each Bash tool call is a step of its own carrying its tool_use id (the shell
prefix shim, over the inner control socket); each Write/Edit a recorded step with a snapshot
(the PostToolUse hook); Claude's own Read and Write meet the sandbox's mounts."""

import json
import shutil
import subprocess

import pytest

from conftest import CANARY, ENVGIT, Env, make_home
from envgit.agents.claude_shim import model_command
from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
from modelserver import Call, ModelServer, agent_bin, agent_command, claude_env, clone_for_push

MODEL_HOST = "model.example.test"
RESOLVE = f"{MODEL_HOST}=127.0.0.1"

pytestmark = pytest.mark.skipif(shutil.which("socat") is None,
                                reason="socat is not installed (the network gate needs it, and Claude "
                                       "reaches its model only through the gate)")


@pytest.fixture(scope="session")
def claude_bin():
    return agent_bin("claude")


@pytest.fixture
def cproj(proj):
    """The project, its daemon (started by the first step) resolving the model server's name."""
    proj.env["ENVGIT_RESOLVE"] = RESOLVE
    return proj


def policy(model, *more_hosts):
    hosts = json.dumps([f"{MODEL_HOST}:{model.port}", *more_hosts])
    return f"version: 1\nnetwork:\n  allow: {hosts}\nirreversible:\n  - preset: default\n"


def run_claude(env: Env, claude_bin, model, prompt="go", timeout=240):
    url = f"http://{MODEL_HOST}:{model.port}"
    return subprocess.run([*agent_command(ENVGIT, "claude"), "-p", prompt, "--dangerously-skip-permissions",
                           "--output-format", "stream-json", "--verbose"],
                          cwd=env.root, env={**env.env, **claude_env(url), "ENVGIT_CLAUDE_BIN": claude_bin},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def show(env, n):
    return json.loads(env.envgit("show", str(n), "--json", check=True).stdout)


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


def test_the_hosts_claude_needs_and_the_policy_lacks_are_said_at_launch(proj, tmp_path):
    import io

    from envgit.agents.claude import needs
    from envgit.agents.hostoffer import offer
    from envgit.paths import Project
    project = Project(str(proj.root))
    home = str(tmp_path)

    def said(env, cfg=None):
        out = io.StringIO()
        offer(project, "Claude", needs(env, cfg, home), stdin=io.StringIO(), out=out)
        return out.getvalue()
    first = said({})              # a first launch: the model, and the connectivity check's hosts
    assert "api.anthropic.com" in first and "platform.claude.com" in first and "network.allow" in first
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / ".claude.json").write_text('{"hasCompletedOnboarding": true}')
    later = said({"ANTHROPIC_BASE_URL": "http://model.example.test:8080"}, str(tmp_path / "cfg"))
    assert '"model.example.test:8080"' in later and "platform.claude.com" not in later
    assert "platform.claude.com" not in said({"ANTHROPIC_AUTH_TOKEN": "t"})     # a gateway's token
    proj.write_policy('version: 1\nnetwork:\n  allow: ["api.anthropic.com", "platform.claude.com"]\n')
    assert said({}) == ""


def test_steps_are_the_tool_calls_in_order(cproj, claude_bin):
    path = str(cproj.root / "notes.txt")
    with ModelServer([bash("echo from-the-model; echo to-stderr >&2"),
                      Call("Write", {"file_path": path, "content": "first line\n"}),
                      bash("wc -l notes.txt")]) as model:
        cproj.write_policy(policy(model))
        r = run_claude(cproj, claude_bin, model)
    assert r.returncode == 0, r.stderr
    (c1, _, out1), (c2, _, _), (c3, _, out3) = model.results()
    assert "from-the-model" in out1 and "to-stderr" in out1 and "1 notes.txt" in out3
    session, *calls = steps(cproj)
    assert [(s["argv"], s["tool_call_id"]) for s in calls] == [
        (["bash", "-c", "echo from-the-model; echo to-stderr >&2"], c1),
        (["claude:Write", path], c2),
        (["bash", "-c", "wc -l notes.txt"], c3)]
    assert session["argv"][:2] == ["claude", "-p"] and "agent-session" in session["marks"]
    assert session["exit_code"] == 0
    edit = calls[1]
    assert "agent-edit" in edit["marks"]
    assert {"path": "notes.txt", "status": "added"} in edit["snapshot"]["paths"]
    assert len({s["session"] for s in steps(cproj)}) == 1 and session["session"].startswith("claude-")
    # Claude's own traffic went through the gate, every request of it on the session's step
    asked = show(cproj, session["id"])["requests"]
    assert len(asked) == len(model.log) >= 4
    assert all(q["host"] == MODEL_HOST and q["decision"] == "allow" and q["path"].startswith("/v1/messages")
               for q in asked), asked
    assert not any(show(cproj, s["id"])["requests"] for s in calls)


def test_an_edit_can_be_rewound(cproj, claude_bin):
    app = cproj.root / "app.py"
    app.write_text("print('one')\n")
    with ModelServer([Call("Read", {"file_path": str(app)}),
                      Call("Edit", {"file_path": str(app), "old_string": "one", "new_string": "two"}),
                      bash("cat app.py")]) as model:
        cproj.write_policy(policy(model))
        cproj.run("true")        # step 1: the tree before the edit (a first step's baseline is taken at its begin)
        r = run_claude(cproj, claude_bin, model)
    assert r.returncode == 0, r.stderr
    assert app.read_text() == "print('two')\n"
    _, _, edit, cat = steps(cproj)
    assert edit["argv"] == ["claude:Edit", str(app)] and "print('two')" in model.results()[-1][2]
    assert edit["tool_call_id"] == model.results()[1][0]
    assert {"path": "app.py", "status": "modified"} in edit["snapshot"]["paths"]
    cproj.envgit("rewind", "1", "--yes", check=True)                      # back to before the edit
    assert app.read_text() == "print('one')\n"


def test_claudes_own_file_tools_are_under_the_mounts(cproj, claude_bin):
    """No hook checks a path: Read and Write run in Claude's process, inside the sandbox;
    the hooks envgit adds are only the Bash call's id and the edits' record."""
    key, outside = cproj.home / ".ssh" / "id_ed25519", cproj.home / "outside.txt"
    with ModelServer([Call("Read", {"file_path": str(key)}),
                      Call("Write", {"file_path": str(outside), "content": "escaped\n"}),
                      bash(f"cat {key}; echo key=$ANTHROPIC_API_KEY; ls ~/.claude")]) as model:
        cproj.write_policy(policy(model))
        r = run_claude(cproj, claude_bin, model)
    assert r.returncode == 0, r.stderr
    (_, _, read), (_, _, write), (_, _, cat) = model.results()
    # the home inside has the key's placeholder only: Read gets its line, naming the rule
    assert "is hidden from this sandbox by filesystem.deny_read '~/.ssh'" in read, read
    assert "read-only file system" in write.lower(), write    # nothing outside the project is writable
    assert not outside.exists() and key.read_text().strip() == CANARY
    # the Bash call's tool result carries envgit's line, said as the step opened the key
    assert "~/.ssh/id_ed25519 is hidden from steps by filesystem.deny_read '~/.ssh'" in cat, cat
    # what Claude holds (its API key, ~/.claude) is not its Bash steps': they have the policy's view
    assert "key=\n" in cat and "cannot access '/" in cat and cat.count("No such file") == 1, cat
    assert CANARY not in json.dumps([e.body for e in model.log])
    assert not any(s["argv"][0].startswith("claude:") for s in steps(cproj))


def test_claudes_config_in_its_state_dir_is_read_only_inside(cproj, claude_bin):
    """~/.claude is read-only inside but for the directories Claude writes during a session: its
    Write tool cannot leave an MCP server, a hook or a program there for the next plain
    `claude` to run outside the sandbox, and the session's own state is still written."""
    state = cproj.home / ".claude"
    marker = cproj.home / "mcp-ran"
    mcp = json.dumps({"mcpServers": {"x": {"command": "touch", "args": [str(marker)]}}})
    escapes = [state / ".config.json", state / ".mcp.json", state / "settings.json",
               state / "local" / "claude", state / "rules" / "r.md", state / "newdir" / "x.json"]
    todo = state / "todos" / "mine.json"
    with ModelServer([*(Call("Write", {"file_path": str(p), "content": mcp}) for p in escapes),
                      Call("Write", {"file_path": str(todo), "content": "[]\n"})]) as model:
        cproj.write_policy(policy(model))
        r = run_claude(cproj, claude_bin, model)
    assert r.returncode == 0, r.stderr
    *refused, (_, _, ok) = model.results()
    assert all("read-only file system" in text.lower() for _, _, text in refused), refused
    for p in escapes:
        assert not p.exists() or "mcpServers" not in p.read_text(), p
    assert not marker.exists()
    assert todo.read_text() == "[]\n", ok                              # its state dirs: writable
    assert any((state / "projects").rglob("*.jsonl"))                  # the session's transcript


def test_push_behind_a_variable_is_refused_at_the_request(tmp_path, remote, claude_bin):
    home = make_home(tmp_path)
    env = Env(home, home / "app", {"ENVGIT_RESOLVE": f"{remote.resolve},{RESOLVE}",
                                   "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    clone_for_push(env, remote)
    try:
        before = remote.refs()
        with ModelServer([bash("echo change >> README && git commit -qam change"),
                          bash("g=git; $g push origin main")]) as model:
            env.write_policy(policy(model, remote.url.split("/")[2]))
            r = run_claude(env, claude_bin, model)
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


def test_a_declined_host_offer_is_not_asked_again_in_the_project(proj):
    import io

    from envgit.agents.hostoffer import offer
    from envgit.paths import Project

    class Tty(io.StringIO):
        def isatty(self):
            return True
    project = Project(str(proj.root))
    needs = [("model.example.test", 8080, "its model API")]
    out = Tty()
    offer(project, "Claude", needs, stdin=Tty("n\n"), out=out)
    assert "[y/N]" in out.getvalue() and "not asked again" in out.getvalue()
    out = Tty()
    offer(project, "Claude", needs, stdin=Tty("y\n"), out=out)          # not read: not asked
    assert "[y/N]" not in out.getvalue() and '"model.example.test:8080"' in out.getvalue()
    assert "model.example.test" not in (proj.root / "envgit.yaml").read_text()
