"""`envgit mcp`: an MCP server with one tool, `execute {code, reset?}` (code mode).

The model writes JavaScript that calls the upstream servers of `mcp.servers` as typed async
functions; the code runs in the sandboxed REPL, and only what it prints or returns reaches
the model. Each execution is a record-only step; a tool call under an `ask` rule is put to
the person through MCP elicitation (a request mid-call up to protocol 2025-11-25, an
`InputRequiredResult` round from 2026-07-28), and refused when the client cannot ask."""

import hmac
import os
import secrets
import sys
from typing import Annotated

import anyio
from mcp_types import CallToolResult, ElicitRequest, ElicitRequestFormParams, InputRequiredResult, TextContent
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field

from .execution import Ask, Execution, Outcome
from .record import Daemon
from .repl import Repl
from .typescript import declarations
from .upstream import Upstreams

INPUT_REQUIRED_VERSION = "2026-07-28"
TOKEN_VAR = "ENVGIT_MCP_TOKEN"      # over HTTP: the bearer token every request must carry
ASK_KEY = "envgit-ask"


class Approval(BaseModel):
    allow: bool = Field(description="allow this one tool call")


class ReplSession:
    """What one MCP session keeps between executions: its REPL."""

    def __init__(self, app: "CodeMode", session_id: str):
        self.app = app
        self.daemon, self.cwd, self.upstreams = app.daemon, app.cwd, app.upstreams
        self.session_id = session_id
        self.repl_lock = anyio.Lock()
        self._repl: Repl | None = None

    async def repl(self, reset: bool) -> Repl:
        if self._repl is not None and (reset or not self._repl.alive()):
            await self._repl.stop()
            self._repl = None
        if self._repl is None:
            repl = Repl(self.daemon, self.cwd, self.session_id, self.upstreams.bindings(),
                        self.app.settings["max_return_bytes"] + 1)
            await repl.start(self.app.group)
            self._repl = repl
        return self._repl

    async def close(self):
        if self._repl is not None:
            await self._repl.stop()


class CodeMode:
    def __init__(self, project, policy, upstreams: Upstreams, group):
        self.daemon = Daemon(project)
        self.cwd = project.root
        self.policy, self.settings = policy, policy.mcp
        self.upstreams, self.group = upstreams, group
        self.session_id = os.environ.get("ENVGIT_SESSION")
        self.sessions: dict[str, ReplSession] = {}
        self.waiting: dict[str, tuple[Execution, Ask]] = {}   # request_state -> a paused execution

    def session(self, ctx) -> ReplSession:
        # stdio: one client per process; HTTP: one REPL per MCP session id
        key = (ctx.headers or {}).get("mcp-session-id", "") if ctx is not None else ""
        if key not in self.sessions:
            self.sessions[key] = ReplSession(self, self.client_session(len(self.sessions) + 1))
        return self.sessions[key]

    def client_session(self, n: int) -> str:
        """The session the steps of one MCP client are recorded in: inside an agent's session
        (ENVGIT_SESSION: `envgit mcp` as that agent's server), a sub-session of it,
        `<its id>.mcp<n>`; else one of its own, `mcp-<time>-<random>`, so one client's work is
        told from another's."""
        if self.session_id:
            return f"{self.session_id}.mcp{n}"
        from ..agents.session import new_session
        return new_session("mcp")

    def description(self) -> str:
        cap = self.settings["max_return_bytes"]
        missing = [f"// {n}: not available ({u.error})" for n, u in self.upstreams.servers.items() if u.error]
        decls = "\n".join([declarations(self.upstreams.available()), *missing, HELPERS]).strip()
        return DESCRIPTION.format(cap=cap, decls=decls)

    async def execute(self, code: str, reset: bool, ctx):
        state = ctx.request_state if ctx is not None else None
        if state and state in self.waiting:
            ex, ask = self.waiting.pop(state)
            ask.settle(*_answer_of((ctx.input_responses or {}).get(ASK_KEY)))
        else:
            ex = Execution(code, reset, self.session(ctx), self.settings, self.policy.ask_timeout)
            self.group.start_soon(ex.run)
        while True:
            event = await ex.next_event()
            if isinstance(event, Outcome):
                return _tool_result(event)
            paused = await self._put(event, ex, ctx)
            if paused is not None:
                return paused

    async def _put(self, ask: Ask, ex: Execution, ctx):
        """Ask the person through the client; an InputRequiredResult to return when the
        protocol asks that way; None when the ask was settled here."""
        caps = ctx.client_capabilities if ctx is not None else None
        if caps is None or caps.elicitation is None or os.environ.get("ENVGIT_MCP_ASKS") == "elsewhere":
            # nobody can be asked through the client, or the client is not the person's to
            # trust (the server run for an agent's sandbox: daemon/mcphost.py): `envgit
            # approve` from another terminal, or the page
            ask.settle(*await ex.ask_elsewhere(ask))
            return None
        if ctx.protocol_version and is_version_at_least(ctx.protocol_version, INPUT_REQUIRED_VERSION):
            state = secrets.token_urlsafe(16)
            self.waiting[state] = (ex, ask)
            return InputRequiredResult(
                input_requests={ASK_KEY: ElicitRequest(params=ElicitRequestFormParams(
                    message=ask.question, requested_schema=_APPROVAL_SCHEMA))},
                request_state=state)
        try:
            result = await ctx.elicit(ask.question, Approval)
        except Exception as e:
            ask.settle("deny", f"the elicitation failed ({type(e).__name__}: {e})")
            return None
        allow = result.action == "accept" and result.data.allow
        ask.settle("allow" if allow else "deny", f"MCP elicitation: {result.action}"
                   + (f", allow={result.data.allow}" if result.action == "accept" else ""))
        return None

    async def close(self):
        for s in self.sessions.values():
            await s.close()


def _answer_of(response) -> tuple[str, str]:
    action = getattr(response, "action", None)
    if action is None:
        return "deny", "the client retried without an answer"
    content = getattr(response, "content", None) or {}
    allow = action == "accept" and content.get("allow") is True
    return ("allow" if allow else "deny"), f"MCP elicitation: {action}" + (
        f", allow={content.get('allow')}" if action == "accept" else "")


def _tool_result(outcome: Outcome) -> CallToolResult:
    meta = {"envgit/step": outcome.step} if outcome.step is not None else None
    return CallToolResult(content=[TextContent(type="text", text=outcome.text or "(no output)")],
                          is_error=outcome.is_error, _meta=meta)     # (the field `meta`, by its alias)


def _approval_schema():
    from mcp.server.elicitation import render_elicitation_schema
    return render_elicitation_schema(Approval)


_APPROVAL_SCHEMA = _approval_schema()

HELPERS = """\
/** A few items spread over an array (lines of a string, entries of an object). */
declare function sample<T>(value: T, n?: number): T;
/** The shape of a value without its data: types, keys, array lengths, string lengths. */
declare function schema(value: unknown): unknown;
/** Throws Error(message) when cond is falsy. */
declare function assert(cond: unknown, message?: string): asserts cond;"""

DESCRIPTION = """\
Run JavaScript (Node.js) in envgit's sandbox. What the code prints (console.log) and the value of \
its last expression (or a top-level `return`) come back, at most {cap} bytes; everything else \
stays in the sandbox. Top-level await works, and variables and functions persist across calls \
until `reset: true`. The sandbox has no network and sees the project; `require` works.
Call the upstream MCP tools as typed async functions (a tool that fails throws):

```ts
{decls}
```

Print or return a summary, not the data. Before trusting a count or a pattern over data you \
did not read, check a sample of the matches: a too-broad regex is confidently wrong. Every \
execution is recorded as a step of the project (envgit log / envgit show)."""


async def serve(project, policy, transport: str, host: str, port: int) -> int:
    from mcp.server.mcpserver import Context, MCPServer
    listener = None
    if transport == "http":
        import socket
        try:
            # bound before the upstreams start: a taken port is said at once, and port 0 works
            listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as e:
            print(f"envgit mcp: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
            return 2
    async with Upstreams(policy) as upstreams, \
            anyio.create_task_group() as group:
        mode = CodeMode(project, policy, upstreams, group)
        app = MCPServer("envgit", instructions="Code mode: one `execute` tool; see its description.")

        async def execute(ctx: Context,
                          code: Annotated[str, Field(description="JavaScript to run in the REPL")],
                          reset: Annotated[bool, Field(description="start a fresh REPL first")] = False):
            return await mode.execute(code, reset, ctx)

        app.add_tool(execute, name="execute", description=mode.description(), structured_output=False)
        try:
            if listener is not None:
                await _serve_http(app, host, listener)
            else:
                await app.run_stdio_async()
        finally:
            await mode.close()
            group.cancel_scope.cancel()
    return 0


async def _serve_http(app, host: str, listener) -> None:
    import uvicorn
    token = os.environ.get(TOKEN_VAR)
    asgi = app.streamable_http_app(host=host)
    if token:
        asgi = BearerOnly(asgi, token)
    else:
        print(f"envgit mcp: {TOKEN_VAR} is not set: any local user can run code here with the "
              "upstream servers' tokens; set it, and have the client send it as a bearer token",
              file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level=app.settings.log_level.lower()))
    # said once the upstreams are up, so a client started on this line finds the tools ready
    # (`envgit codex` waits for it: with port 0 it is the only way to learn the port)
    print(f"envgit mcp: serving http://{_url_host(host)}:{listener.getsockname()[1]}/mcp",
          file=sys.stderr, flush=True)
    await server.serve(sockets=[listener])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class BearerOnly:
    """Every HTTP request must carry `Authorization: Bearer <token>`, else 401 (the MCP
    session's code runs with the upstream servers' tokens: no other local user may reach it)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not self.allowed(scope):
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http" and not self.allowed(scope):
            body = b"envgit mcp: a bearer token is required (Authorization: Bearer $ENVGIT_MCP_TOKEN)\n"
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="envgit mcp"')]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def allowed(self, scope) -> bool:
        got = b""
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                got = value
        scheme, _, token = got.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.token)
