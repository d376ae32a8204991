"""Each `execute` as a record-only step of the session daemon: begin, its events, end.

The daemon client is blocking (it is the stdlib-only hot path's); here it runs in a worker
thread, one connection per execution, so that envgit mcp dying mid-execution leaves the step
recorded as interrupted, as `envgit run` dying would."""

import os

import anyio

from ..daemon.client import connect


class RecordError(Exception):
    pass


class Daemon:
    """Requests to the project's session daemon (started if it is not running)."""

    def __init__(self, project):
        self.project = project

    async def open(self) -> "Recording":
        conn = await anyio.to_thread.run_sync(connect, self.project)
        return Recording(conn)

    async def spec(self, argv, cwd, env, session) -> dict:
        """The bwrap command line of a long-lived sandboxed helper (the REPL)."""
        rec = await self.open()
        try:
            return await rec.request({"op": "spec", "argv": argv, "cwd": cwd, "env": env, "session": session})
        finally:
            rec.close()


class Recording:
    """One connection, one step at a time; requests are serialised (the code may make tool
    calls concurrently, each recorded as it ends)."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = anyio.Lock()
        self.step = None

    async def request(self, msg) -> dict:
        async with self.lock:
            reply = await anyio.to_thread.run_sync(self.conn.request, msg)
        if "error" in reply:
            raise RecordError(reply["error"])
        return reply

    async def begin(self, argv, cwd, session, marks=()) -> int:
        reply = await self.request({"op": "begin", "argv": argv, "cwd": cwd, "env": {}, "pid": os.getpid(),
                                    "uid": os.getuid(), "session": session, "record_only": True,
                                    "marks": list(marks)})
        self.step = reply["step"]
        return self.step

    async def event(self, kind, body):
        await self.request({"op": "event", "step": self.step, "kind": kind, "body": body})

    async def end(self, exit_code, duration_ms, marks, extra) -> dict:
        return await self.request({"op": "end", "step": self.step, "exit_code": exit_code,
                                   "duration_ms": duration_ms, "marks": marks, "extra": extra})

    def close(self):
        self.conn.close()
