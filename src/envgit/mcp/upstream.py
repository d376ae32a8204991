"""The upstream MCP servers of `mcp.servers`: connected once for the life of `envgit mcp`,
their tools listed for the declarations, their tools called on the code's behalf.

They run outside the sandbox, as an agent would run them (they hold their own tokens);
what the sandbox gets from them is only what a call returns, and every call is recorded. A
stdio server is a host command the policy names: it starts only once trusted (`envgit trust`),
from `/`, with the environment hostcmd/run.py builds (never the project's node_modules, modules
or PATH entries, whatever a step planted there). A url server is connected to only once
trusted too: its `${VAR}`s are the person's variables, sent where the URL says (and never one
env.deny names or an organisation credential reads)."""

import json
import os
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..hostcmd.run import HostCommandError
from ..hostcmd.trust import Untrusted
from .typescript import binding

if TYPE_CHECKING:
    from mcp import Client

CALL_TIMEOUT_S = 120       # any one request to an upstream server, the handshake included


class UpstreamError(Exception):
    """A tool call that failed upstream (an error result or a broken connection)."""


@dataclass
class Upstream:
    name: str
    client: "Client | None" = None            # entered; None until then, or if it failed
    tools: list[dict] = field(default_factory=list)   # tools/list entries, camelCase keys
    error: str | None = None                  # why it is not available

    def tool(self, name):
        return next((t for t in self.tools if t["name"] == name), None)


def _target(policy, name: str, spec: dict):
    from mcp import StdioServerParameters

    from ..hostcmd.run import stdio_server, url_server
    if spec.get("url"):
        return url_server(policy, name, spec, os.environ)
    if not spec.get("command"):
        raise ValueError("needs `command` (a stdio server) or `url` (streamable HTTP)")
    prog, args, env = stdio_server(policy, name, spec, os.environ)
    return StdioServerParameters(command=prog, args=args, env=env, cwd="/")


class Upstreams:
    def __init__(self, policy):
        self.policy, self.specs = policy, policy.mcp["servers"]
        self.servers: dict[str, Upstream] = {}
        self._stack = AsyncExitStack()

    async def __aenter__(self):
        from mcp import Client, StdioServerParameters
        await self._stack.__aenter__()
        for name, spec in self.specs.items():
            up = self.servers[name] = Upstream(name)
            try:
                target = _target(self.policy, name, spec)
            except (Untrusted, HostCommandError) as e:     # said as it is: one line, the fix
                up.error = str(e)
                print(f"envgit mcp: upstream server {name!r} is not started: {e}",
                      file=sys.stderr, flush=True)
                continue
            errlog = None
            try:
                if isinstance(target, StdioServerParameters):   # its stderr kept, to say why
                    from mcp.client.stdio import stdio_client
                    errlog = StderrHead()
                    target = stdio_client(target, errlog=errlog.file)
                client = await self._stack.enter_async_context(
                    Client(target, read_timeout_seconds=CALL_TIMEOUT_S))
                up.tools = await _list_tools(client)
                up.client = client
            except Exception as e:       # one broken server must not take the others down
                up.error = did_not_start(e, errlog)
                print(f"envgit mcp: upstream server {name!r} is not available: {up.error}",
                      file=sys.stderr, flush=True)
        return self

    async def __aexit__(self, *exc):
        return await self._stack.__aexit__(*exc)

    def available(self) -> dict[str, list[dict]]:
        return {n: u.tools for n, u in self.servers.items() if u.error is None}

    def bindings(self) -> dict[str, dict[str, str]]:
        """server -> {JS name: tool name}, for the REPL."""
        return {n: {binding(t["name"]): t["name"] for t in tools} for n, tools in self.available().items()}

    async def call(self, server: str, tool: str, args: dict):
        """The tool's value for the code: its structured content when it declares an output
        schema, else the text of its content blocks."""
        up = self.servers.get(server)
        # (a server without an error has its client: __aenter__ sets one or the other)
        if up is None or up.error is not None or up.client is None or up.tool(tool) is None:
            raise UpstreamError(f"{server}.{tool} is not a tool of an available server")
        try:
            result = await up.client.call_tool(tool, args)
        except Exception as e:
            raise UpstreamError(f"{server}.{tool}: {type(e).__name__}: {e}") from None
        text = "".join(b.text if b.type == "text"
                       else json.dumps(b.model_dump(mode="json", by_alias=True, exclude_none=True))
                       for b in result.content or [])
        if result.is_error:
            raise UpstreamError(f"{server}.{tool} failed: {text}")
        if up.tool(tool).get("outputSchema") and result.structured_content is not None:
            return result.structured_content
        return text


class StderrHead:
    """A stdio server's stderr: passed on to envgit mcp's own as it comes, its first lines kept
    (what a server that dies at start says about why)."""
    KEEP = 5

    def __init__(self):
        import threading
        r, w = os.pipe()
        self.file = os.fdopen(w, "w")
        self.lines: list[str] = []
        self._r = r
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        with os.fdopen(self._r, "rb") as f:
            for raw in f:
                line = raw.decode(errors="replace").rstrip()
                if line and len(self.lines) < self.KEEP:
                    self.lines.append(line[:200])
                try:
                    sys.stderr.write(raw.decode(errors="replace"))
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass

    def head(self, wait_s=0.5) -> list[str]:
        import time
        deadline = time.monotonic() + wait_s      # what the dead server wrote may be in the pipe
        while not self.lines and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.lines)


def did_not_start(e: BaseException, errlog: "StderrHead | None") -> str:
    """One line: the error itself (not the task group wrapping it) and the first lines the
    server wrote to its stderr."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    said = errlog.head() if errlog is not None else []
    return text + (f"; its stderr began: {' | '.join(said)}" if said else "")


async def _list_tools(client) -> list[dict]:
    tools, cursor = [], None
    for _ in range(100):                 # a paginator that never ends cannot hang start-up
        page = await client.list_tools(cursor=cursor)
        tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tools
