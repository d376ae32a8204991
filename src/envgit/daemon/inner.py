"""The inner control socket: how a process *inside* a sandbox (Claude Code's shell-prefix shim)
asks for a command to run as a step of its own.

bwrap cannot nest (nested user namespaces are refused), so the step runs in a sibling sandbox
started by the daemon, with the caller's stdin, stdout and stderr handed over as file
descriptors (SCM_RIGHTS): the command writes to the agent's own pipes or terminal.

One socket per agent session, bound read-only into that session's sandbox at
`/run/envgit/control.sock`. It offers only:
  {"op": "run", "argv", "cwd", "env", "tool_call_id"?}  + 3 fds  -> {"step", "exit_code", "signal"}
  {"op": "record", "argv", "cwd", "tool_call_id"?, "marks"?, "body"?}  -> {"step"}
      a step for something already done inside (an agent's file edit): its snapshot, now
  {"op": "status"}                                                -> {"session", "live"}
Steps from it always belong to its session. Frames are those of client.py; a request's fds
travel with its frame's first bytes. The caller's side is inner_shim.py.
"""

import array
import asyncio
import os
import signal
import socket
import threading

from ..sandbox.seccomp import program
from .client import MAX_FRAME, decode, encode


class InnerSocket:
    def __init__(self, sess, session: str, path: str, loop):
        self.sess, self.session, self.path, self.loop = sess, session, path, loop
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True, name=f"inner-{session}").start()

    def close(self):
        self.sock.close()
        try:
            os.unlink(self.path)
            os.rmdir(os.path.dirname(self.path))     # a private temp dir, or .envgit/inner once empty
        except OSError:
            pass

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return                   # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                head, fds = _recv_with_fds(conn, 4)
                size = int.from_bytes(head, "big")
                if len(head) < 4 or size > MAX_FRAME:
                    return
                msg = decode(_recv_exact(conn, size))
                fut = asyncio.run_coroutine_threadsafe(self._dispatch(msg, fds), self.loop)
                reply = fut.result()
            except (OSError, ValueError, EOFError) as e:
                reply = {"error": f"envgit: inner socket: {e}", "exit": 1}
            try:
                conn.sendall(encode(reply))
            except OSError:
                pass

    async def _dispatch(self, msg, fds):
        try:
            if msg.get("op") == "status":
                return {"session": self.session, "live": sorted(self.sess.live)}
            if msg.get("op") == "record":
                return await record_step(self.sess, msg, self.session)
            if msg.get("op") != "run":
                return {"error": f"envgit: the inner socket offers run, record and status, not "
                                 f"{msg.get('op')!r}", "exit": 2}
            if len(fds) != 3:
                return {"error": "envgit: run needs stdin, stdout and stderr passed as fds", "exit": 2}
            return await run_step(self.sess, msg, fds, self.session)
        finally:
            for fd in fds:
                os.close(fd)


async def record_step(sess, msg, session):
    begin = await sess.begin({"argv": msg.get("argv") or ["edit"], "cwd": msg.get("cwd") or sess.project.root,
                              "uid": os.getuid(), "session": session, "record_only": True,
                              "tool_call_id": msg.get("tool_call_id"), "marks": msg.get("marks") or []})
    if "error" in begin:
        return begin
    if msg.get("body"):
        sess.event({"step": begin["step"], "kind": "note", "body": dict(msg["body"])})
    await sess.end({"step": begin["step"], "exit_code": 0})
    return {"step": begin["step"]}


async def run_step(sess, msg, fds, session):
    """Begin a step, run it in its own sandbox on the given stdio fds, end it (snapshot)."""
    begin = await sess.begin({"argv": msg.get("argv"), "cwd": msg.get("cwd"), "env": msg.get("env") or {},
                              "pid": None, "uid": os.getuid(), "session": session,
                              "tool_call_id": msg.get("tool_call_id")})
    if "error" in begin:
        return begin
    step = begin["step"]
    if "refused" in begin:
        os.write(fds[2], (begin["refused"] + "\n").encode())
        return {"step": step, "exit_code": 126, "signal": None}
    sess.live[step]["stderr_fd"] = os.dup(fds[2])       # denial notices go to the step's stderr
    argv = begin["bwrap"]
    prog = program()
    extra, keep = [], []
    if prog is not None:
        memfd = os.memfd_create("envgit-seccomp", 0)
        os.write(memfd, prog)
        os.lseek(memfd, 0, os.SEEK_SET)
        extra, keep = ["--seccomp", str(memfd)], [memfd]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        proc = await asyncio.create_subprocess_exec(argv[0], *extra, *argv[1:], stdin=fds[0], stdout=fds[1],
                                                    stderr=fds[2], env=begin["env"], pass_fds=keep)
    finally:
        for fd in keep:
            os.close(fd)
    sess.live[step]["proc"] = proc
    rc = await proc.wait()
    if rc < 0:                          # bwrap itself was killed
        code, sig = 128 - rc, -rc
    else:                               # bwrap reports a command killed by signal N as 128+N
        code, sig = rc, (rc - 128 if 128 < rc < 160 else 0)
    name = signal.Signals(sig).name if sig else None
    fd = sess.live.get(step, {}).pop("stderr_fd", None)
    if fd is not None:
        os.close(fd)
    await sess.end({"step": step, "exit_code": code, "signal": name,
                    "duration_ms": round((loop.time() - t0) * 1000, 3)})
    return {"step": step, "exit_code": code, "signal": name}


def _recv_with_fds(conn, n):
    fds = array.array("i")
    data, anc, _, _ = conn.recvmsg(n, socket.CMSG_LEN(16 * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            break
        data += more
    return data, list(fds)


def _recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError("the caller closed the connection")
        buf += chunk
    return buf
