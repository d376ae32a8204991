"""The host's side of a step's published ports (sandbox/publish.py): listeners on 127.0.0.1,
one per port, each connection joined to the socket file the step's listener serves inside.

The directory of socket files is the step's own (bound writable in its sandbox), so what a name
in it is, is the step's choice: each is opened relative to the directory the daemon made,
without following a link, must be a socket, and is connected to through that descriptor
(/proc/self/fd/N): never a path the step could point elsewhere. (A hard link to a socket
outside cannot be made: the directory is a mount of its own inside, and links do not cross one.)
What the step leaves in the directory is removed in a thread (a step can leave it a hundred
thousand files: never on the daemon's loop), through directory descriptors only (the step's
processes may still be dying) and through directories it made unreadable.
"""

import asyncio
import contextlib
import os
import stat
import threading

from ..policy.ports import PublishError

HOST = "127.0.0.1"
CHUNK = 65536
# Connections joined at once, per step: each holds two of the daemon's descriptors, which every
# step and client of the project share; a browser opens a handful to a dev server.
MAX_JOINED = 256


class Published:
    """A step's published ports: (host port, step port) pairs, listened for until `close`."""

    def __init__(self, directory: str, pairs: list[tuple[int, int]]):
        self.directory = directory
        self.pairs = pairs
        self.servers: list[asyncio.base_events.Server] = []
        self.dirfd: int | None = None
        self.skipped: list[str] = []       # the policy's ports left out (open: `optional`)
        self.joined: dict[asyncio.Task, asyncio.StreamWriter] = {}     # and the person's end

    async def open(self, optional=frozenset()):
        """Make the directory and listen on every host port; PublishError naming the port that
        cannot be listened on (nothing is left listening then). A host port in `optional`
        (one the policy publishes for every step) that cannot be listened on is left out and
        said in `self.skipped` instead: the step runs without it."""
        os.makedirs(self.directory, mode=0o700)
        self.dirfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        kept = []
        try:
            for host_port, step_port in self.pairs:
                try:
                    server = await asyncio.start_server(
                        lambda r, w, p=step_port: self._join(r, w, p), HOST, host_port, reuse_address=True)
                except OSError as e:
                    why = "another program listens there" if e.errno == 98 else (e.strerror or str(e))
                    if host_port in optional:
                        self.skipped.append(f"port {step_port} is not published at {HOST}:{host_port}: {why}")
                        continue
                    raise PublishError(f"cannot publish port {step_port} at {HOST}:{host_port}: {why}; "
                                       f"choose another host port: -p {host_port + 1}:{step_port}") from None
                self.servers.append(server)
                kept.append((host_port, step_port))
        except BaseException:
            self.close()
            raise
        self.pairs = kept

    def _join(self, reader, writer, step_port):
        if len(self.joined) >= MAX_JOINED:      # held open by the step's server: refused
            writer.close()
            return
        task = asyncio.ensure_future(self._pipe(reader, writer, step_port))
        self.joined[task] = writer
        task.add_done_callback(lambda t: self.joined.pop(t, None))

    async def _pipe(self, reader, writer, step_port):
        fd = None
        try:
            if self.dirfd is None:
                raise OSError("the step has ended")
            fd = os.open(f"{step_port}.sock", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dirfd)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):     # the person's connection closed too
                raise OSError("not a socket")
            inner_r, inner_w = await asyncio.open_unix_connection(f"/proc/self/fd/{fd}")
        except OSError:
            writer.close()
            return
        finally:
            if fd is not None:
                os.close(fd)
        try:
            await asyncio.gather(_copy(reader, inner_w), _copy(inner_r, writer))
        finally:
            for w in (writer, inner_w):
                w.close()

    def close(self):
        """Stop listening and end every joined connection; the directory goes too."""
        for server in self.servers:
            server.close()
        self.servers = []
        for task, writer in list(self.joined.items()):
            task.cancel()
            writer.close()          # a task cancelled before it ran would leave it open
        if self.dirfd is not None:
            os.close(self.dirfd)
            self.dirfd = None
        threading.Thread(target=remove, args=(self.directory,), daemon=True).start()

    def listing(self) -> list[list[int]]:
        return [[h, s] for h, s in self.pairs]


async def _copy(reader, writer):
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        if writer.can_write_eof():
            writer.write_eof()


def remove(path):
    """The directory `path` and everything in it, as far as can be: each name opened relative
    to its directory without following a link, each directory made its owner's (0700) before
    it is listed, and listed once. Iterative: a deep tree costs a descriptor a level, not the
    stack."""
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    # (descriptor, name in its parent, its subdirectories still to remove)
    stack = [(top, path, _clear(top))]
    while stack:
        dfd, me, subdirs = stack[-1]
        name = next(subdirs, None)
        if name is not None:
            if (sub := _open_dir(name, dfd)) is not None:
                stack.append((sub, name, _clear(sub)))
            continue
        stack.pop()
        os.close(dfd)
        with contextlib.suppress(OSError):
            if stack:
                os.rmdir(me, dir_fd=stack[-1][0])
            else:
                os.rmdir(path)


def _clear(dfd):
    """Every name in the directory but its subdirectories unlinked; an iterator of those."""
    subdirs = []
    with contextlib.suppress(OSError):
        for name in os.listdir(dfd):
            try:
                os.unlink(name, dir_fd=dfd)
            except IsADirectoryError:
                subdirs.append(name)
            except OSError:
                pass
    return iter(subdirs)


def _open_dir(name, dfd) -> int | None:
    """The directory `name` in `dfd` opened for listing, made its owner's first; None for a
    link, anything else, or a directory that cannot be opened."""
    try:
        ref = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        os.chmod(f"/proc/self/fd/{ref}", 0o700)     # the directory itself: no name to swap
        return os.open(f"/proc/self/fd/{ref}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(ref)
