"""The sandboxed Node.js REPL that runs the model's code (repl.js), and its one channel.

One process per MCP session, kept across `execute` calls so that what the code defines stays
defined. It runs under the project's policy in bubblewrap, from the daemon's `spec`: no
network of its own, secrets unreadable, writes only where the policy allows. It reaches
upstream tools only by writing a `call` line on its stdout, which envgit answers."""

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from ..sandbox.launch import Launch, LaunchError

SOURCE = (Path(__file__).parent / "repl.js").read_text()
MAX_LINE = 256 * 1024 * 1024
START_TIMEOUT_S = 30


class ReplError(Exception):
    """The REPL could not start, exited, or broke its channel."""


@dataclass
class Done:
    output: str               # what the code printed (up to the cap)
    output_bytes: int         # how much it printed in all
    value: str | None         # the rendered value of its last expression / return
    error: str | None         # what it threw
    read_bytes: int | None    # what it read besides the channel (files), if measurable


def node_path() -> str:
    return os.environ.get("ENVGIT_NODE") or shutil.which("node") or "/usr/bin/node"


class Repl:
    def __init__(self, daemon, cwd: str, session: str | None, bindings: dict, cap: int):
        self.daemon, self.cwd, self.session = daemon, cwd, session
        self.config = json.dumps({"servers": bindings, "cap": cap})
        self.proc = None
        self.lock = anyio.Lock()          # one execution at a time
        self._exec_ids = iter(range(1, 1 << 62))
        self._on_call = None
        self._done: tuple[int, anyio.Event, dict] | None = None   # (exec id, Event, box) of the running execution
        self._stderr_tail = b""

    async def start(self, task_group):
        argv = [node_path(), "--expose-internals", "-e", SOURCE, self.config]
        spec = await self.daemon.spec(argv, self.cwd, dict(os.environ), self.session)
        try:
            launch = Launch(spec["bwrap"], self.cwd)     # as every sandbox starts: launch.py
        except LaunchError as e:
            raise ReplError(f"the sandboxed REPL did not start: {e}") from None
        try:
            # a session of its own: nothing the model's code runs can signal this server
            self.proc = await anyio.open_process(launch.argv, env=spec["env"], pass_fds=launch.pass_fds,
                                                 start_new_session=True)
            launch.spawned(self.proc.pid)
            # The REPL's spec names no step, so it has no proxy credentials (no network): were
            # it given some, the gate would refuse them, as nothing ties them to this sandbox.
            try:
                await anyio.to_thread.run_sync(launch.ready)
            except (OSError, ValueError):
                pass                                # bwrap did not start: seen below
            launch.release()
        finally:
            launch.close()
        self._stdout = BufferedByteReceiveStream(self.proc.stdout)
        self._group = task_group
        ready = anyio.Event()
        task_group.start_soon(self._read_stdout, ready)
        task_group.start_soon(self._read_stderr)
        with anyio.move_on_after(START_TIMEOUT_S):
            await ready.wait()
        if not ready.is_set() or self.proc.returncode is not None:
            await self.stop()
            raise ReplError(f"the sandboxed REPL did not start: {self._stderr_text()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self):
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.returncode is None:
            proc.kill()
        with anyio.move_on_after(5):
            await proc.wait()
        self._fail("the REPL was stopped")

    async def run(self, code: str, on_call, timeout: float) -> Done:
        """Run `code`; `on_call(msg)` answers each upstream call: ("ok", value) or ("error", text)."""
        exec_id = next(self._exec_ids)
        done = anyio.Event()
        box: dict = {}
        self._done, self._on_call = (exec_id, done, box), on_call
        await self._send({"op": "exec", "id": exec_id, "code": code})
        with anyio.move_on_after(timeout) as scope:
            await done.wait()
        self._on_call = None
        if scope.cancelled_caught:
            await self.stop()
            raise ReplError(f"the code ran longer than {timeout:g} s; the REPL was restarted "
                            "(what earlier calls defined is gone)")
        if "error" in box:
            raise ReplError(box["error"])
        return box["done"]

    async def _send(self, obj):
        try:
            await self.proc.stdin.send((json.dumps(obj) + "\n").encode())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, AttributeError) as e:
            raise ReplError(f"the REPL is gone: {self._stderr_text() or e}") from None

    async def _read_stdout(self, ready):
        proc = self.proc
        try:
            while True:
                line = await self._stdout.receive_until(b"\n", MAX_LINE)
                msg = json.loads(line)
                if msg.get("op") == "ready":
                    ready.set()
                elif msg.get("op") == "call":      # answered concurrently: Promise.all works
                    self._group.start_soon(self._answer, msg)
                elif msg.get("op") == "done" and self._done and self._done[0] == msg.get("exec"):
                    _, event, box = self._done
                    box["done"] = Done(msg.get("output") or "", msg.get("output_bytes") or 0,
                                       msg.get("value"), msg.get("error"), msg.get("read_bytes"))
                    event.set()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError,
                anyio.BrokenResourceError, anyio.DelimiterNotFound, ValueError):
            pass
        if proc is not None and proc.returncode is None:
            with anyio.move_on_after(2):
                await proc.wait()
        code = proc.returncode if proc is not None else None
        self._fail(f"the REPL exited (status {code}): {self._stderr_text()}".rstrip(": "))

    async def _answer(self, msg):
        on_call = self._on_call
        if on_call is None:
            kind, value = "error", "no execution is running"
        else:
            kind, value = await on_call(msg)
        reply = {"op": "reply", "call": msg["call"], "ok": kind == "ok"}
        reply["value" if kind == "ok" else "error"] = value
        try:
            await self._send(reply)
        except ReplError:
            pass                    # the REPL died meanwhile; run() reports it

    async def _read_stderr(self):
        # Node's own complaints (a crash): the tail is kept for the error message.
        try:
            async for chunk in self.proc.stderr:
                self._stderr_tail = (self._stderr_tail + chunk)[-4000:]
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, AttributeError):
            pass

    def _stderr_text(self):
        return self._stderr_tail.decode(errors="replace").strip()

    def _fail(self, reason):
        if self._done and not self._done[1].is_set():
            self._done[2]["error"] = reason
            self._done[1].set()
