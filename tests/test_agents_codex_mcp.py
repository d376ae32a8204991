"""envgit's own MCP server under `envgit codex`: Codex refuses every stdio MCP server there
(its one environment is envgit's exec-server), so the person's `[mcp_servers.NAME]` entry that
starts `envgit mcp` is served by envgit itself over HTTP, for the session, behind a bearer
token. The real Codex (pinned, from npm) against the scripted model server, which finds the
tool through Codex's `tool_search` (Codex defers MCP tools) and calls it."""

import http.client
import json
import os
import re
import subprocess

import pytest

import modelserver
from conftest import ENVGIT
from modelserver import ModelServer, agent_bin, agent_command, codex_config
from test_mcp_server import free_port, wait_port


@pytest.fixture(scope="session")
def codex_bin():
    return agent_bin("codex")


class ToolSearchModel(ModelServer):
    """The model searches Codex's deferred tools, then calls the `execute` it found with `code`."""

    def __init__(self, code):
        super().__init__([])
        self.code = code
        self.offered: list[str] = []        # the namespaces holding `execute`, as Codex returned them

    def _next(self, body):
        main = "exec_command" in modelserver._tool_names(body)
        with self.lock:
            if not main or self.pos > 1:
                return main, ("say", "done")
            self.pos += 1
            if self.pos == 1:
                return True, ("raw", {"type": "tool_search_call", "call_id": "search_1", "execution": "client",
                                      "arguments": {"query": "envgit execute javascript", "limit": 8}})
            self.offered = [ns["name"] for item in body.get("input") or []
                            if item.get("type") == "tool_search_output"
                            for ns in item.get("tools") or [] if ns.get("type") == "namespace"
                            and any(t.get("name") == "execute" for t in ns.get("tools") or [])]
            if not self.offered:
                return True, ("say", "no execute tool was offered")
            self.calls.append(("call_mcp_1", "execute", {"code": self.code}))
            return True, ("raw", {"type": "function_call", "id": "fc_mcp_1", "call_id": "call_mcp_1",
                                  "namespace": self.offered[0], "name": "execute",
                                  "arguments": json.dumps({"code": self.code})})


def _events(answer, body, plain=modelserver._responses_events):
    if answer[0] != "raw":
        return plain(answer, body)
    return [{"type": "response.created", "response": {"id": "resp_envgit"}},
            {"type": "response.output_item.done", "output_index": 0, "item": answer[1]},
            {"type": "response.completed", "response": {"id": "resp_envgit", "usage": modelserver._USAGE}}]


def servers_running(proj) -> list[str]:
    """`envgit mcp --http` processes serving this project."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"mcp" in cmd and b"--http" in cmd and str(proj.root).encode() in cmd:
            out.append(b" ".join(cmd).decode(errors="replace"))
    return out


def test_envgit_mcp_in_the_persons_codex_config_is_served_for_the_session(proj, codex_bin, monkeypatch):
    monkeypatch.setattr(modelserver, "_responses_events", _events)
    code = ("require('fs').writeFileSync('from-mcp.txt', 'written by execute');"
            "console.log('sum=' + (40 + 2) + ' token:' + typeof process.env.ENVGIT_MCP_TOKEN)")
    codex_home = proj.home / ".codex"
    codex_home.mkdir()
    with ToolSearchModel(code) as model:
        (codex_home / "config.toml").write_text(
            codex_config(model.url)
            + f'\n[mcp_servers.envgit]\ncommand = "{ENVGIT}"\nargs = ["mcp"]\n'
            + '\n[mcp_servers.notes]\ncommand = "node"\nargs = ["notes-server.js"]\n')
        r = subprocess.run([*agent_command(ENVGIT, "codex"), "exec", "--skip-git-repo-check", "go"],
                           cwd=proj.root, env={**proj.env, "ENVGIT_CODEX_BIN": codex_bin},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert model.offered == ["mcp__envgit_session"], (model.offered, r.stderr)
    assert model.result_of("call_mcp_1") is not None, r.stderr
    assert "sum=42 token:undefined" in model.result_of("call_mcp_1")    # the token stays out of the sandbox
    assert (proj.root / "from-mcp.txt").read_text() == "written by execute"
    said = re.search(r'envgit\'s MCP server "envgit" runs at http://127\.0\.0\.1:\d+/mcp for this session', r.stderr)
    assert said, r.stderr
    assert 'Codex will not start the stdio MCP server "notes"' in r.stderr
    session = re.search(r"envgit: codex session (codex-\S+) ", r.stderr).group(1)
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    execute, = [s for s in steps if s["argv"] == ["envgit", "mcp", "execute"]]
    assert execute["session"] == f"{session}.mcp1" and execute["exit_code"] == 0
    assert json.loads(proj.envgit("show", str(execute["id"]), "--json", check=True).stdout)["extra"]["code"] == code
    assert servers_running(proj) == []                  # it ended with Codex


def test_only_envgit_mcp_commands_are_recognised():
    from envgit.agents.codex_mcp import config_overrides, starts_envgit_mcp

    def stdio(command, *args):
        return {"type": "stdio", "command": command, "args": list(args)}
    assert starts_envgit_mcp(stdio("envgit", "mcp"))
    assert starts_envgit_mcp(stdio("/home/me/.local/bin/envgit", "mcp", "--project", "/p"))
    assert starts_envgit_mcp(stdio("python3", "-m", "envgit", "mcp"))
    assert starts_envgit_mcp(stdio("/usr/bin/python3.13", "-P", "-m", "envgit.mcp"))
    assert not starts_envgit_mcp(stdio("envgit", "run", "--", "mcp"))
    assert not starts_envgit_mcp(stdio("python3", "server.py", "-m", "envgit", "mcp"))
    assert not starts_envgit_mcp(stdio("not-envgit", "mcp"))
    assert not starts_envgit_mcp({"type": "streamable_http", "url": "http://127.0.0.1:1/mcp"})
    assert config_overrides(["-c", "a=1", "exec", "--config=b=2", "-cc=3", "--", "-c", "d=4"]) == \
        ["-c", "a=1", "-c", "b=2", "-c", "c=3"]


INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})


def post(port, headers):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", "/mcp", INITIALIZE, {"Content-Type": "application/json",
                                               "Accept": "application/json, text/event-stream", **headers})
        resp = c.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        c.close()


def test_the_http_server_answers_only_requests_with_its_bearer_token(proj):
    port = free_port()
    server = subprocess.Popen([ENVGIT, "mcp", "--http", f"127.0.0.1:{port}"], cwd=proj.root,
                              env={**proj.env, "ENVGIT_MCP_TOKEN": "s3cret-token"},
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port, server)
        assert post(port, {})[0] == 401
        assert post(port, {"Authorization": "Bearer wrong-token"})[0] == 401
        assert post(port, {"Authorization": "Basic s3cret-token"})[0] == 401
        status, body = post(port, {"Authorization": "Bearer s3cret-token"})
        assert status == 200 and '"serverInfo"' in body, body
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert f"envgit mcp: serving http://127.0.0.1:{port}/mcp" in err.decode()


def stderr_until(proc, prefix, timeout=60) -> list[str]:
    """The lines of proc's stderr up to the first that starts with `prefix`."""
    import selectors
    import time
    deadline, buf = time.monotonic() + timeout, ""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
                if not chunk:
                    break
                buf += chunk
                lines = buf.splitlines()
                if any(ln.startswith(prefix) for ln in lines):
                    return lines[:next(i for i, ln in enumerate(lines) if ln.startswith(prefix)) + 1]
    raise AssertionError(f"no line starting {prefix!r} within {timeout} s; stderr:\n{buf}")


def test_the_http_server_without_a_token_says_so(proj):
    server = subprocess.Popen([ENVGIT, "mcp", "--http", "127.0.0.1:0"], cwd=proj.root, env=proj.env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        lines = stderr_until(server, "envgit mcp: serving ")    # the warning first, then the port it picked
        assert any("ENVGIT_MCP_TOKEN is not set" in ln for ln in lines), lines
        port = int(re.search(r":(\d+)/mcp", lines[-1]).group(1))
        assert post(port, {})[0] == 200
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_a_server_that_does_not_start_is_said_and_nothing_is_overridden(tmp_path, codex_bin, capsys):
    """`envgit mcp` exiting at start (here: no envgit project where it is pointed): said with its
    last line and its log, and Codex is given no entry pointing nowhere."""
    from types import SimpleNamespace

    from envgit.agents.codex_mcp import prepare
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[mcp_servers.envgit]\ncommand = "{ENVGIT}"\nargs = ["mcp"]\n')
    log = tmp_path / "mcp-server.log"
    args, server = prepare(codex_bin, {**os.environ, "CODEX_HOME": str(home)}, [],
                           SimpleNamespace(root=str(tmp_path / "not-a-project")), "codex-x", str(log))
    assert (args, server) == ([], None)
    said = capsys.readouterr().err
    assert "envgit's MCP server for Codex did not start (it exited with status 2: envgit mcp:" in said, said
    assert f"its log: {log}" in said and 'Codex will not have "envgit"' in said


def test_the_override_replaces_an_entry_whose_name_has_a_dot(proj, codex_bin, capsys, monkeypatch):
    """Codex splits a `-c` key at every dot: the override is one `mcp_servers` table, which Codex
    itself then lists with the person's entry disabled and the session's beside it."""
    from envgit.agents.codex_mcp import prepare
    home = proj.home / ".codex"
    home.mkdir()
    (home / "config.toml").write_text('[mcp_servers."my.envgit"]\ncommand = "envgit"\n'
                                      'args = ["mcp", "--project", "/elsewhere"]\ntool_timeout_sec = 200\n')
    env = {**proj.env, "CODEX_HOME": str(home)}
    monkeypatch.chdir(proj.root)        # where Codex reads a project's .codex/config.toml
    args, server = prepare(codex_bin, env, [], proj, "codex-20261205-000000-abcd",
                           str(proj.home / "mcp-server.log"))
    try:
        assert server is not None, capsys.readouterr().err
        listed = subprocess.run([codex_bin, "mcp", "list", "--json", *args], env=env, cwd=proj.root,
                                capture_output=True, text=True, timeout=60)
        entries = {e["name"]: e for e in json.loads(listed.stdout)}
        assert entries["my.envgit"]["enabled"] is False
        new = entries["my.envgit_session"]
        assert new["enabled"] and new["tool_timeout_sec"] == 200
        assert new["transport"]["type"] == "streamable_http"
        assert new["transport"]["bearer_token_env_var"] == "ENVGIT_MCP_TOKEN"
        url = new["transport"]["url"]
        assert f'"my.envgit" runs at {url} for this session (as "my.envgit_session")' in capsys.readouterr().err
        port = int(re.search(r":(\d+)/mcp$", url).group(1))
        assert post(port, {})[0] == 401
        assert post(port, {"Authorization": f"Bearer {server.token}"})[0] == 200
    finally:
        if server is not None:
            server.stop()
    assert servers_running(proj) == []
