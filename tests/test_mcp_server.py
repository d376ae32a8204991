"""envgit mcp end to end: the SDK's own client drives `envgit mcp` (stdio and
streamable HTTP) in a real project, whose upstream is tests/mcp_fixture_server.py over a
fixture corpus; the code runs in the real bwrap sandbox in real node; the steps are read
back with `envgit show --json`."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from conftest import CANARY, ENVGIT
from kit.ports import free_port
from mcp_fixture_server import TEMPLATE_FILE, make_corpus

FIXTURE = str(Path(__file__).with_name("mcp_fixture_server.py"))
def mcp_section(corpus, extra=""):
    return f"""
mcp:
  servers:
    corpus:
      command: {sys.executable}
      args: [{FIXTURE}, {corpus}]
  rules:
    - {{server: corpus, tool: "delete_*", action: deny}}
    - {{server: corpus, tool: "create_*", action: ask}}
{extra}"""


@pytest.fixture
def mproj(proj):
    proj.corpus = make_corpus(proj.home.parent)
    with open(proj.root / "envgit.yaml", "a") as f:
        f.write(mcp_section(proj.corpus))
    proj.envgit("trust", "--yes", check=True)     # the upstream is a host command: approved first
    return proj


def server_params(proj, env=None):
    # started elsewhere, as an agent may start it: --project names the project
    return StdioServerParameters(command=ENVGIT, args=["mcp", "--project", str(proj.root)],
                                 cwd=str(proj.home), env={**proj.env, **(env or {})})


def session(proj, fn, server_env=None, **client_kw):
    """Run `await fn(client)` against envgit mcp over stdio; its return value."""
    async def main():
        async with Client(server_params(proj, server_env), **client_kw) as client:
            with anyio.fail_after(120):
                return await fn(client)
    return anyio.run(main)


def text_of(result):
    return "".join(b.text for b in result.content if b.type == "text")


def step_of(result):
    return result.meta["envgit/step"]


def show(proj, n):
    return json.loads(proj.envgit("show", str(n), "--json", check=True).stdout)


def execute(client, code, **kw):
    return client.call_tool("execute", {"code": code, **kw})


# --- the tool and its declarations -------------------------------------------------------

def test_execute_is_the_only_tool_and_declares_the_upstream_tools(mproj):
    from envgit.mcp.typescript import ts_type

    async def upstream_tools():
        params = StdioServerParameters(command=sys.executable, args=[FIXTURE, str(mproj.corpus)])
        async with Client(params) as c:
            return [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for t in (await c.list_tools()).tools]

    async def ours(client):
        return (await client.list_tools()).tools
    tools = session(mproj, ours)
    assert [t.name for t in tools] == ["execute"]
    schema = tools[0].input_schema
    assert schema["properties"]["code"]["type"] == "string"
    assert schema["properties"]["reset"]["type"] == "boolean" and schema["required"] == ["code"]
    desc = tools[0].description
    assert "declare namespace corpus {" in desc
    upstream = anyio.run(upstream_tools)
    assert {t["name"] for t in upstream} == {"list_files", "read_file", "search", "create_note", "delete_file"}
    for t in upstream:
        args = ts_type(t["inputSchema"], indent="  ")
        result = ts_type(t["outputSchema"], indent="  ")
        assert f"  /** {t['description']} */\n  function {t['name']}(args: {args}): Promise<{result}>;" in desc
    # spot checks that the generated types are the schemas' own
    assert "pattern: string;" in desc and "max_hits?: number;" in desc
    assert "/** 1-based line number */\n      line: number;" in desc
    assert "declare function sample<T>(value: T, n?: number): T;" in desc


def test_an_upstream_that_dies_at_start_is_said_in_one_line_with_its_stderr(proj):
    """A stdio upstream that exits at once (a missing module, a bad config): the model reads
    why in the tool's declarations (and a call to it says it is not available), in one line:
    the error itself, not the task group wrapping it, and the first lines of its stderr. The
    working upstream beside it is still declared."""
    proj.corpus = make_corpus(proj.home.parent)
    broken = ("    broken:\n      command: /bin/sh\n"
              "      args: [-c, \"echo 'Error: Cannot find module ./config-9d1e' >&2; exit 3\"]\n")
    with open(proj.root / "envgit.yaml", "a") as f:
        f.write(mcp_section(proj.corpus).replace("  rules:\n", broken + "  rules:\n"))
    proj.envgit("trust", "--yes", check=True)

    async def fn(client):
        tools = (await client.list_tools()).tools
        called = await execute(client, "await broken.anything({})")
        return tools[0].description, called
    desc, called = session(proj, fn)
    line = next(ln for ln in desc.splitlines() if ln.startswith("// broken: not available"))
    assert "Cannot find module ./config-9d1e" in line and "TaskGroup" not in line, line
    assert "declare namespace corpus {" in desc
    assert called.is_error


def test_each_client_is_a_session_of_its_own_or_a_sub_session_of_its_agents(mproj):
    """Two clients of `envgit mcp` are two sessions in the log; under an agent's session (its
    ENVGIT_SESSION, as Claude's MCP servers inherit it) each is a sub-session of that one."""
    def one(extra_env=None):
        env = {**mproj.env, **(extra_env or {})}
        params = StdioServerParameters(command=ENVGIT, args=["mcp", "--project", str(mproj.root)],
                                       cwd=str(mproj.home), env=env)

        async def main():
            async with Client(params) as client:
                return step_of(await execute(client, "1 + 1"))
        return anyio.run(main)
    a, b = one(), one()
    c = one({"ENVGIT_SESSION": "claude-20261205-101010-ab12"})
    sa, sb, sc = (show(mproj, n) for n in (a, b, c))
    assert sa["session"] != sb["session"] and sa["agent"] == sb["agent"] == "mcp", (sa["session"], sb["session"])
    assert sc["session"] == "claude-20261205-101010-ab12.mcp1" and sc["agent"] == "claude"
    shown = mproj.envgit("log", check=True).stdout
    assert "claude:ab12.mcp1" in shown, shown


# --- the REPL ------------------------------------------------------------------------------

def test_state_persists_across_calls_until_reset(mproj):
    async def fn(client):
        a = await execute(client, "const n = 41; function inc(x) { return x + 1 }\n"
                                  "const r = await corpus.list_files({}); r.files.length")
        b = await execute(client, "const n2 = inc(n); n2")
        c = await execute(client, "const n = 1; n")            # a name may be declared again
        d = await execute(client, "typeof inc + ' ' + typeof r", reset=True)
        return a, b, c, d
    a, b, c, d = session(mproj, fn)
    assert text_of(a) == "41" and not a.is_error
    assert text_of(b) == "42"
    assert text_of(c) == "1"
    assert text_of(d) == "undefined undefined"
    assert show(mproj, step_of(d))["extra"]["reset"] is True
    # the text show: the code, the calls and the bytes, as a person reads the step
    text = mproj.envgit("show", str(step_of(a)), check=True).stdout
    assert "  code\n    const n = 41; function inc(x) { return x + 1 }\n" in text, text
    assert "  calls     1 tool calls" in text and "  bytes     in " in text and ", out 2" in text, text


def test_helpers_and_errors(mproj):
    async def fn(client):
        return [await execute(client, code) for code in (
            "console.log('hello'); sample([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)",
            "schema({a: [1, 2], b: 'xyz', c: {d: null}})",
            "assert(1 + 1 === 3, 'arithmetic is broken')",
            "return 7",
            "await corpus.read_file({path: '../outside'})",
        )]
    printed, shape, failed, returned, upstream_error = session(mproj, fn)
    assert text_of(printed) == "hello\n[1,5,9]"
    assert json.loads(text_of(shape)) == {"a": {"array": 2, "of": ["number"]}, "b": "string(3)",
                                          "c": {"d": "null"}}
    assert failed.is_error and "Error: arithmetic is broken" in text_of(failed)
    assert text_of(returned) == "7"
    assert upstream_error.is_error and "outside the corpus" in text_of(upstream_error)


def test_a_runaway_or_exiting_repl_is_restarted(mproj):
    mproj.env["ENVGIT_MCP_EXEC_TIMEOUT"] = "3"

    async def fn(client):
        return [await execute(client, code) for code in (
            "globalThis.kept = 1; 'set'", "while (true) {}", "typeof kept", "process.exit(3)", "1 + 1")]
    t0 = time.monotonic()
    s, loop, after, exited, fresh = session(mproj, fn)
    assert time.monotonic() - t0 < 60
    assert loop.is_error and "ran longer than 3 s; the REPL was restarted" in text_of(loop)
    assert text_of(after) == "undefined"
    assert exited.is_error and "the REPL exited (status 3)" in text_of(exited)
    assert text_of(fresh) == "2"
    step = show(mproj, step_of(loop))
    assert step["exit_code"] == 1 and "ran longer" in step["extra"]["error"]


def test_a_return_over_the_cap_is_cut_and_says_so(proj):
    proj.corpus = make_corpus(proj.home.parent)
    with open(proj.root / "envgit.yaml", "a") as f:
        f.write(mcp_section(proj.corpus, "  max_return_bytes: 1KiB\n"))
    proj.envgit("trust", "--yes", check=True)

    async def fn(client):
        return (await execute(client, "'x'.repeat(5000)"),
                await execute(client, "for (let i = 0; i < 200; i++) console.log('line', i); 'end'"))
    value, printed = session(proj, fn)
    text = text_of(value)
    assert text.startswith("x" * 1024) and "x" * 1025 not in text
    assert "[envgit: cut at 1024 of 5000 bytes (mcp.max_return_bytes)" in text
    extra = show(proj, step_of(value))["extra"]
    assert extra["cut"] is True and extra["bytes_printed"] == 5000 and extra["bytes_out"] == len(text.encode())
    assert "line 0\n" in text_of(printed) and "of 1693 bytes" in text_of(printed)


# --- policy on tool calls ------------------------------------------------------------------

def test_a_denied_tool_is_refused_and_recorded(mproj):
    async def fn(client):
        return await execute(client, "await corpus.delete_file({path: 'src/file00.js'})")
    r = session(mproj, fn)
    assert r.is_error and "corpus.delete_file was refused by mcp.rules[0]" in text_of(r)
    assert (mproj.corpus / "src" / "file00.js").exists()
    step = show(mproj, step_of(r))
    assert "denied-tool" in step["marks"] and step["exit_code"] == 1
    [call] = [e for e in step["events"] if e["kind"] == "mcp-call"]
    assert call["server"] == "corpus" and call["tool"] == "delete_file"
    assert call["decision"] == "deny" and call["rule"] == "mcp.rules[0]" and call["result_bytes"] == 0


@pytest.mark.parametrize("mode", ["auto", "legacy"])   # 2026-07-28 input-required rounds; 2025-11-25 requests
def test_an_ask_is_answered_by_elicitation(mproj, mode):
    asked = []

    async def elicit(ctx, params):
        asked.append(params.message)
        allow = "allowed" in params.message
        return types.ElicitResult(action="accept", content={"allow": allow})

    async def fn(client):
        return (await execute(client, "await corpus.create_note({title: 'allowed', body: 'yes'})"),
                await execute(client, "await corpus.create_note({title: 'refused', body: 'no'})"))
    ok, refused = session(mproj, fn, elicitation_callback=elicit, mode=mode)
    assert len(asked) == 2 and "corpus.create_note" in asked[0] and "mcp.rules[1]" in asked[0]
    assert not ok.is_error and "created note allowed" in text_of(ok)
    assert (mproj.corpus.parent / "notes" / "allowed.md").read_text() == "yes"
    assert refused.is_error and "refused by mcp.rules[1]" in text_of(refused)
    assert not (mproj.corpus.parent / "notes" / "refused.md").exists()
    for r, answer in ((ok, "allow"), (refused, "deny")):
        step = show(mproj, step_of(r))
        [note] = [e for e in step["events"] if e["kind"] == "note"]
        assert note["type"] == "mcp-ask" and note["answer"] == answer and note["how"].startswith("MCP elicitation")
        assert "corpus.create_note" in note["question"]
        assert "asked" in step["marks"]


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_an_ask_without_elicitation_waits_for_envgit_approve(mproj, answer):
    def answer_when_asked():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            asks = json.loads(mproj.envgit("pending", "--json").stdout or "[]")
            if asks:
                assert asks[0]["question"]["kind"] == "mcp tool call"
                mproj.envgit(answer, str(asks[0]["id"]))
                return
            time.sleep(0.1)
    t = threading.Thread(target=answer_when_asked)
    t.start()

    async def fn(client):
        return await execute(client, "await corpus.create_note({title: 'x', body: 'y'}); 'done'")
    r = session(mproj, fn)          # no elicitation callback: the client declares no capability
    t.join()
    assert r.is_error == (answer == "deny"), text_of(r)
    assert (mproj.corpus.parent / "notes").exists() == (answer == "approve")
    step = show(mproj, step_of(r))
    [note] = [e for e in step["events"] if e["kind"] == "note"]
    assert note["answer"] == ("allow" if answer == "approve" else "deny")
    assert "did not declare elicitation" in note["how"] and f"envgit {answer}" in note["how"]
    assert step["approvals"] and step["approvals"][0]["how"] == f"envgit {answer}"


def test_a_server_run_for_an_agents_sandbox_asks_the_person_never_the_client(mproj):
    """The daemon runs envgit mcp for any process of an agent's sandbox (daemon/mcphost.py sets
    ENVGIT_MCP_ASKS=elsewhere): an ask rule waits for `envgit approve`, even from a client that
    offers to answer it."""
    elicited = []

    async def elicit(ctx, params):
        elicited.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": True})

    def deny_when_asked():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            asks = json.loads(mproj.envgit("pending", "--json").stdout or "[]")
            if asks:
                mproj.envgit("deny", str(asks[0]["id"]))
                return
            time.sleep(0.1)
    t = threading.Thread(target=deny_when_asked)
    t.start()

    async def fn(client):
        return await execute(client, "await corpus.create_note({title: 'x', body: 'y'}); 'done'")
    r = session(mproj, fn, server_env={"ENVGIT_MCP_ASKS": "elsewhere"}, elicitation_callback=elicit)
    t.join()
    assert elicited == [] and r.is_error and not (mproj.corpus.parent / "notes").exists()
    [note] = [e for e in show(mproj, step_of(r))["events"] if e["kind"] == "note"]
    assert note["answer"] == "deny" and "not the MCP client" in note["how"]


def test_an_ask_without_elicitation_times_out_to_deny(mproj):
    text = (mproj.root / "envgit.yaml").read_text().replace("\nnetwork:\n", "\nnetwork:\n  ask_timeout: 1\n", 1)
    (mproj.root / "envgit.yaml").write_text(text)

    async def fn(client):
        return await execute(client, "await corpus.create_note({title: 'x', body: 'y'})")
    r = session(mproj, fn)
    assert r.is_error and not (mproj.corpus.parent / "notes").exists()
    [note] = [e for e in show(mproj, step_of(r))["events"] if e["kind"] == "note"]
    assert note["answer"] == "deny" and "no answer" in note["how"]


# --- the flows on the step -----------------------------------------------------------------

def test_read_much_return_little_is_flagged(mproj):
    # The case: which files import node:http? A regex over search results the code
    # never shows counts the template string too: 289 KB in, a few bytes out.
    code = ("const r = await corpus.search({pattern: 'require\\\\('});\n"
            "const files = [...new Set(r.hits.filter(h => /require\\('node:http'\\)/.test(h.text))"
            ".map(h => h.path))];\nfiles.join(' ')")

    async def fn(client):
        return await execute(client, code)
    r = session(mproj, fn)
    assert not r.is_error, text_of(r)
    assert TEMPLATE_FILE in text_of(r).split()          # confidently wrong, as in the issue
    step = show(mproj, step_of(r))
    extra = step["extra"]
    assert extra["bytes_in_upstream"] >= 100 * 1024 and extra["bytes_out"] <= 1024
    assert extra["code"] == code and extra["calls"] == 1
    assert "read-much-return-little" in step["marks"]
    [call] = [e for e in step["events"] if e["kind"] == "mcp-call"]
    assert call["tool"] == "search" and call["result_bytes"] == extra["bytes_in_upstream"]
    assert call["args_bytes"] == len('{"pattern": "require\\\\("}')
    log = mproj.envgit("log", check=True).stdout
    assert "read-much-return-little" in log


def test_files_the_code_reads_count_as_bytes_in(mproj):
    (mproj.root / "big.txt").write_text("y" * 300_000)

    async def fn(client):
        return (await execute(client, "require('node:fs').readFileSync('big.txt', 'utf8').length"),
                await execute(client, "'small'"))
    big, small = session(mproj, fn)
    assert text_of(big) == "300000"
    step = show(mproj, step_of(big))
    assert step["extra"]["bytes_in_files"] >= 300_000
    assert "read-much-return-little" in step["marks"]
    assert show(mproj, step_of(small))["extra"]["bytes_in"] < 1000


# --- the sandbox ---------------------------------------------------------------------------

def test_the_sandbox_refuses_network_secrets_and_writes_outside(mproj):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    connected = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connected.append(listener.accept())
            except OSError:
                pass
    threading.Thread(target=accept, daemon=True).start()
    outside = mproj.home / "outside.txt"
    net = (f"await new Promise((res) => {{ const s = require('node:net').connect({port}, '127.0.0.1');"
           f" s.on('connect', () => res('connected')); s.on('error', (e) => res(e.code)); }})")
    fetch = (f"let got; try {{ await fetch('http://127.0.0.1:{port}/'); got = 'fetched' }}"
             f" catch (e) {{ got = 'failed: ' + (e.cause?.code || e) }}; got")

    async def fn(client):
        return [await execute(client, code) for code in (
            net, fetch,
            "require('node:fs').readFileSync(process.env.HOME + '/.ssh/id_ed25519', 'utf8')",
            f"require('node:fs').writeFileSync({json.dumps(str(outside))}, 'x')",
            "require('node:fs').writeFileSync('inside.txt', 'made in the sandbox'); 'ok'",
        )]
    try:
        net_r, fetch_r, ssh_r, out_r, in_r = session(mproj, fn)
    finally:
        stop.set()
        time.sleep(0.3)
        listener.close()
    assert text_of(net_r) == "ECONNREFUSED"
    assert text_of(fetch_r) == "failed: ECONNREFUSED"
    assert connected == []
    # the key reads as its placeholder's line (sandbox/masks.py), never the key
    assert CANARY not in text_of(ssh_r) and "is hidden from this sandbox" in text_of(ssh_r), text_of(ssh_r)
    assert out_r.is_error and ("EROFS" in text_of(out_r) or "ENOENT" in text_of(out_r)
                               or "EACCES" in text_of(out_r))
    assert not outside.exists()
    assert text_of(in_r) == "ok" and (mproj.root / "inside.txt").read_text() == "made in the sandbox"
    changed = json.dumps(show(mproj, step_of(in_r))["snapshot"])
    assert "inside.txt" in changed                        # the snapshot after the step has it


# --- set-up errors and the HTTP transport ------------------------------------------------

def test_a_bad_mcp_section_is_a_usage_error_with_its_line(proj):
    with open(proj.root / "envgit.yaml", "a") as f:
        f.write("\nmcp:\n  rules:\n    - {tool: x, action: maybe}\n")
    r = subprocess.run([ENVGIT, "mcp"], cwd=proj.root, env=proj.env,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert "envgit.yaml:" in r.stderr and "mcp.rules[0].action is 'maybe'" in r.stderr


def wait_port(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def test_streamable_http_with_an_http_upstream(proj):
    corpus = make_corpus(proj.home.parent)
    up_port, our_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, FIXTURE, str(corpus), "--http", str(up_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours = None
    try:
        wait_port(up_port, upstream)
        with open(proj.root / "envgit.yaml", "a") as f:
            f.write(f"\nmcp:\n  servers:\n    corpus: {{url: 'http://127.0.0.1:{up_port}/mcp'}}\n")
        proj.envgit("trust", "--yes", check=True)     # the url server is approved first
        ours = subprocess.Popen([ENVGIT, "mcp", "--http", f"127.0.0.1:{our_port}"],
                                cwd=proj.root, env=proj.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(our_port, ours)

        async def main():
            async with Client(f"http://127.0.0.1:{our_port}/mcp") as client:
                with anyio.fail_after(120):
                    a = await execute(client, "const f = await corpus.list_files({}); f.files.length")
                    b = await execute(client, "f.files[0].path")
                    return a, b
        a, b = anyio.run(main)
        assert text_of(a) == "41" and text_of(b) == "src/docs.js"
        [call] = [e for e in show(proj, step_of(a))["events"] if e["kind"] == "mcp-call"]
        assert call["tool"] == "list_files" and call["decision"] == "allow"
    finally:
        for p in (ours, upstream):
            if p is not None:
                p.terminate()
                p.wait(timeout=30)
