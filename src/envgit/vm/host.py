"""The session daemon's side of the VM tier (backend: vm): one machine per project daemon.

  begin a step: the machine running (booted, or resumed from the newest memory snapshot), the
                host's changes pushed into the guest's copy (sync.py), a one-time token for the
                step's stream socket, which `envgit run` connects to (vm/client.py) with the
                caller's streams; the command runs in the guest through the agent
  end a step:   the guest's changes written back (before the file snapshot, which then sees
                them as the default tier's would), then a memory snapshot (memstore) recorded
                on the step's end entry: {"memory": {"pause_ms", "bytes", ...}}
  rewind N:     files by the default tier's rewind, memory by restoring step N's snapshot
  gc / fsck:    memstore.collect / memstore.check

Every machine operation (boot, sync, snapshot, restore) holds `self.lock`; the steps' commands
themselves run on channels of their own and may overlap.
"""

import os
import secrets
import shutil
import socket
import tempfile
import threading
import time

from .. import faults
from . import memchunks, memstore, sync, wire
from .machine import VMError
from .qemu import QemuMachine

GUEST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


class VMHost:
    def __init__(self, project, log=None):
        self.project = project
        self.log = log or (lambda text: None)
        self.machine = None
        self.manifest: dict = {}
        self.lock = threading.RLock()
        self.pending: dict[str, dict] = {}      # token -> the step's request
        self.results: dict[int, tuple] = {}     # step -> (code, signal) from the guest
        self.server = None
        self.sock_dir = None
        self.told_accel = False
        self.resumed_from = None
        self.packages_asked = None              # vm.packages as the last step's policy had it
        # how the machine came up, for the next step's journal entry (its `memory`, then
        # `came_up`): {"how": "booted" | "restored" | "resumed", ...}; said once
        self.came_up: dict | None = None
        self.fresh_from: int | None = None  # the step whose memory the guest came from, until a step ends in it

    # --- the machine --------------------------------------------------------------------

    def ensure(self, pol, progress=None) -> list[str]:
        """The machine running; returns what to say on the step's terminal (once: TCG, its
        cost, the boot or resume time)."""
        with self.lock:
            notices: list[str] = []
            afresh = False                      # boot, never resume the newest snapshot
            wanted = list(pol.vm_packages)
            asked_before, self.packages_asked = self.packages_asked, wanted
            if self.machine is not None and self.machine.alive():
                # a rewind may have brought back a guest with other tools: kept until the
                # policy's list itself changes
                if list(self.machine.packages) == wanted or asked_before in (None, wanted):
                    return notices
                notices.append("vm.packages changed: the VM boots afresh with the new tools "
                               "(what the last step left running is not carried over; `envgit "
                               "rewind` brings back an earlier step's memory with its own tools)")
                self.machine.stop()
                self.machine = None
                afresh = True
            # not running, ended by qemu.py (a failed snapshot, a restore's pages): said why
            if self.machine is not None and self.machine.ended_why:
                notices.append(f"the VM was ended: {self.machine.ended_why}")
            if self.fresh_from is not None and not afresh:
                # memory that stops its guest before a step ends in it (a process a step left
                # to power it off once restored) would otherwise be resumed at every step
                notices.append(f"the VM brought back from step {self.fresh_from}'s memory "
                               "stopped before a step ended in it: it boots afresh "
                               f"(`envgit rewind {self.fresh_from}` tries that memory again)")
                afresh = True
            self.fresh_from = None
            m = self._new_machine(pol, progress)
            latest = memstore.latest_complete(self.project)
            meta: dict = {}
            if latest is not None and not afresh:
                try:
                    meta = memstore.read_meta(memstore.path(self.project, latest))
                except (OSError, ValueError) as e:
                    notices.append(f"the VM boots afresh: step {latest}'s memory snapshot is "
                                   f"damaged ({e}); `envgit fsck` lists it")
                    latest = None
                if latest is not None and (not meta.get("tools") or meta.get("packages", []) != wanted):
                    notices.append(f"the VM boots afresh: step {latest}'s memory snapshot has "
                                   "other tools than vm.packages asks for (`envgit rewind "
                                   f"{latest}` brings it back with its own)")
                    latest = None
            elif afresh:
                latest = None
            t0 = time.monotonic()
            if latest is not None:
                try:
                    m.image = None
                    m._prepare()
                    got = self._restore_locked(latest)
                    self.resumed_from = latest
                    took = time.monotonic() - t0
                    self.came_up = {"how": "resumed", "from_step": latest, "ms": round(took * 1000),
                                    "ram": got.get("ram"), "accel": m.accel}
                    notices.append(f"the VM resumed from the memory snapshot of step {latest} "
                                   f"({took:.1f} s)")
                except (VMError, OSError, ValueError) as e:
                    self.log(f"envgit daemon: resuming the VM from step {latest} failed ({e}); booting afresh")
                    latest = None
            if latest is None:
                m.boot()
                self.manifest = {}
                self.came_up = {**m.came_up, "accel": m.accel, "accel_why": m.accel_why}
                if m.came_up.get("how") == "restored":
                    notices.append("the VM started from the booted guest kept in the cache "
                                   f"({m.came_up['ms'] / 1000:.1f} s, no boot)")
                else:
                    notices.append(f"the VM booted in {m.boot_ms / 1000:.1f} s")
                    if m.came_up.get("kept_failed"):
                        notices.append("the booted guest kept in the cache did not restore "
                                       f"({m.came_up['kept_failed']}): replaced by this boot's")
            self._serve()
            if m.accel == "tcg" and not self.told_accel:
                self.told_accel = True
                notices.append("the VM runs under TCG, QEMU's CPU emulator, because KVM does not work "
                               f"here ({m.accel_why or 'no /dev/kvm'}): commands in the guest run "
                               "about 40 times slower than on the host; `envgit doctor` says why")
            return notices

    def _new_machine(self, pol, progress=None):
        if self.machine is not None:
            self.machine.stop()
        self.machine = QemuMachine(self.project.root, self.project.state_path("vm"),
                                   memory_mb=max(64, pol.vm_memory >> 20), cpus=pol.vm_cpus,
                                   progress=progress, packages=pol.vm_packages)
        return self.machine

    def rewind(self, pol, to_step, undo_step, rewind_step) -> dict:
        """Memory for `envgit rewind`: the machine as the end of `to_step` left it (its
        processes, same pids, their memory). The state the rewind found is kept first as the
        undo point's memory when that step has none (an `outside` step recorded by the rewind),
        and the rewind step gets the restored snapshot as its own (hard links: the same files),
        so `rewind --undo` and a later `rewind <the rewind's step>` bring memory back too."""
        with self.lock:
            out = {}
            if undo_step is not None and not self.has_memory(undo_step) and \
                    self.machine is not None and self.machine.alive():
                kept = self.snapshot(undo_step)
                out["undo_kept"] = "error" not in kept
            if to_step is None or not self.has_memory(to_step):
                return {**out, "restored": False,
                        "reason": f"step {to_step} has no memory snapshot: files only"}
            if self.machine is None:
                self._new_machine(pol)
            try:
                got = self._restore_locked(to_step)
            except (VMError, OSError, ValueError) as e:     # ValueError: a damaged meta.json
                return {**out, "restored": False, "reason": str(e)}
            self._serve()
            memstore.link_copy(self.project, to_step, rewind_step)
            return {**out, "restored": True, **got}

    def stop(self):
        with self.lock:
            if self.machine is not None:
                self.machine.stop()
                self.machine = None
        if self.server is not None:
            try:
                self.server.close()
            except OSError:
                pass
            self.server = None
        if self.sock_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
            self.sock_dir = None

    # --- a step ---------------------------------------------------------------------------

    def prepare(self, step, argv, cwd, env, pol, masked, net=None, protected=()) -> dict:
        """Before the command: push the host's changes in; the stream socket and token for
        `envgit run`. `net` (sandbox/network.Net): the step's way to the gate, through the
        agent's port (its credential tied to this daemon, whose connections carry the guest's);
        the gate's CA goes into the guest's /etc/ssl/certs."""
        with self.lock:
            link = self.machine.link
            link.gate_socket = net.socket if net is not None else None
            if net is not None:         # before push's last frame, which waits for all
                with open(os.path.join(net.certs_dir, "ca-certificates.crt"), "rb") as f:
                    link.send(wire.PUT, b'{"path": "", "op": "ca"}\n' + f.read(), 0)
            view = sync.View(pol, self.project.root, masked, protected)
            self.manifest, sent = sync.push(link, self.project.root, view, self.manifest)
            token = secrets.token_hex(16)
            self.pending[token] = {"step": step, "argv": argv, "cwd": cwd, "env": guest_env(env, step)}
            return {"sock": os.path.join(self.sock_dir, "step.sock"), "token": token, "pushed": sent}

    def after(self, step, pol, masked, protected=()) -> dict:
        """After the command: the guest's changes written onto the host. `protected`: what the
        default tier binds read-only for the step (sandbox/view.py), refused the same here."""
        with self.lock:
            for t, req in list(self.pending.items()):
                if req["step"] == step:            # a client that never connected
                    del self.pending[t]
            ran = self.results.pop(step, None) is not None
            if self.machine is None or not self.machine.alive():
                return {"error": "the VM is not running"}
            if ran:                             # a step ran to its end, the guest alive after
                self.fresh_from = None
            view = sync.View(pol, self.project.root, masked, protected)
            self.manifest, left, written = sync.collect(self.machine.link, self.project.root, view,
                                                        self.manifest)
            return {**left, "written": written}

    def snapshot(self, step) -> dict:
        """The guest's memory after `step`, beside its file snapshot."""
        with self.lock:
            if self.machine is None or not self.machine.alive():
                return {"error": "the VM is not running"}
            self.machine.join_background()     # before begin() empties a directory it writes
            room = _free_bytes(memstore.root(self.project))
            need = 2 * (self.machine.memory_mb << 20)      # the stream, then its new chunks
            if room is not None and room < need:
                # a background snapshot that fails for a full disk can leave QEMU 7.2's guest
                # write-protected: never started without room
                return {"error": f"memory snapshot not taken: {room >> 20} MiB free where it may "
                                 f"need {need >> 20} MiB (the guest's memory twice); `envgit gc` "
                                 "frees snapshots", **self._came_up()}
            d = memstore.begin(self.project, step)
            manifest = _manifest_json(self.manifest)

            def dropped(why):
                shutil.rmtree(d, ignore_errors=True)
                self.log(f"envgit daemon: the memory snapshot of step {step} was not kept: {why}")

            def finished(meta, error):          # a background snapshot's end, on its thread
                if error is not None:           # qemu.py ended the guest, and says why
                    return dropped(error)
                faults.point("vm-memory-written")   # the stream whole, `ok` not yet
                try:
                    got = memchunks.store(memstore.chunks_root(self.project),
                                          os.path.join(d, memstore.STREAM), os.path.join(d, memchunks.LIST))
                    faults.point("vm-memory-chunked")   # chunks and their list written, `ok` not yet
                    memstore.commit(d, {**meta, **got, "step": step, "host_manifest": manifest})
                except OSError as e:
                    dropped(e)
            try:
                meta = self.machine.snapshot(d, finished)
            except (VMError, OSError) as e:
                shutil.rmtree(d, ignore_errors=True)
                return {"error": f"memory snapshot failed: {e}", **self._came_up()}
            if not meta.get("background"):
                faults.point("vm-memory-cloned")        # the files written, `ok` not yet
                memstore.commit(d, {**meta, "step": step, "host_manifest": manifest})
            return {**{k: meta[k] for k in ("pause_ms", "bytes", "ram_bytes", "device_bytes", "accel",
                                             "method", "background") if k in meta}, **self._came_up()}

    def collect(self, keep) -> tuple[int, list[int]]:
        """gc of the memory snapshots (memstore.collect), none being written meanwhile."""
        with self.lock:
            self.settle()
            return memstore.collect(self.project, keep)

    def settle(self):
        """A background memory snapshot being written, finished (gc, fsck's view, a rewind's
        preview read the snapshots as they will stay)."""
        with self.lock:
            if self.machine is not None:
                self.machine.join_background()

    def _came_up(self) -> dict:
        got, self.came_up = self.came_up, None
        return {"came_up": got} if got else {}

    def restore(self, step) -> dict:
        with self.lock:
            return self._restore_locked(step)

    def _restore_locked(self, step) -> dict:
        self.settle()                   # the snapshot asked for may be the one being written
        d = memstore.path(self.project, step)
        if not memstore.complete(d):
            raise VMError(f"step {step} has no memory snapshot")
        meta = memstore.read_meta(d)
        out = self.machine.restore(d)
        self.fresh_from = step
        self.manifest = {k: tuple(v) for k, v in (meta.get("host_manifest") or {}).items()}
        return {**out, "from_step": step}

    def has_memory(self, step) -> bool:
        self.settle()
        return memstore.complete(memstore.path(self.project, step))

    # --- the step stream socket ------------------------------------------------------------

    def _serve(self):
        if self.server is not None:
            return
        self.sock_dir = tempfile.mkdtemp(prefix="envgit-vmstep-")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(os.path.join(self.sock_dir, "step.sock"))
        s.listen(8)
        self.server = s
        threading.Thread(target=self._accept, args=(s,), name="vm-step-accept", daemon=True).start()

    def _accept(self, s):
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(c,), name="vm-step", daemon=True).start()

    def _client(self, c):
        try:
            c.settimeout(30)
            r = wire.Reader()
            hello = None
            while hello is None:
                data = c.recv(65536)
                if not data:
                    return
                r.feed(data)
                for kind, _, payload in r.frames():
                    hello = payload if kind == wire.HELLO else b""
                    break
            fields = hello.decode(errors="replace").split()
            req = self.pending.pop(fields[0], None) if fields else None
            if req is None:
                c.sendall(wire.pack(wire.ERROR, b"unknown step token"))
                return
            tty = len(fields) > 1 and fields[1] == "1"
            rows, cols = (int(fields[2]), int(fields[3])) if len(fields) > 3 else (24, 80)
            c.settimeout(None)
            io = _ClientIO(c, r)
            with self.lock:
                link = self.machine.link
            code, sig = link.run({"argv": req["argv"], "cwd": req["cwd"], "env": req["env"],
                                  "tty": tty, "rows": rows, "cols": cols}, io)
            self.results[req["step"]] = (code, sig)
            c.sendall(wire.pack(wire.EXIT, wire.exit_payload(code, sig)))
        except (OSError, ValueError, VMError) as e:
            self.log(f"envgit daemon: a VM step's stream ended: {e}")
        finally:
            c.close()


class _ClientIO:
    """A step's streams: the client's socket on one side, the agent's channel on the other."""

    def __init__(self, sock, reader):
        self.sock = sock
        self.reader = reader
        self.wlock = threading.Lock()

    def out(self, kind, data):
        with self.wlock:
            try:
                self.sock.sendall(wire.pack(kind, data))
            except OSError:
                pass                    # the client went away: the command goes on

    def pump(self, send, stop):
        import select
        pending = list(self.reader.frames())
        while not stop.is_set():
            for kind, _, payload in pending:
                if kind in (wire.STDIN, wire.STDIN_EOF, wire.SIGNAL, wire.WINSIZE):
                    send(kind, payload)
            pending = []
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.2)
                if not ready:
                    continue
                data = self.sock.recv(65536)
            except (OSError, ValueError):
                return
            if not data:
                send(wire.STDIN_EOF)
                return
            self.reader.feed(data)
            pending = list(self.reader.frames())


def guest_env(env, step) -> dict:
    """The step's environment (already scrubbed by the policy) as the guest needs it: the
    guest's own PATH, home and /tmp."""
    out = {k: v for k, v in env.items() if isinstance(v, str)}
    out.update({"PATH": GUEST_PATH, "HOME": "/root", "TMPDIR": "/tmp", "SHELL": "/bin/sh",
                "ENVGIT_STEP": str(step), "ENVGIT_VM": "1"})
    out.setdefault("TERM", "xterm-256color")
    return out


def _free_bytes(path) -> int | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _manifest_json(manifest):
    return {k: list(v) for k, v in manifest.items()}
