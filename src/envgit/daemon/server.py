"""The session daemon's server: `Session`, one per project, wiring the parts (the steps, the
network gate, snapshots, rewinds, the questions of asks.py), and `serve`, the daemon's start
and stop. The protocol it speaks, its ops and their replies, is protocol.py's (`OPS`); its
clients' connections and their frames are serve.py's.

Snapshots run in a worker thread, so a long one never stalls the event loop (and the proxy).
"""

import asyncio
import contextlib
import fcntl
import functools
import os
import secrets
import shutil
import signal
import sqlite3
import sys
import time

from .. import faults, steporder
from ..inert import inert
from ..journal import Journal, disk_full
from ..paths import Project, UnixAddress
from ..policy import PolicyError
from ..remote.auto import AutoPush
from ..sandbox import backend, kernel
from ..sandbox.projectscan import ProjectScan
from ..sandbox.spec import build
from ..sandbox.tracked import tracked_denied, warning
from ..snapshot import CorruptObject, StoreError
from . import degraded, heldends, netadvice, protocol, rewind, steps
from .asks import Asks, user_name
from .client import encode
from .denials import DenialWatch, read_notice
from .grants import Grants
from .heldends import log_line
from .inner import InnerSocket
from .learn import LearnState
from .livestep import LiveStep
from .policyfile import PolicyFile
from .repair import mark_interrupted
from .serve import Connections, raise_fd_limit
from .snapshots import Snapshotter

IDLE_S = float(os.environ.get("ENVGIT_DAEMON_IDLE", "900"))


class Session:
    def __init__(self, project: Project):
        self.project = project
        self.journal = Journal(project.journal)
        self.scan = ProjectScan(project.root)
        self.id = time.strftime("s%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        self.live: dict[int, LiveStep] = {}
        # the policy, re-read when its file changes (policyfile.py)
        self.policyfile = PolicyFile(project.policy)
        self.policy = self.policyfile.current
        self.policy_for_gate = self.policyfile.for_gate
        self.load_policy_off_loop = self.policyfile.load_off_loop
        self.unrecorded: list[tuple] = []   # (step, kind, body) a full disk held back, oldest first
        self.orphans_pending = False    # the start-up could not close orphaned steps (disk full)
        self.stopping = asyncio.Event()
        # the clients' connections (serve.py), each request dispatched by protocol.py
        self.conns = Connections(functools.partial(protocol.dispatch, self), self.interrupted,
                                 self.stopping)
        self.snapshotter = Snapshotter(project)
        # The newest tree in time, not the highest step's: steps run at once (steporder.py).
        newest = steporder.newest_tree(self.journal)
        self.last_tree = newest.tree if newest else None
        # Whether what changed since last_tree may be a step's own (its snapshot failed, it
        # was killed before one, the journal lost its entries): then it is not called outside.
        self.tree_unknown = bool(self.journal.lost_now) or steporder.newest_untreed(self.journal)
        self.pending_baseline = None   # taken, not yet written on a step
        self.warming: dict | None = None   # a warm-up's walk counters while it runs (steps.warm)
        self.outside_notices: list[str] = []   # said after the next step ends (outside.py: bits stripped)
        # Held while the directory is compared with last_tree (outside changes) and by a
        # rewind while it writes: no step begins halfway through either.
        self.tree_lock = asyncio.Lock()
        self.starting = 0               # steps begun and not yet live (their sandbox being built)
        self.gate = None               # the network gate, started by the first step needing it
        self.gate_failed = False
        self.gate_task = None          # its start-up, in the background (steps.start_gate)
        self.certs_dir = None
        self.inner: dict[str, InnerSocket] = {}     # session -> its inner control socket
        self.grants = Grants(self.journal)       # remembered answers (grants.py), from the journal
        # the questions steps' requests raise, for a person (asks.py)
        self.asks = Asks(self.journal, self.grants, self.live, self.policy, self.push,
                         lambda: self.gate.ask_timeout if self.gate else None)
        self.vm = None                  # backend: vm: the project's machine (vm/host.py)
        self.learn = LearnState()       # which steps run in learn mode (learn.py)
        self.autopush = AutoPush(project.root)   # remotes set --auto: pushed after each step
        # the placeholders of running views, and what a step opened of them (denials.py)
        self.denials = DenialWatch(project.state, self.denied_read)

    # --- a full disk: entries held until there is room, kept through a stop (heldends.py) --

    def record(self, step, kind, body) -> bool:
        return heldends.record(self, step, kind, body)

    def tracked_denied_notice(self, info):
        """Once a session: denied files git tracks are readable through its object store."""
        if getattr(self, "_told_tracked", False) or not info.home:
            return []
        self._told_tracked = True
        try:
            paths = tracked_denied(info.policy, self.project.root, info.home)
        except Exception:
            return []
        return [warning(paths)] if paths else []

    async def spec(self, msg):
        session = msg.get("session") or self.id
        try:
            pol = self.policy()
            if backend.host_is_landlock() and (refused := degraded.org_refuses_degraded(pol)):
                return {"error": f"envgit: {refused}", "exit": 125}
            net = None
            step = msg.get("step")
            if step is not None:
                if step not in self.live:
                    return {"error": f"envgit: step {step} is not running", "exit": 2}
                net = await steps.net_for(self, pol, step, self.live[step].learn)
            outside = steps.outside_project(msg.get("cwd") or "", self.project.root)
            if outside:
                return {"error": outside, "exit": 2}
            # The agent's launch (this spec) fixes the home its inner steps' views are built on.
            inner = self.inner_socket(session, msg.get("env") or {}) if msg.get("inner") else None
            agent = {k: msg[k] for k in ("read", "write", "protect") if msg.get(k)}
            if msg.get("set_env"):
                agent["env"] = dict(msg["set_env"])
            masks = self.denials.take(step if step else ("launch", session))
            sp = build(pol, self.project.root, msg["cwd"], msg["argv"], msg.get("env") or {},
                       self.project.state, steps.session_tmp(self, session), self.scan,
                       {"ENVGIT_SESSION": session, **({"ENVGIT_STEP": str(step)} if step else {})},
                       net, inner, agent, masks=masks)
            self.denials.watch(masks)
        except (PolicyError, KeyError, OSError) as e:
            return {"error": f"envgit: {e}", "exit": 2}
        return {"bwrap": sp.argv, "env": sp.env, "bind": net is not None}

    # --- the steps (steps.py), as the session's other parts call them --------------------

    async def take_after(self, pol):
        return await steps.take_after(self, pol)

    async def interrupted(self, step, reason):
        await steps.interrupted(self, step, reason)

    def inner_socket(self, session, launch_env) -> str:
        """The session's inner control socket (made on first use); `launch_env` is the agent
        launcher's environment: its HOME picks the inner steps' home view, and envgit's own
        MCP server runs with it (inner.py, mcphost.py)."""
        if session not in self.inner:
            d = self.project.state_path("inner")
            os.makedirs(d, mode=0o700, exist_ok=True)
            path = os.path.join(d, f"{session}.sock")
            if len(os.fsencode(path)) > 100:      # an AF_UNIX path ends at 107 bytes
                import tempfile
                path = os.path.join(tempfile.mkdtemp(prefix="envgit-inner-"), "control.sock")
            self.inner[session] = InnerSocket(self, session, path, asyncio.get_running_loop(),
                                              launch_env.get("HOME") or os.path.expanduser("~"), launch_env)
        return self.inner[session].path

    # --- the gate's callbacks ----------------------------------------------------------

    def record_request(self, step, rec):
        """Every request of a step, on the step; a denial also told on the step's stderr."""
        self.journal.append(step, "request", rec)
        info = self.live.get(step)
        if info is None:
            return
        info.requests.append(rec)
        text = netadvice.denial_notice(step, rec, info.policy, info.said, exact=info.agent_session)
        if text:
            self.push(info, {"push": "notice", "text": text})

    def denied_read(self, owner, path, rule, where):
        """A step opened a denied path's placeholder: said on its stderr once, kept for its end
        (an agent's own sandbox: kept only; its placeholder's line is what its tools read)."""
        info = self.live.get(owner) if isinstance(owner, int) else None
        if info is None or path in info.denied_reads:
            return
        info.denied_reads[path] = {"path": path, "rule": rule, "where": where}
        if not info.agent_session:
            self.push(info, {"push": "notice", "text": read_notice(
                owner, path, rule, where, self.project.root, info.home)})

    def push(self, info: LiveStep | None, frame):
        """A frame for a live step's client (None: no step, nothing to tell)."""
        if info is None or self.push_to(info.conn, frame):
            return
        if info.stderr_fd is not None and frame.get("push") in ("notice", "ask"):
            # a step run for an inner-socket caller: tell its own stderr
            text = frame.get("text") or (f"envgit: step {frame['question'].get('step')} waits for approval: "
                                         f"envgit approve {frame['id']} / envgit deny {frame['id']}")
            try:
                os.write(info.stderr_fd, (inert(text) + "\n").encode())   # a host or path a step chose
            except OSError:
                pass

    def push_to(self, conn, frame) -> bool:
        """A frame for a request's own client (progress): False if it has gone."""
        if conn is not None and not conn.is_closing():
            conn.write(encode(frame))
            return True
        return False

    async def rewind(self, msg, conn=None):
        undo = msg.get("undo") is True
        step = None if undo else steps.typed(msg.get("step"), int)
        paths = msg.get("paths")
        if (step is None and not undo) or not (paths is None or (isinstance(paths, list)
                                                                and all(isinstance(p, str) for p in paths))):
            return {"error": "envgit: rewind needs a step number (or undo) and paths as text", "exit": 2}
        policy = msg.get("policy") is True
        try:
            if msg.get("apply"):
                return await rewind.applied(self, conn, "rewind", rewind.apply, self, step, undo, paths,
                                            policy, user_name(msg.get("uid")))
            return await asyncio.to_thread(rewind.preview, self, step, undo, paths, policy)
        except (rewind.RewindError, PolicyError) as e:
            return {"error": f"envgit: {e}", "exit": 2}
        except (StoreError, CorruptObject) as e:
            return {"error": f"envgit: {e}; `envgit fsck` lists what is damaged", "exit": 4}

    async def snapshot_now(self, msg):
        """The working tree as a tree id, for `envgit diff`; not recorded on any step."""
        try:
            summary = await asyncio.to_thread(self.snapshotter.take, self.policy(), None)
        except (OSError, PolicyError) as e:
            return {"error": f"envgit: snapshot failed: {e}", "exit": 1}
        return {"tree": summary["tree"]}

    async def idle_watch(self):
        while not self.stopping.is_set():
            await asyncio.sleep(min(1.0, IDLE_S))
            # Only open steps and requests keep the daemon up (a connection with no step is
            # closed when silent, frames.QUIET_S); while none runs, packs are re-verified.
            busy = lambda: bool(self.live or self.conns.in_request)    # noqa: E731
            if not busy() and time.monotonic() - self.conns.last_activity > IDLE_S:
                self.stopping.set()
            elif not busy():
                self.autopush.idle_check()      # a push worker with nothing to do goes
                await asyncio.to_thread(self.snapshotter.scrub, busy)    # snapshot/scrub.py


async def serve(project: Project):
    lock = open(project.state_path("daemon.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0                         # another daemon serves this project
    faults.point("daemon-locked")       # holds the project, not answering yet: a start
    raise_fd_limit()
    try:
        sess = Session(project)
    except (OSError, sqlite3.OperationalError) as e:
        if not disk_full(e):
            raise
        # One line the waiting client shows (client.py reads daemon.log's last `envgit:` line
        # when the daemon it started exits), not a traceback after 30 s of waiting.
        log_line(f"envgit: the disk holding {project.state_path()} is full: the session daemon "
                 "cannot open the journal; free some space and run the command again")
        return 5
    except sqlite3.DatabaseError as e:
        log_line(f"envgit: the journal (.envgit/journal.sqlite) is damaged ({e}): no step can be "
                 "recorded; `envgit fsck` says what, `envgit fsck --repair` keeps every entry it can read")
        return 5
    kernel.ROOT_ONLY.warm()             # as root: the scan for root-only host files, now
    try:
        rewind.finish_interrupted(sess)
    except Exception as e:              # keep serving; `envgit fsck` and the log say what happened
        print(f"envgit daemon: could not finish an interrupted rewind: {e}", flush=True)
    try:
        if heldends.write_back(sess):   # a stop's held ends first, or their steps are orphans
            mark_interrupted(sess.journal, "the session daemon stopped before the step ended")
        else:
            sess.orphans_pending = True     # closed after the held ends, once there is room
    except sqlite3.DatabaseError as e:
        if not disk_full(e):
            log_line(f"envgit: the journal (.envgit/journal.sqlite) is damaged ({e}): no step can "
                     "be recorded; `envgit fsck` says what, `envgit fsck --repair` keeps every entry "
                     "it can read")
            sess.journal.close()
            return 5
        sess.orphans_pending = True
        log_line("envgit daemon: the disk is full: orphaned steps are closed once there is room")
    try:
        os.unlink(project.socket)
    except FileNotFoundError:
        pass
    old = os.umask(0o077)
    with UnixAddress(project.socket) as addr:
        server = await asyncio.start_unix_server(sess.conns.handle, path=addr)
    os.umask(old)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sess.stopping.set)
    watcher = asyncio.create_task(sess.idle_watch())
    if sess.denials.fd >= 0:
        loop.add_reader(sess.denials.fd, sess.denials.drain)
    print(f"envgit daemon {os.getpid()} serving {project.root} (session {sess.id})", flush=True)
    await sess.stopping.wait()
    server.close()
    watcher.cancel()
    try:
        os.unlink(project.socket)
    except FileNotFoundError:
        pass
    await heldends.finish(sess)         # done already when `envgit daemon stop` asked
    await asyncio.to_thread(sess.autopush.close)    # the push worker goes with the daemon
    shutil.rmtree(project.state_path("sessions", sess.id), ignore_errors=True)
    for inner in sess.inner.values():
        inner.close()
    if sess.denials.fd >= 0:
        loop.remove_reader(sess.denials.fd)
    sess.denials.close()
    if sess.gate_task is not None and not sess.gate_task.done():
        await asyncio.wait([sess.gate_task], timeout=10)
    if sess.gate is not None:
        await sess.gate.stop()
    if sess.vm is not None:             # the VM's QEMU and its RAM file (in /dev/shm) go too
        await asyncio.to_thread(sess.vm.stop)
    with contextlib.suppress(OSError):  # a full disk: heldends.finish said the cache was not saved
        sess.snapshotter.close()
    with contextlib.suppress(sqlite3.Error):
        sess.journal.close()
    return 0


def main(argv=None):
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 1:
        print("usage: python -m envgit.daemon PROJECT_ROOT", file=sys.stderr)
        return 2
    return asyncio.run(serve(Project(os.path.realpath(argv[0]))))
