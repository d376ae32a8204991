"""The session daemon's connections: reading a client's frames within the bounds of frames.py,
the state each connection keeps (the steps it began, `mine`; whether its hello named another
build, `other_build`), and writing the replies (issue 25: the daemon by composition).

`Connections` is given what it needs of the session and nothing more: the protocol's
dispatch (protocol.py), the way to end a step its client left open (the session's
`interrupted`) and the event that stops the daemon. Its counts (connections, requests in
progress, the last activity) are what the session's idle watch reads.
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from ..journal import disk_full
from . import frames
from .client import PROTOCOL, decode, encode

EXIT_DISK_FULL = 5          # the journal could not be written (commands.EXIT_JOURNAL)
DISK_FULL = ("envgit: the disk holding .envgit is full: nothing was started and nothing new "
             "recorded; free some space and run the command again")


OTHER_BUILD = {"error": f"envgit: this project's session daemon is another build of envgit (protocol "
                        f"{PROTOCOL}) than this command's: `envgit daemon stop`, then run the command "
                        "again (or use one build)", "exit": 3}


async def decode_checked(body):
    """A client's frame as a dict, its counts checked against its length first (frames.py);
    a big one off the event loop, so that no frame stalls the other steps."""
    def load():
        frames.check_marshal(body)
        return decode(body)
    return await asyncio.to_thread(load) if len(body) > frames.THREAD_AT else load()


class Connections:
    def __init__(self, dispatch: Callable[[dict, asyncio.StreamWriter], Awaitable[dict]],
                 interrupted: Callable[[int, str], Awaitable[None]], stopping: asyncio.Event):
        self.dispatch = dispatch        # (request, the connection) -> the reply (protocol.py)
        self.interrupted = interrupted  # (step, reason): a step whose client went away
        self.stopping = stopping
        self.clients = 0
        self.in_request = 0
        self.frame_budget = frames.Budget()
        self.last_activity = time.monotonic()

    async def handle(self, reader, writer):
        """One client connection, within the bounds of frames.py: a cap on connections, on a
        frame's size and on the bytes of frames read at once, a time for a frame to arrive
        whole, and a connection with no step that stays silent is closed."""
        if self.clients >= frames.MAX_CONNS:
            writer.write(encode({"error": f"envgit: the session daemon already serves {self.clients} "
                                 "connections; try again when some steps have ended", "exit": 3}))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        self.clients += 1
        mine = set()
        first = True
        other_build = False          # its hello named another protocol (client.PROTOCOL)
        try:
            while True:
                # Between frames a connection may wait as long as it holds a step (a step
                # lasts what its command lasts); one without a step must speak soon.
                wait = None if mine else (frames.FIRST_FRAME_S if first else frames.QUIET_S)
                try:
                    head = await asyncio.wait_for(reader.readexactly(4), wait)
                    size = int.from_bytes(head, "big")
                    if size > frames.IN_FRAME_MAX:
                        writer.write(encode({"error": f"envgit daemon: a {size}-byte frame is more than "
                                             f"{frames.IN_FRAME_MAX} bytes", "exit": 2}))
                        break
                    counted = size > frames.SMALL      # a step's own frames never wait for room
                    if counted and not await self.frame_budget.take(size):
                        break
                    try:
                        body = await asyncio.wait_for(reader.readexactly(size), frames.FRAME_S)
                    finally:
                        if counted:
                            await self.frame_budget.give(size)
                except (TimeoutError, asyncio.IncompleteReadError):
                    break
                first = False
                self.last_activity = time.monotonic()
                self.in_request += 1
                msg = {}
                try:
                    msg = await decode_checked(body)
                    if msg.get("op") == "hello":
                        other_build = msg.get("protocol") != PROTOCOL
                    reply = (OTHER_BUILD if other_build and msg.get("op") not in ("hello", "status", "stop")
                             else await self.dispatch(msg, writer))
                except Exception as e:          # a bad message must not take the daemon down
                    reply = ({"error": DISK_FULL, "exit": EXIT_DISK_FULL} if disk_full(e) else
                             {"error": f"envgit daemon: {type(e).__name__}: {e}", "exit": 1})
                finally:
                    self.in_request -= 1
                    self.last_activity = time.monotonic()
                if msg.get("op") == "begin" and "step" in reply and "refused" not in reply:
                    mine.add(reply["step"])
                elif msg.get("op") == "end" and type(msg.get("step")) is int:
                    mine.discard(msg["step"])
                if "rid" in msg:
                    reply["rid"] = msg["rid"]
                writer.write(encode(reply))
                await writer.drain()
                if msg.get("op") == "stop":
                    self.stopping.set()
        except (ConnectionError, ValueError):
            pass
        finally:
            for step in mine:
                await self.interrupted(step, "envgit run exited before the step ended")
            self.clients -= 1
            self.last_activity = time.monotonic()
            writer.close()


def raise_fd_limit():
    """The soft limit on open files up to the hard one (at most 65536): connections, packs
    and the gate's sockets share it, and the connection cap (frames.MAX_CONNS) sits well
    below it, so accept() never fails for want of a descriptor."""
    import resource
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard if hard != resource.RLIM_INFINITY else 65536, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        pass
