"""A scripted model server on 127.0.0.1: it replays a list of tool calls to a real agent.

    script = [Call("Bash", {"command": "echo hi"}), Call("Write", {...}), Say("done")]
    with ModelServer(script) as m:
        m.url                          # http://127.0.0.1:PORT (Anthropic) / m.url + "/v1" (OpenAI)
        m.results()                    # [(call id, tool name, result text), ...] as the agent sent them back
        m.calls                        # [(call id, tool name, input), ...] as they were sent

Two wire formats, chosen by path:
  POST /v1/messages     Anthropic Messages API (SSE with `tool_use` blocks, or JSON if stream is false)
  POST /v1/responses    OpenAI Responses API (SSE with `function_call` items)

Agents make side requests (titles, summaries, quota probes): a request is the agent's main
loop only when it offers the tool the script calls next (or, once the script is spent, any
tool). Side requests get a short text answer and do not advance the script.
"""

import itertools
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from envgit.localhttps import serve_in_background, stop


@dataclass
class Call:
    """The model calls `tool` with `input`. `offered` names other spellings of the tool that
    count as offering it (Codex may offer `shell_command` or `exec_command`)."""
    tool: str
    input: dict
    offered: tuple = ()
    id: str = ""


@dataclass
class Say:
    text: str


@dataclass
class Parallel:
    """The model calls several tools in one answer (two `tool_use` blocks in one message), as
    a model does for independent commands; the agent runs them at once."""
    calls: list


@dataclass
class Logged:
    path: str
    body: dict
    main: bool
    answered: list = field(default_factory=list)


def _tool_names(body: dict) -> set[str]:
    names = set()
    for t in body.get("tools") or []:
        names.add(t.get("name") or (t.get("function") or {}).get("name") or t.get("type", ""))
    return names


class ModelServer:
    def __init__(self, script, final="done"):
        self.script = list(script)
        self.final = final
        self.pos = 0
        self.calls: list[tuple[str, str, dict]] = []
        self.log: list[Logged] = []
        self.lock = threading.Lock()
        self._ids = itertools.count(1)

    # --- what the tests read -------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def results(self) -> list[tuple[str, str, str]]:
        """Every tool result the agent sent back, in order, once per call id."""
        names = {cid: name for cid, name, _ in self.calls}
        seen, out = set(), []
        for entry in self.log:
            for cid, text in _tool_results(entry.body):
                if cid in names and cid not in seen:
                    seen.add(cid)
                    out.append((cid, names[cid], text))
        return out

    def result_of(self, call_id: str) -> str | None:
        return next((t for cid, _, t in self.results() if cid == call_id), None)

    def main_requests(self) -> list[Logged]:
        return [e for e in self.log if e.main]

    # --- the script ----------------------------------------------------------------------

    def _next(self, body: dict):
        """(is this the main loop, the item to answer with)."""
        offered = _tool_names(body)
        with self.lock:
            if self.pos < len(self.script):
                item = self.script[self.pos]
                if isinstance(item, Parallel):
                    return self._parallel(item, offered)
                wanted = {item.tool, *item.offered} if isinstance(item, Call) else None
                if wanted is None or wanted & offered:
                    self.pos += 1
                    if isinstance(item, Call):
                        name = item.tool if item.tool in offered else sorted(wanted & offered)[0]
                        cid = item.id or f"call_envgit_{next(self._ids)}"
                        self.calls.append((cid, name, item.input))
                        return True, ("call", cid, name, item.input)
                    return True, ("say", item.text)
                return False, ("say", "ok")
            return bool(offered), ("say", self.final)

    def _parallel(self, item, offered):
        """(as _next) for a Parallel item, under the lock: every call or none."""
        if not all({c.tool, *c.offered} & offered for c in item.calls):
            return False, ("say", "ok")
        self.pos += 1
        calls = []
        for c in item.calls:
            name = c.tool if c.tool in offered else sorted({c.tool, *c.offered} & offered)[0]
            cid = c.id or f"call_envgit_{next(self._ids)}"
            self.calls.append((cid, name, c.input))
            calls.append(("call", cid, name, c.input))
        return True, ("calls", calls)

    # --- serving -------------------------------------------------------------------------

    def __enter__(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                self._json(200, {"data": [], "object": "list"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    return self._json(200, {"input_tokens": 1})
                if not (path.endswith("/messages") or path.endswith("/responses")):
                    return self._json(404, {"error": {"type": "not_found", "message": path}})
                main, answer = outer._next(body)
                outer.log.append(Logged(path, body, main, [answer]))
                if path.endswith("/responses"):
                    return self._sse(_responses_events(answer, body))
                if body.get("stream"):
                    return self._sse(_messages_events(answer, body))
                return self._json(200, _message_json(answer, body))

            def _json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events):
                data = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.httpd = serve_in_background(Server(("127.0.0.1", 0), Handler))
        self.port = self.httpd.server_address[1]
        return self

    def __exit__(self, *exc):
        stop(self.httpd)


# --- tool results as the agents send them back ------------------------------------------

def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text_of(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c)
                       for c in content)
    return "" if content is None else str(content)


def _tool_results(body: dict):
    for m in body.get("messages") or []:                         # Anthropic
        for c in m.get("content") or [] if isinstance(m.get("content"), list) else []:
            if c.get("type") == "tool_result":
                yield c.get("tool_use_id"), _text_of(c.get("content"))
    for item in body.get("input") or [] if isinstance(body.get("input"), list) else []:   # OpenAI
        if item.get("type") in ("function_call_output", "custom_tool_call_output"):
            yield item.get("call_id"), _text_of(item.get("output"))


# --- Anthropic Messages API --------------------------------------------------------------

def _message_json(answer, body):
    content, stop = _anthropic_content(answer)
    return {"id": "msg_envgit", "type": "message", "role": "assistant",
            "model": body.get("model", "scripted"), "content": content, "stop_reason": stop,
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def _anthropic_content(answer):
    if answer[0] == "calls":         # Parallel: one tool_use block per call
        return [_anthropic_content(a)[0][0] for a in answer[1]], "tool_use"
    if answer[0] == "call":
        _, cid, name, inp = answer
        return [{"type": "tool_use", "id": cid, "name": name, "input": inp}], "tool_use"
    return [{"type": "text", "text": answer[1]}], "end_turn"


def _messages_events(answer, body):
    content, stop = _anthropic_content(answer)
    msg = {**_message_json(answer, body), "content": [], "stop_reason": None}
    ev = [{"type": "message_start", "message": msg}]
    for i, block in enumerate(content):
        if block["type"] == "tool_use":
            ev.append({"type": "content_block_start", "index": i,
                       "content_block": {**block, "input": {}}})
            ev.append({"type": "content_block_delta", "index": i,
                       "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
        else:
            ev.append({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
            ev.append({"type": "content_block_delta", "index": i,
                       "delta": {"type": "text_delta", "text": block["text"]}})
        ev.append({"type": "content_block_stop", "index": i})
    ev.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
               "usage": {"output_tokens": 1}})
    ev.append({"type": "message_stop"})
    return ev


# --- OpenAI Responses API ----------------------------------------------------------------

_USAGE = {"input_tokens": 1, "input_tokens_details": None, "output_tokens": 1,
          "output_tokens_details": None, "total_tokens": 2}


def _responses_events(answer, body):
    rid = "resp_envgit"
    if answer[0] == "call":
        _, cid, name, inp = answer
        if isinstance(inp, str):       # a freeform (custom) tool, e.g. Codex's apply_patch
            item = {"type": "custom_tool_call", "id": "ctc_" + cid, "call_id": cid, "name": name,
                    "input": inp, "status": "completed"}
        else:
            item = {"type": "function_call", "id": "fc_" + cid, "call_id": cid, "name": name,
                    "arguments": json.dumps(inp)}
    else:
        item = {"type": "message", "role": "assistant", "id": "msg_envgit",
                "content": [{"type": "output_text", "text": answer[1]}]}
    return [{"type": "response.created", "response": {"id": rid}},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": {"id": rid, "usage": _USAGE}}]


# --- pointing each agent at the server -------------------------------------------------

# A model Codex 0.171 knows from its bundled catalog (so it offers apply_patch), with none of
# the code-mode-only tool sets of the newer ones.
CODEX_MODEL = "gpt-5.5"


def codex_config(url: str) -> str:
    """$CODEX_HOME/config.toml for a custom provider at `url` (Responses API, no auth)."""
    return (f'model = "{CODEX_MODEL}"\nmodel_provider = "scripted"\n\n'
            f'[model_providers.scripted]\nname = "scripted"\nbase_url = "{url}/v1"\n'
            'wire_api = "responses"\nrequires_openai_auth = false\n')


def copilot_env(url: str) -> dict:
    """Copilot CLI offline, with this server as its Anthropic-format provider."""
    return {"COPILOT_OFFLINE": "true", "COPILOT_PROVIDER_TYPE": "anthropic",
            "COPILOT_PROVIDER_BASE_URL": url, "COPILOT_PROVIDER_API_KEY": "scripted",
            "COPILOT_MODEL": "claude-sonnet-4.5", "COPILOT_AUTO_UPDATE": "false"}


def claude_env(url: str) -> dict:
    """Claude Code with this server as its API (as root, skipping permissions needs IS_SANDBOX)."""
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "scripted", "IS_SANDBOX": "1",
            "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1"}


# --- what the agent tests share ----------------------------------------------------------

AGENT_CACHE = os.environ.get("ENVGIT_AGENTS_CACHE") or os.path.join(os.path.dirname(sys.executable),
                                                                     "..", "agents-npm")


def agent_bin(agent: str) -> str:
    """The pinned agent's executable, installed from npm into AGENT_CACHE when absent; the
    test is skipped (saying why) only when npm cannot install it."""
    import pytest

    from envgit.agents.install import PINNED, InstallError, install
    try:
        return install(os.path.abspath(AGENT_CACHE), [agent])[agent]
    except InstallError as e:
        pytest.skip(f"cannot install {PINNED[agent][0]}@{PINNED[agent][1]} from npm: {e}")


def agent_command(envgit: str, agent: str) -> list[str]:
    """`envgit AGENT` once the CLI has it; until then the same entry point through -m."""
    helptext = subprocess.run([envgit, "--help"], capture_output=True, text=True).stdout
    if f"\n    {agent} " in helptext:
        return [envgit, agent]
    return [sys.executable, "-m", "envgit.agents", agent]


def clone_for_push(env, remote):
    """Make env.root a clone of the HTTPS `remote`, with a policy that reaches it and the
    default irreversible preset (git push denied at the request)."""
    hostport = remote.url.split("/")[2]
    subprocess.run(["git", "-c", f"http.curloptResolve={hostport}:127.0.0.1", "clone", "-q", remote.url,
                    str(env.root)], check=True, capture_output=True,
                   env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_SSL_CAINFO": str(remote.ca.cert_path)})
    for k, v in (("user.email", "agent@example.test"), ("user.name", "agent")):
        subprocess.run(["git", "-C", str(env.root), "config", k, v], check=True)
    env.envgit("init", check=True)
    env.write_policy(f'version: 1\nnetwork:\n  allow: ["{hostport}"]\nirreversible:\n  - preset: default\n')


# --- an agent on a real terminal --------------------------------------------------------

class AgentTerminal:
    """A command on a real pseudo-terminal, driven as a person drives it: keys typed in, the
    screen's text read out. Like a terminal emulator, it answers the queries a full-screen
    program makes at start (cursor position, device attributes, colours), without which Codex
    waits and then gives up.

        with AgentTerminal([envgit, "codex"], env, cwd) as t:
            t.wait_for("Ask Codex")          # the text shown so far, escape sequences removed
            t.type("hello\\r")                # an escape sequence (arrow key) is sent whole
            status = t.wait(30)              # the shell's exit status
            t.modes_before == t.stty()       # `stty -a` of this terminal, before and now
    """

    import re as _re
    ESCAPES = _re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
                          rb"|\x1b[P^_X][^\x1b]*\x1b\\|\x1b[()][0-9A-Za-z]|\x1b[@-Z\\-_=>78]")
    KEYS = _re.compile(r"\x1b\[[0-9;]*[A-Za-z~]|\x1bO[A-Z]|.", _re.S)

    def __init__(self, argv, env, cwd, rows=40, cols=120):
        import fcntl
        import struct
        import termios
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.raw = b""
        self._lock = threading.Lock()
        import pyte

        class Screen(pyte.Screen):
            # queries are answered by _answer; pyte 0.8.2's own handlers of them fail on the
            # private forms (CSI ? 6 n) that Copilot sends
            def report_device_status(self, *a, **kw):
                pass

            def report_device_attributes(self, *a, **kw):
                pass
        self._screen = Screen(cols, rows)
        self._stream = pyte.ByteStream(self._screen)
        self.modes_before = self.stty()

        def take_terminal():             # the child leads a session whose terminal this is
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        self.proc = subprocess.Popen(argv, env={"TERM": "xterm-256color", **env}, cwd=cwd,
                                     stdin=self.slave, stdout=self.slave, stderr=self.slave,
                                     start_new_session=True, preexec_fn=take_terminal)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        import select
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.2)
                data = os.read(self.master, 65536) if ready else None
            except (OSError, ValueError):
                return
            if data == b"":
                return
            if data:
                with self._lock:
                    self.raw += data
                    try:
                        self._stream.feed(data)
                    except Exception:       # a sequence pyte cannot take: go on with a new parser
                        import pyte
                        self._stream = pyte.ByteStream(self._screen)
                self._answer(data)

    def _answer(self, data: bytes):
        replies = []
        if b"\x1b[6n" in data:
            replies.append(b"\x1b[1;1R")
        if b"\x1b[c" in data or b"\x1b[0c" in data:
            replies.append(b"\x1b[?62;22c")
        for m in self._re.finditer(rb"\x1b\]1([01]);\?(\x07|\x1b\\)", data):
            rgb = b"ffff/ffff/ffff" if m.group(1) == b"0" else b"0000/0000/0000"
            replies.append(b"\x1b]1" + m.group(1) + b";rgb:" + rgb + m.group(2))
        for r in replies:
            try:
                os.write(self.master, r)
            except OSError:
                return

    def text(self) -> str:
        with self._lock:
            return self.ESCAPES.sub(b"", self.raw).decode(errors="replace")

    def screen(self) -> str:
        """The screen as it is now (a line a program completes in pieces is whole here)."""
        with self._lock:
            return "\n".join(line.rstrip() for line in self._screen.display)

    def drain(self, quiet_s=0.5, at_most_s=10) -> None:
        """Once the program has exited: wait until its last output has been read (nothing new
        for `quiet_s`; a loaded machine can be slow to hand the reader the final bytes)."""
        import time
        deadline = time.monotonic() + at_most_s
        seen = -1
        while time.monotonic() < deadline:
            with self._lock:
                now = len(self.raw)
            if now == seen:
                return
            seen = now
            time.sleep(quiet_s)

    def mark(self) -> int:
        """A place in the output: wait_for(…, after=mark) looks only at what came after it."""
        with self._lock:
            return len(self.raw)

    def shown_after(self, mark: int) -> str:
        with self._lock:
            return self.ESCAPES.sub(b"", self.raw[mark:]).decode(errors="replace")

    def shows(self, text: str, after=0) -> bool:
        """`text` was printed (after `mark`), or is on the screen now (without a mark). Runs of
        white space count as one space: a program wraps a long line at the terminal's edge
        where its text happens to fall (a longer project path moves the break)."""
        flat = " ".join(text.split())
        return (flat in " ".join(self.shown_after(after).split())
                or (not after and flat in " ".join(self.screen().split())))

    def wait_for(self, text: str, timeout=90, after=0) -> None:
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.shows(text, after):
                return
            if self.proc.poll() is not None:
                self.drain()                 # the last output may still be on its way
                if self.shows(text, after):
                    return
                break
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not shown (exit {self.proc.poll()}); the screen:\n"
                             f"{self.screen()}\nthe output, last:\n{self.text()[-3000:]}")

    def answer(self, question: str, keys: str, until: str | None = None, timeout=90, retry_after=30):
        """Answer a question the program shows: `keys` typed a moment after `question` is shown
        (a dialog drawn is not always listening yet), and again while it is still on the screen
        `retry_after` s later (keys a program drops while starting). Done when `until` is
        printed, or (without it) the question has left the screen."""
        import time
        self.wait_for(question, timeout)
        time.sleep(1.0)
        deadline = time.monotonic() + timeout + retry_after
        while True:
            mark = self.mark()
            self.type(keys)
            typed = time.monotonic()
            while time.monotonic() - typed < retry_after:
                if (self.shows(until, after=mark) or self.shows(until)) if until else \
                        question not in self.screen():
                    return
                time.sleep(0.2)
            if question not in self.screen() or time.monotonic() > deadline:
                break
        if until:
            self.wait_for(until, timeout=max(1, deadline - time.monotonic()))

    def type(self, keys: str, delay=0.03):
        import time
        for key in self.KEYS.findall(keys):
            os.write(self.master, key.encode())
            time.sleep(delay)

    def stty(self) -> str:
        return subprocess.run(["stty", "-a"], stdin=self.slave, capture_output=True, text=True,
                              check=True).stdout

    def wait(self, timeout=60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s; the terminal showed, last:\n"
                                 f"{self.text()[-4000:]}") from None

    def descendants(self) -> list[int]:
        """Every process started under the command, deepest last."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids = [int(p) for p in f.read().split()]
            except OSError:
                kids = []
            out += kids
            todo += kids
        return out

    def close(self):
        import signal
        if self.proc.poll() is None:
            for pid in [self.proc.pid, *self.descendants()]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait(30)
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass
        self._reader.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
