"""Codex's exec-server, over stdio, with every process and every file operation an envgit step.

Codex (0.171, `environments.toml` with `include_local = false`) sends here all it would
otherwise do on the machine itself: shell commands (`process/start`) and apply_patch's and
view_image's file I/O (`fs/*`). Each is performed by the real `envgit run` client, so the
session daemon records it and the sandbox enforces the policy on it: a read of a denied
path fails inside the sandbox, a write outside the project fails, a push is judged by the
network gate. Only `fs/getMetadata` (existence probes Codex makes at every start) is answered
here, from the host, after the same path decision the sandbox uses.

Framing: one JSON object per line, no "jsonrpc" field; requests {id, method, params},
responses {id, result} or {id, error: {code, message}}; notifications {method, params}.

    python -m envgit.agents.execserver --project ROOT --session S [--calls FILE]
"""

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote, urlparse

from .session import envgit_exe

NOT_FOUND, INVALID_REQUEST, UNKNOWN_METHOD, INVALID_PARAMS, FAILED = -32004, -32600, -32601, -32602, -32603
KEEP_BYTES = 8 * 1024 * 1024        # output kept per process for process/read
TERM_GRACE_S = 3.0
MAX_WAIT_MS = 30_000


class RpcError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def path_of(uri: str) -> str:
    if not isinstance(uri, str) or not uri:
        raise RpcError(INVALID_PARAMS, "a path is required")
    if uri.startswith("file://"):
        return unquote(urlparse(uri).path)
    if not uri.startswith("/"):
        raise RpcError(INVALID_PARAMS, f"not an absolute path: {uri}")
    return uri


def file_uri(path: str) -> str:
    return "file://" + path


class Process:
    """One `envgit run` child: its output as numbered chunks, kept for process/read."""

    def __init__(self, pid_key, popen, stdin_fd, tty):
        self.key, self.popen, self.stdin_fd, self.tty = pid_key, popen, stdin_fd, tty
        self.cond = threading.Condition()
        self.seq = 0
        self.chunks: list[tuple[int, str, bytes]] = []
        self.kept = 0
        self.exit_code = None
        self.closed = False

    def next_seq(self):
        self.seq += 1
        return self.seq

    def add(self, stream, data) -> int:
        with self.cond:
            seq = self.next_seq()
            self.chunks.append((seq, stream, data))
            self.kept += len(data)
            while self.kept > KEEP_BYTES and len(self.chunks) > 1:
                self.kept -= len(self.chunks.pop(0)[2])
            self.cond.notify_all()
            return seq


class ExecServer:
    def __init__(self, project_root, session, out, calls_file=None):
        self.root, self.session, self.out = project_root, session, out
        self.calls_file = calls_file
        self.envgit = envgit_exe()
        self.home = os.path.realpath(os.environ.get("HOME") or os.path.expanduser("~"))
        self.write_lock = threading.Lock()
        self.procs: dict[str, Process] = {}
        self.pool = ThreadPoolExecutor(max_workers=32)
        self.policy = None          # the project's policy file (daemon/policyfile.py), on first use

    # --- wire --------------------------------------------------------------------------

    def send(self, obj):
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.write_lock:
            self.out.write(line)
            self.out.flush()

    def serve(self, stdin):
        for raw in stdin:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "id" in msg and "method" in msg:
                self.pool.submit(self.handle, msg)
        for p in list(self.procs.values()):        # Codex went away: so do its processes
            self._terminate(p)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def handle(self, msg):
        rid, method, params = msg["id"], msg["method"], msg.get("params") or {}
        fn = getattr(self, "op_" + method.replace("/", "_"), None)
        if fn is None:
            return self.send({"id": rid, "error": {"code": UNKNOWN_METHOD,
                                                   "message": f"envgit exec-server does not implement `{method}`"}})
        try:
            result = fn(params, rid)
        except RpcError as e:
            return self.send({"id": rid, "error": {"code": e.code, "message": str(e)}})
        except Exception as e:          # one bad request must not end the session
            return self.send({"id": rid, "error": {"code": FAILED, "message": f"{type(e).__name__}: {e}"}})
        if result is not None:
            self.send({"id": rid, "result": result})

    # --- handshake -----------------------------------------------------------------------

    def op_initialize(self, params, rid):
        # Empty capabilities: Codex then uses plain fs/readFile and fs/writeFile, never the
        # streaming or watching calls, and starts no network proxy of its own.
        return {"sessionId": self.session,
                "environmentInfo": {"shell": {"name": "bash", "path": "/bin/bash"},
                                    "cwd": file_uri(os.getcwd()), "userHomeDir": file_uri(self.home),
                                    "platformOs": "linux", "capabilities": {}}}

    # --- steps ---------------------------------------------------------------------------

    def step_env(self, tool_call_id=None):
        """The environment of a host-side launcher: this server's own, never the request's."""
        env = {**os.environ, "ENVGIT_SESSION": self.session}
        env.pop("ENVGIT_TOOL_CALL_ID", None)
        call = tool_call_id or self.current_call()
        if call:
            env["ENVGIT_TOOL_CALL_ID"] = call
        return env

    def current_call(self):
        """The tool call Codex is running, as its PreToolUse hook wrote it (fs/* requests
        carry no tool-call id of their own)."""
        if not self.calls_file:
            return None
        try:
            with open(self.calls_file) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def inside(self, cwd) -> str:
        """`cwd` if it is in this session's project (a command runs there, under its policy, as
        a step of its journal); another directory, another project's included, is refused."""
        real = os.path.realpath(cwd)
        if real != self.root and not real.startswith(self.root + "/"):
            raise RpcError(INVALID_PARAMS, f"envgit: the working directory {cwd} is outside this "
                                           f"session's project {self.root}; commands run in it only")
        return real

    def run_step(self, argv, data=None):
        """One `envgit run` whose output is captured: (exit code, stdout, stderr)."""
        r = subprocess.run([self.envgit, "run", "--", *argv], cwd=self.root, env=self.step_env(),
                           input=data if data is not None else b"", capture_output=True,
                           timeout=600)
        return r.returncode, r.stdout, r.stderr.decode(errors="replace")

    def fs_step(self, argv, path, data=None):
        code, out, err = self.run_step(argv, data)
        if code == 0:
            return out
        text = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
        if "No such file" in err:
            raise RpcError(NOT_FOUND, "No such file or directory (os error 2)")
        if "Permission denied" in err or "Read-only file system" in err:
            raise RpcError(FAILED, f"{text} (refused by the envgit sandbox: {path} is outside what "
                                   "this project's policy lets a step read or write)")
        raise RpcError(FAILED, text)

    # --- processes -----------------------------------------------------------------------

    def op_process_start(self, params, rid):
        key, argv = params.get("processId"), params.get("argv")
        if not key or not argv or not isinstance(argv, list):
            raise RpcError(INVALID_PARAMS, "process/start needs processId and argv")
        if key in self.procs:
            raise RpcError(INVALID_REQUEST, f"process id {key} is already in use")
        cwd = self.inside(path_of(params.get("cwd") or file_uri(self.root)))
        call = (params.get("metadata") or {}).get("toolCallId")
        requested = params.get("env") or {}
        if not isinstance(requested, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in requested.items()):
            raise RpcError(INVALID_PARAMS, "process/start's env must be an object of strings")
        env = self.step_env(call)
        # The launcher runs on the host with this server's environment; the requested one is the
        # step's, sent to the daemon (steprun.py), whose policy scrubs it for the sandbox. HOME
        # stays this session's: it decides the step's view.
        wanted = {**env, **requested, "HOME": env.get("HOME", self.home)}
        env_r, env_w = os.pipe()
        tty = bool(params.get("tty"))
        cmd = [sys.executable, "-I", "-m", "envgit.agents.steprun", str(env_r), "--", *argv]
        try:
            if tty:
                import pty
                master, slave = pty.openpty()
                popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                                         start_new_session=True, preexec_fn=_take_tty, pass_fds=(env_r,))
                os.close(slave)
                proc = Process(key, popen, master, True)
                streams = [(master, "pty")]
            else:
                popen = subprocess.Popen(cmd, cwd=cwd, env=env, pass_fds=(env_r,),
                                         stdin=subprocess.PIPE if params.get("pipeStdin") else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
                proc = Process(key, popen, popen.stdin.fileno() if popen.stdin else None, False)
                streams = [(popen.stdout.fileno(), "stdout"), (popen.stderr.fileno(), "stderr")]
        except BaseException:
            os.close(env_w)
            raise
        finally:
            os.close(env_r)
        threading.Thread(target=_feed, args=(env_w, json.dumps(wanted).encode()), daemon=True).start()
        self.procs[key] = proc
        # The answer goes out before any output notification of this process.
        self.send({"id": rid, "result": {"processId": key, "sandboxType": "none"}})
        pumps = [threading.Thread(target=self._pump, args=(proc, fd, name), daemon=True)
                 for fd, name in streams]
        for t in pumps:
            t.start()
        threading.Thread(target=self._reap, args=(proc, pumps), daemon=True).start()
        return None

    def _pump(self, proc, fd, stream):
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:             # a pty's master reads EIO once the slave side is gone
                data = b""
            if not data:
                return
            seq = proc.add(stream, data)
            self.send({"method": "process/output", "params": {
                "processId": proc.key, "seq": seq, "stream": stream,
                "chunk": base64.b64encode(data).decode()}})

    def _reap(self, proc, pumps):
        code = proc.popen.wait()
        for t in pumps:
            t.join()
        with proc.cond:
            proc.exit_code = code if code >= 0 else 128 - code
            exited = proc.next_seq()
            closed = proc.next_seq()
            proc.closed = True
            proc.cond.notify_all()
        if proc.tty:
            os.close(proc.stdin_fd)
        self.send({"method": "process/exited", "params": {
            "processId": proc.key, "seq": exited, "exitCode": proc.exit_code, "sandboxDenied": False}})
        self.send({"method": "process/closed", "params": {"processId": proc.key, "seq": closed}})

    def _proc(self, params):
        proc = self.procs.get(params.get("processId"))
        if proc is None:
            raise RpcError(INVALID_REQUEST, f"unknown process id {params.get('processId')}")
        return proc

    def op_process_read(self, params, rid):
        proc = self._proc(params)
        after = int(params.get("afterSeq") or 0)
        limit = int(params.get("maxBytes") or KEEP_BYTES)
        deadline = time.monotonic() + min(int(params.get("waitMs") or 0), MAX_WAIT_MS) / 1000
        with proc.cond:
            while not proc.closed and not any(s > after for s, _, _ in proc.chunks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                proc.cond.wait(left)
            out, size, last = [], 0, after
            for seq, stream, data in proc.chunks:
                if seq <= after:
                    continue
                if out and size + len(data) > limit:
                    break
                out.append({"seq": seq, "stream": stream, "chunk": base64.b64encode(data).decode()})
                size, last = size + len(data), seq
            return {"chunks": out, "nextSeq": last + 1, "exited": proc.exit_code is not None,
                    "exitCode": proc.exit_code, "closed": proc.closed, "failure": None,
                    "sandboxDenied": False}

    def op_process_write(self, params, rid):
        if not params.get("writeId"):
            raise RpcError(INVALID_PARAMS, "writeId must not be empty")
        proc = self.procs.get(params.get("processId"))
        if proc is None or proc.stdin_fd is None or proc.closed:
            return {"status": "unknownProcess" if proc is None else "stdinClosed"}
        data = base64.b64decode(params.get("chunk") or "")
        try:
            os.write(proc.stdin_fd, data)
            if params.get("closeStdin") and not proc.tty:
                proc.popen.stdin.close()
                proc.stdin_fd = None
        except OSError:
            return {"status": "stdinClosed"}
        return {"status": "accepted"}

    def op_process_signal(self, params, rid):
        proc = self._proc(params)
        if params.get("signal") != "interrupt":
            raise RpcError(INVALID_PARAMS, f"unknown signal {params.get('signal')!r}, expected `interrupt`")
        # As Ctrl-C would: to the whole process group (envgit run ignores SIGINT itself and
        # waits to record the command's end).
        _killpg(proc.popen.pid, signal.SIGINT)
        return {}

    def op_process_terminate(self, params, rid):
        proc = self.procs.pop(params.get("processId"), None)
        if proc is None:
            return {"running": False}
        return {"running": self._terminate(proc)}

    def _terminate(self, proc) -> bool:
        if proc.popen.poll() is not None:
            return False
        proc.popen.terminate()          # envgit run passes SIGTERM on to the command

        def kill_later():
            try:
                proc.popen.wait(TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                _killpg(proc.popen.pid, signal.SIGKILL)
        threading.Thread(target=kill_later, daemon=True).start()
        return True

    # --- files: each one a step, so the sandbox applies the policy to it ----------------

    def op_fs_readFile(self, params, rid):
        path = path_of(params.get("path"))
        data = self.fs_step(["cat", "--", path], path)
        verdict = self.decide(path)
        if verdict is not None:     # the step read the denied path's placeholder: said as the error
            raise RpcError(NOT_FOUND, f"No such file or directory (os error 2) (not in the envgit "
                                      f"sandbox's view: {verdict})")
        return {"dataBase64": base64.b64encode(data).decode()}

    def op_fs_writeFile(self, params, rid):
        path = path_of(params.get("path"))
        try:
            data = base64.b64decode(params.get("dataBase64") or "", validate=True)
        except ValueError:
            raise RpcError(INVALID_PARAMS, "fs/writeFile requires valid base64 dataBase64") from None
        self.fs_step(["sh", "-c", 'cat > "$1"', "envgit-write", path], path, data)
        return {}

    def op_fs_createDirectory(self, params, rid):
        path = path_of(params.get("path"))
        self.fs_step(["mkdir", *(["-p"] if params.get("recursive", True) else []), "--", path], path)
        return {}

    def op_fs_remove(self, params, rid):
        path = path_of(params.get("path"))
        flags = ("r" if params.get("recursive", True) else "") + ("f" if params.get("force", True) else "")
        self.fs_step(["rm", *([f"-{flags}"] if flags else []), "--", path], path)
        return {}

    def op_fs_copy(self, params, rid):
        src, dst = path_of(params.get("sourcePath")), path_of(params.get("destinationPath"))
        self.fs_step(["cp", "-P", *(["-R"] if params.get("recursive") else []), "--", src, dst], dst)
        return {}

    def op_fs_readDirectory(self, params, rid):
        path = path_of(params.get("path"))
        listing = self.fs_step(["find", path, "-mindepth", "1", "-maxdepth", "1", "-printf", r"%y %f\0"], path)
        entries = []
        for item in listing.split(b"\0"):
            if item:
                kind, _, name = item.decode(errors="surrogateescape").partition(" ")
                entries.append({"fileName": name, "isDirectory": kind == "d", "isFile": kind == "f"})
        return {"entries": entries}

    def op_fs_getMetadata(self, params, rid):
        path = path_of(params.get("path"))
        verdict = self.decide(path)
        if verdict is not None:
            raise RpcError(NOT_FOUND, f"No such file or directory (os error 2) (not in the envgit "
                                      f"sandbox's view: {verdict})")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise RpcError(NOT_FOUND, "No such file or directory (os error 2)") from None
        except OSError as e:
            raise RpcError(FAILED, f"{e.strerror} (os error {e.errno})") from None
        import stat as st_mod
        return {"isDirectory": st_mod.S_ISDIR(st.st_mode), "isFile": st_mod.S_ISREG(st.st_mode),
                "isSymlink": st_mod.S_ISLNK(st.st_mode), "size": st.st_size, "createdAtMs": 0,
                "modifiedAtMs": st.st_mtime_ns // 1_000_000}

    def decide(self, path) -> str | None:
        """Why the sandbox would not show `path` (the same decision its mounts follow), or None."""
        from ..daemon.policyfile import PolicyFile
        from ..paths import POLICY_FILE
        from ..policy import PolicyError, decide_path
        if self.policy is None:
            self.policy = PolicyFile(os.path.join(self.root, POLICY_FILE))
        try:
            policy = self.policy.current()      # re-read when it (or the org's, or yours) changes
        except (OSError, PolicyError) as e:
            return f"the policy cannot be read: {e}"
        d = decide_path(policy, os.path.normpath(path), self.root, self.home)
        return d.rule if d.access == "none" else None


def _feed(fd, data):
    """The step's environment to its launcher's pipe (in a thread: it may be over a pipe's buffer)."""
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
    finally:
        os.close(fd)


def _take_tty():
    """In the child: make the pty (already its stdin) the controlling terminal of its session."""
    import fcntl
    import termios
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _killpg(pid, sig):
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m envgit.agents.execserver")
    p.add_argument("--project", required=True)
    p.add_argument("--session", required=True)
    p.add_argument("--calls", help="the file Codex's PreToolUse hook writes the current tool-call id to")
    a = p.parse_args(argv)
    os.chdir(a.project)
    server = ExecServer(os.path.realpath(a.project), a.session, sys.stdout.buffer, a.calls)
    server.serve(sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
