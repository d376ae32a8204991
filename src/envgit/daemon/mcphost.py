"""`envgit mcp` for an agent whose MCP servers start inside its own sandbox (Claude Code under
`envgit claude`): asked for over the inner control socket (inner.py's op `mcp`), it runs on the
host, as the person started it, on the caller's stdin, stdout and stderr.

Why not inside: the server is envgit's own client of the daemon (each execution is a step with
its snapshot), it writes envgit's state (read-only inside, as it must stay), and its upstream
servers run outside the sandbox with the person's tokens (docs/MCP.md). Why it is safe to
start on a request from inside: what runs is fixed here (this interpreter's envgit, `mcp`, the
session's own project), never a command line from the request; its upstreams come from
envgit.yaml, which nothing inside can write; its executions run in sandboxes as every step
does. The environment is the one the agent's launcher ran with (the person's, from the
`spec` request that started the agent), plus ENVGIT_SESSION: the server's executions are a
sub-session of the agent's (`<session>.mcpN`, mcp/server.py). The interpreter itself starts
as the daemon did (importpath.py): `-P` from "/", with the daemon's own PYTHON* variables, not
the launcher's: nothing the sandbox writes in the project (a planted `envgit/`, a `json.py`, a
PYTHONPATH of the person's naming the project's `src`) is on the host server's import path.
"""

import asyncio
import os
import signal
import sys

from ..importpath import PYTHON_ARGS, SPAWN_CWD

STOP_GRACE_S = 2.0       # after SIGTERM, before SIGKILL, once the caller has gone


def argv(project_root: str) -> list[str]:
    return [sys.executable, *PYTHON_ARGS, "-m", "envgit", "mcp", "--project", project_root]


def server_env(launch_env: dict, session: str) -> dict:
    """The launcher's environment for what the server starts, the daemon's for the interpreter."""
    env = {k: v for k, v in launch_env.items() if not k.startswith("PYTHON")}
    env.update((k, v) for k, v in os.environ.items() if k.startswith("PYTHON"))
    env["ENVGIT_SESSION"] = session
    # Whoever holds the fds is the MCP client, and any process of the agent's sandbox can ask
    # for a server: its `ask` rules are put to the person out of band (`envgit approve`, the
    # page), as the gate's are, never answered by the client (mcp/server.py).
    env["ENVGIT_MCP_ASKS"] = "elsewhere"
    env.pop("ENVGIT_STEP", None)
    return env


async def serve(project_root, fds, session, env, gone, running: set | None = None) -> dict:
    """Run the server on `fds` (stdin, stdout, stderr) until it exits, or until the caller goes
    away (`gone`: Claude stopped the server, or exited); its exit status. Its pid is in
    `running` while it runs (the inner socket ends them all when it closes: stop())."""
    env = server_env(env, session)
    try:
        proc = await asyncio.create_subprocess_exec(*argv(project_root), stdin=fds[0], stdout=fds[1],
                                                    stderr=fds[2], env=env, cwd=SPAWN_CWD,
                                                    start_new_session=True)
    except OSError as e:         # said by the caller (inner_shim.py): never a write here that could block
        return {"error": f"envgit: envgit mcp could not start: {e}", "exit": 125}
    if running is not None:
        running.add(proc.pid)
    try:
        return await _wait(proc, gone)
    finally:
        if running is not None:
            running.discard(proc.pid)


def stop(pids) -> None:
    """End the servers still running (the daemon is stopping): each its own process group."""
    for pid in list(pids):
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass


async def _wait(proc, gone) -> dict:
    waiting = asyncio.ensure_future(proc.wait())
    left = asyncio.ensure_future(gone.wait())
    done, _ = await asyncio.wait({waiting, left}, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            await asyncio.wait_for(asyncio.shield(waiting), STOP_GRACE_S)
        except TimeoutError:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            await waiting
    left.cancel()
    rc = waiting.result()
    return {"exit_code": rc if rc >= 0 else 128 - rc}
