"""`envgit mcp` as the MCP server of `envgit claude`: the real Claude Code (pinned, from npm) in
`-p` mode against the scripted model server. Claude starts its stdio MCP servers inside its own
sandbox, where envgit's state is read-only; the shell-prefix shim hands an `envgit mcp` server
to the daemon instead, which runs it on the host for this project, as a sub-session of the
agent's session, on Claude's own pipes."""

import json
import os
import shutil
import subprocess
import time

import pytest

from conftest import ENVGIT, Env
from envgit.agents.claude import settings
from envgit.agents.claude_shim import envgit_mcp
from envgit.daemon.inner import BadRequest, check_request
from kit.mcpservers import servers_left, settled
from modelserver import Call, ModelServer, agent_bin, agent_command, claude_env

MODEL_HOST = "model.example.test"

pytestmark = pytest.mark.skipif(shutil.which("socat") is None,
                                reason="socat is not installed (the network gate needs it, and Claude "
                                       "reaches its model only through the gate)")


@pytest.fixture(scope="session")
def claude_bin():
    return agent_bin("claude")


def run_claude(env: Env, claude_bin, model, *extra, timeout=240):
    url = f"http://{MODEL_HOST}:{model.port}"
    return subprocess.run([*agent_command(ENVGIT, "claude"), "-p", "go", "--dangerously-skip-permissions",
                           "--output-format", "stream-json", "--verbose", *extra],
                          cwd=env.root, env={**env.env, **claude_env(url), "ENVGIT_CLAUDE_BIN": claude_bin,
                                             # MCP tools offered to the model at once, not behind
                                             # Claude's tool search (which the script does not drive)
                                             "ENABLE_TOOL_SEARCH": "false",
                                             # Claude -p sends its first request without waiting for
                                             # its MCP servers unless told to wait (the model then
                                             # finds no envgit tool); a loaded machine (the suite at
                                             # -n 6) can take seconds to start envgit mcp
                                             "MCP_CONNECTION_NONBLOCKING": "false",
                                             "MCP_CONNECT_TIMEOUT_MS": "60000", "MCP_TIMEOUT": "60000",
                                             "ENVGIT_RESOLVE": f"{MODEL_HOST}=127.0.0.1"},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def test_envgit_mcp_in_mcp_json_is_envgits_server_for_the_session(proj, claude_bin):
    proj.env["ENVGIT_RESOLVE"] = f"{MODEL_HOST}=127.0.0.1"
    (proj.root / ".mcp.json").write_text(json.dumps(
        {"mcpServers": {"envgit": {"command": ENVGIT, "args": ["mcp"]}}}))
    code = "require('fs').writeFileSync('from-mcp.txt', 'written'); 6 * 7"
    script = [Call("mcp__envgit__execute", {"code": code})]
    with ModelServer(script) as model:
        (proj.root / "envgit.yaml").write_text(
            f"version: 1\nnetwork:\n  allow: [\"{MODEL_HOST}:{model.port}\"]\n")
        r = run_claude(proj, claude_bin, model)
        results = model.results()
    status = [line[line.find('"mcp_servers"'):][:200] for line in r.stdout.splitlines() if '"mcp_servers"' in line]
    assert any("42" in text for _, _, text in results), (results, status, r.stderr[-2000:])
    assert (proj.root / "from-mcp.txt").read_text() == "written"
    execs = [s for s in steps(proj) if s["argv"][:3] == ["envgit", "mcp", "execute"]]
    assert execs and execs[0]["session"].startswith("claude-") and ".mcp" in execs[0]["session"]
    assert not servers_left(proj.root)       # Claude's exit ended the server it had started




def test_the_shim_knows_envgits_mcp_server_from_anything_else():
    assert envgit_mcp("envgit mcp") == ""
    assert envgit_mcp("/home/me/.venv/bin/envgit mcp --project /work/app") == "/work/app"
    assert envgit_mcp("'/a b/envgit' mcp --project=/q") == "/q"
    assert envgit_mcp("python3 -m envgit mcp") == ""
    assert envgit_mcp("envgit mcp --http 8765") is None        # the person's to run, outside
    assert envgit_mcp("envgit run -- sh") is None
    assert envgit_mcp("npx -y @modelcontextprotocol/server-filesystem .") is None
    assert envgit_mcp("notenvgit mcp") is None


def test_the_inner_mcp_op_serves_only_the_sessions_project(tmp_path):
    root = str(tmp_path)
    assert check_request({"op": "mcp"}, root) == {"op": "mcp"}
    assert check_request({"op": "mcp", "project": root + "/."}, root) == {"op": "mcp"}
    with pytest.raises(BadRequest, match="serves this session's project"):
        check_request({"op": "mcp", "project": "/elsewhere"}, root)
    with pytest.raises(BadRequest, match="does not take"):
        check_request({"op": "mcp", "argv": ["sh", "-c", "id"]}, root)


def test_envgits_own_mcp_json_entries_are_approved_in_the_generated_settings(tmp_path):
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {
        "envgit": {"command": "envgit", "args": ["mcp"]},
        "code": {"command": "/opt/venv/bin/envgit", "args": ["mcp", "--project", str(tmp_path)]},
        "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."]},
        "web": {"type": "http", "url": "http://127.0.0.1:8765/mcp"}}}))
    assert settings("pre", "post", str(tmp_path))["enabledMcpjsonServers"] == ["code", "envgit"]
    (tmp_path / ".mcp.json").write_text("{not json")
    assert "enabledMcpjsonServers" not in settings("pre", "post", str(tmp_path))


def test_in_the_tui_envgits_mcp_json_server_asks_no_approval_and_answers(proj, claude_bin):
    """Claude's UI asks to approve a new .mcp.json server and saves the answer in
    .claude/settings.local.json, read-only inside its sandbox: for envgit's own server the
    question never comes, and the model's call is answered."""
    from test_agents_claude_tui import ANSWER, ask, claude_tui, exit_command, first_run, policy
    proj.env["ENVGIT_RESOLVE"] = f"{MODEL_HOST}=127.0.0.1"
    proj.env["ENABLE_TOOL_SEARCH"] = "false"
    (proj.root / ".mcp.json").write_text(json.dumps(
        {"mcpServers": {"envgit": {"command": ENVGIT, "args": ["mcp"]}}}))
    with ModelServer([Call("mcp__envgit__execute", {"code": "'ran-' + (20 + 22)"})], final=ANSWER) as model:
        proj.write_policy(policy(model))
        with claude_tui(proj, claude_bin, model, "--allowedTools", "mcp__envgit__execute") as t:
            first_run(t)
            # Claude connects its MCP servers while its prompt is up: ask once the server runs
            # and has had time to answer Claude's listing of its tools
            deadline = time.monotonic() + 60
            while not servers_left(proj.root, 0) and time.monotonic() < deadline:
                time.sleep(0.5)
            for pid in servers_left(proj.root, 0):
                settled(pid)            # its start done (seconds of imports on a loaded machine)
            time.sleep(8)
            ask(t)
            shown = t.text()
            assert exit_command(t) == 0
        results = model.results()
    assert "MCP server" not in shown and "settings.local.json" not in shown, shown[-3000:]
    assert [text for _, _, text in results if "ran-42" in text], results


def test_an_agent_session_runs_at_most_eight_envgit_mcp_servers_at_once(proj):
    """A process inside the agent's sandbox asks for MCP servers in a loop: each is a host
    process, so past eight at once the ask is refused, and the daemon serves on."""
    import array
    import socket

    from envgit.daemon.client import connect
    from envgit.daemon.inner import MAX_MCP_SERVERS, encode
    from envgit.paths import Project
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(proj.root), "env": proj.env,
                         "session": "agent-mcp", "inner": True})
    path = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    held, pipes = [], []
    try:
        for _ in range(MAX_MCP_SERVERS + 1):
            r, w = os.pipe()                   # the server's stdin, held open: it keeps running
            pipes += [r, w]
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            data = encode({"op": "mcp"})
            s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, 2, 2]))])
            s.sendall(data[4:])
            held.append(s)
            time.sleep(0.3)
        last = held[-1]
        last.settimeout(30)
        size = int.from_bytes(last.recv(4), "big")
        reply = json.loads(last.recv(size))
        assert f"at most {MAX_MCP_SERVERS}" in reply["error"], reply
        assert len(servers_left(proj.root, 0)) == MAX_MCP_SERVERS
    finally:
        for s in held:
            s.close()
        for fd in pipes:
            os.close(fd)
    assert not servers_left(proj.root)         # each caller gone: its server ended
    assert conn.request({"op": "status"})["pid"]


def test_the_server_run_for_an_agent_puts_its_asks_to_the_person():
    from envgit.daemon.mcphost import server_env
    env = server_env({"HOME": "/h", "PYTHONPATH": "/project/src", "ENVGIT_STEP": "4"}, "claude-x")
    assert env["ENVGIT_MCP_ASKS"] == "elsewhere" and env["ENVGIT_SESSION"] == "claude-x"
    assert "ENVGIT_STEP" not in env and env.get("PYTHONPATH") != "/project/src"


def test_a_stopping_daemon_ends_the_mcp_servers_it_runs(proj):
    import array
    import socket

    from envgit.daemon.client import connect
    from envgit.daemon.inner import encode
    from envgit.paths import Project
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(proj.root), "env": proj.env,
                         "session": "agent-stop", "inner": True})
    path = spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]
    r, w = os.pipe()                           # the server's stdin, held open: it keeps running
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        data = encode({"op": "mcp"})
        s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, 2, 2]))])
        s.sendall(data[4:])
        deadline = time.monotonic() + 30
        while not servers_left(proj.root, 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert servers_left(proj.root, 0)
        proj.stop()
        assert not servers_left(proj.root)
    finally:
        s.close()
        os.close(r)
        os.close(w)
