"""The QEMU backend of the VM tier: a `microvm` machine (PVH boot of Debian's kernel, an
initramfs root), the guest agent on a virtio-serial port, QMP for pause, snapshot and resume.

A step's memory snapshot is QEMU's background snapshot (background.py): the guest pauses only
to have its RAM write-protected, and QEMU writes the stream while it runs on; memchunks.py
keeps it as chunks shared by every snapshot. A restore starts QEMU with `-incoming defer` and
feeds it the stream, into anonymous memory. The kept boot (kept.py), and a step where QEMU
refuses the background method, use the stopped method instead: the guest's RAM is a
`memory-backend-file,share=on` file, so the snapshot migrates the device state alone
(`x-ignore-shared`: ~50 KB) while the guest is stopped, and clones the RAM file beside it
(memstore.clone: a reflink where the filesystem has them, else a copy of the pages the guest
touched; the file is sparse); its restore clones the RAM back and feeds QEMU the device state.
See shared/notes/vm.md for what was measured.

No network device: the guest's only ways out are the agent's port and the gate's port
(`envgit.gate`, a second virtio-serial port whose host end is the daemon's gate socket).
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import faults
from . import image as image_mod
from . import incoming, kept, memchunks, memstore, postcopy, wire
from .background import Background, Refused, capabilities
from .machine import Link, Machine, VMError, connect_unix, remove
from .qmp import QMP

BOOT_TIMEOUT_S = float(os.environ.get("ENVGIT_VM_BOOT_TIMEOUT", "120"))
POWERED_OFF = ("shutdown", "guest-panicked")    # QEMU's status of a guest paused by -action
FEED_WAIT_S = 120.0     # a postcopy restore's every page sent (a 1 GiB guest's take 1.4 s)
STOP_WAIT_S = 20.0      # a stopping daemon waits this long for a memory snapshot being written
BOOT_TRIES = 2          # about 1 boot in 8 hangs silently under TCG here: one retry
CMDLINE = ("console=ttyS0 quiet rdinit=/init panic=-1 tsc=reliable tsc_early_khz=2000000 "
           "lpj=8000000 8250.nr_uarts=1 mitigations=off")

# QEMU is started from this one long-lived thread: its PR_SET_PDEATHSIG (QEMU dies with the
# daemon, even a kill -9 of it) fires when the *thread* that forked it ends.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vm-spawner")
_spawner_check = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vm-check")


def qemu_binary() -> str | None:
    env = os.environ.get("ENVGIT_QEMU")
    if env and os.path.isabs(env) and os.access(env, os.X_OK):
        return env
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        p = os.path.join(d, "qemu-system-x86_64")
        if os.access(p, os.X_OK):
            return p
    return None


def _pdeathsig():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)       # PR_SET_PDEATHSIG
    os.setsid()


def accel_choice() -> tuple[str | None, str]:
    """("kvm" | "tcg", why), or (None, "") while KVM is untried. KVM only when /dev/kvm opens
    and a trial boot worked on this machine (cached per host kernel: a nested /dev/kvm, kvm-pvm
    here, aborts or crawls); ENVGIT_VM_ACCEL=tcg|kvm decides."""
    forced = os.environ.get("ENVGIT_VM_ACCEL")
    if forced in ("tcg", "kvm"):
        return forced, "ENVGIT_VM_ACCEL"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return "tcg", f"/dev/kvm: {e.strerror}"
    verdict = os.path.join(image_mod.cache_root(), f"kvm-{os.uname().release}")
    try:
        with open(verdict) as f:
            got = f.read().split("\n", 1)
        return got[0], got[1].strip() if len(got) > 1 else ""
    except FileNotFoundError:
        return None, ""                 # not tried yet: QemuMachine.boot tries it once


def _remember_accel(accel, why):
    os.makedirs(image_mod.cache_root(), exist_ok=True)
    with open(os.path.join(image_mod.cache_root(), f"kvm-{os.uname().release}"), "w") as f:
        f.write(f"{accel}\n{why}\n")


class QemuMachine(Machine):
    keep_boot = True            # a booted guest kept and restored (kept.py); False: always boot
    def __init__(self, project_root, state_dir, memory_mb=512, cpus=1, image=None, progress=None,
                 gate_socket=None, packages=()):
        self.root = project_root
        self.state = state_dir                  # .envgit/vm
        self.memory_mb = memory_mb
        self.cpus = cpus
        self.image = image
        self.progress = progress or (lambda text: None)
        self.gate_socket = gate_socket
        self.packages = tuple(packages)         # vm.packages: added to the tool image's
        self.tools = None                       # the tool image (toolimage.py) the guest has
        self.proc = None
        self.qmp = None
        self.link = None
        self.run_dir = os.path.join(state_dir, "run")
        self.ram_dir = None                     # where the running RAM file is (memstore.ram_place)
        self.ram_fd = None                      # the running RAM file, once unlinked (_hold_ram)
        self.ram = os.path.join(self.run_dir, "ram")
        self.sock_dir = None
        self.accel = None
        self.accel_why = ""
        self.boot_ms = None
        # how this guest came up: {"how": "booted" | "restored", "from": "kept boot" | step
        # snapshot dir, "ms", ...}: on the next step's journal entry (host.py)
        self.came_up: dict = {}
        # A guest restored from a step's stream runs on anonymous memory: QEMU fills it from
        # the stream, and a page never touched is no page at all, where a shared file's pages
        # are allocated by QEMU's reading them (a zero page's check, the write-protect's
        # populating); booted or from the kept boot, it runs on the shared RAM file the stopped
        # method (kept.py) clones
        self.anon_ram = False
        self.background = None                  # the background snapshot being written, if any
        self.feeding = None                     # the postcopy restore still sending pages, if any
        self.ended_why: str | None = None       # why envgit ended QEMU itself, said by host.py
        self.background_refused = None          # why QEMU refused the method (then: stopped)

    # --- the command line ---------------------------------------------------------------

    def _args(self, accel, incoming=False):
        img = self.image
        mem = f"{self.memory_mb}M"
        args = [qemu_binary(),
                *(["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg", "-cpu", "max"]),
                "-smp", str(self.cpus), "-m", mem,
                "-machine", "microvm,acpi=on,pit=on,pic=on,rtc=on,memory-backend=mem",
                "-object", (f"memory-backend-ram,id=mem,size={mem}" if self.anon_ram else
                            f"memory-backend-file,id=mem,size={mem},mem-path={self.ram},share=on"),
                "-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-no-reboot",
                # a guest that powers off or panics is paused, not ended: QEMU stays until a
                # background snapshot of the step before has been written whole
                "-action", "shutdown=pause", "-action", "panic=pause",
                "-kernel", img.kernel, "-initrd", img.initrd,
                "-append", self._cmdline(),
                "-serial", f"file:{os.path.join(self.run_dir, 'console.log')}",
                # free page reporting: pages the guest frees (the initramfs once unpacked, a
                # process's memory after it exits) become holes in the RAM file, which snapshots
                # then neither copy nor store
                "-device", "virtio-balloon-device,free-page-reporting=on",
                "-device", "virtio-serial-device",
                "-chardev", f"socket,id=agent,path={self.sock_dir}/agent.sock,server=on,wait=off",
                "-device", "virtserialport,chardev=agent,name=envgit.agent",
                "-qmp", f"unix:{self.sock_dir}/qmp.sock,server=on,wait=off"]
        if self.tools:                  # read-only: the same file on every restore of this guest
            args += ["-drive", f"file={self.tools.replace(',', ',,')},if=none,id=tools,format=raw,readonly=on",
                     "-device", "virtio-blk-device,drive=tools"]
        if self.gate_socket:            # the guest's only way out: a port onto the gate
            args += ["-chardev", f"socket,id=gate,path={self.gate_socket},server=off,reconnect=1",
                     "-device", "virtserialport,chardev=gate,name=envgit.gate"]
        if incoming:
            args += ["-incoming", "defer"]
        return args

    def _cmdline(self):
        # the same for every project (the agent learns its project from SETUP): a booted guest
        # is kept and restored for any of them (kept.py)
        return CMDLINE + (" envgit.tools=1" if self.tools else "")

    def _spawn(self, args):
        def start():
            log = open(os.path.join(self.run_dir, "qemu.log"), "ab")
            try:
                return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        preexec_fn=_pdeathsig, close_fds=True)
            finally:
                log.close()
        return _spawner.submit(start).result()

    def _prepare(self):
        if qemu_binary() is None:
            raise VMError("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
        if self.image is None:
            self.image = image_mod.ensure(self.progress)
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        if self.ram_dir is None:
            self.ram_dir = memstore.ram_place(self.root, self.run_dir, self.memory_mb)
            self.ram = os.path.join(self.ram_dir, "ram")
        if self.sock_dir is None:
            self.sock_dir = tempfile.mkdtemp(prefix="envgit-vm-")
        for name in ("agent.sock", "qmp.sock"):
            remove(os.path.join(self.sock_dir, name))

    def _hold_ram(self):
        """In /dev/shm, the RAM file is unlinked once QEMU has it open (its QMP answering
        means its memory backend exists), held by an fd of this process: a kill -9 of the
        daemon (QEMU dies with it) leaves no guest-sized file in memory behind."""
        if self.ram_dir == self.run_dir or self.ram_fd is not None or self.anon_ram:
            return
        self.ram_fd = os.open(self.ram, os.O_RDONLY)
        remove(self.ram)

    def _ram_source(self):
        return f"/proc/self/fd/{self.ram_fd}" if self.ram_fd is not None else self.ram

    def _connect(self, timeout):
        try:
            self.qmp = QMP(os.path.join(self.sock_dir, "qmp.sock"), timeout=30)
            self.link = Link(connect_unix(os.path.join(self.sock_dir, "agent.sock"), 30))
        except (OSError, ValueError) as e:
            raise VMError(f"QEMU's sockets: {e}") from None
        self._watch_power(self.proc, self.qmp)

    def _watch_power(self, proc, qmp):
        """A guest that powers off or panics is paused by QEMU (-action), so a background
        snapshot of the step before it still completes; then QEMU is ended, as it would have
        ended itself, so the step running in it ends too (its agent's port closes)."""
        def watch():
            while proc.poll() is None:
                time.sleep(0.5)
                try:
                    status = qmp.cmd("query-status").get("status")
                except (VMError, OSError, ValueError):
                    return              # QEMU gone, or this machine's QMP closed
                if status in POWERED_OFF:
                    try:
                        self.join_background(STOP_WAIT_S)
                    except VMError:
                        pass
                    proc.kill()
                    return
        threading.Thread(target=watch, name="vm-power-watch", daemon=True).start()

    # --- boot ---------------------------------------------------------------------------

    def boot(self, use_kept=True):
        """A fresh guest, answering and set up for this project: the kept booted guest of
        this machine's image restored when there is one (kept.py), else a boot, after which
        the booted guest is kept (before anything of the project is in it). A kept snapshot
        that does not restore (damaged, stale, another QEMU) is dropped, booted anew and
        replaced."""
        self._prepare()
        self.anon_ram = False
        from . import toolimage
        self.tools = toolimage.ensure(self.image, self.packages, self.progress)
        accel, _ = accel_choice()
        kept_dir = kept.path(self, self._identity(accel)) if accel and self.keep_boot else None
        failed = None
        if use_kept and kept_dir and memstore.complete(kept_dir):
            try:
                self.progress("restoring the booted guest kept in the cache")
                got = self.restore(kept_dir, check=lambda: kept.verify(kept_dir))
                self.came_up = {"how": "restored", "from": "kept boot", "ms": got["answering_ms"],
                                "ram": got.get("ram")}
                kept.used(kept_dir)
                return
            except (VMError, OSError, ValueError) as e:
                self._kill()
                failed = str(e)[:300]
                kept.drop(kept_dir)
        self._boot()
        self.came_up = {"how": "booted", "ms": self.boot_ms, **({"kept_failed": failed} if failed else {})}
        if kept_dir and self.accel == accel:
            try:
                kept.keep(self, kept_dir)
                self.came_up["kept"] = True
            except (VMError, OSError) as e:
                self.came_up["kept_error"] = str(e)[:300]
        self._setup()

    def _identity(self, accel):
        """The command line a boot runs, this machine's own paths masked: what kept.key names."""
        mine = {self.ram: "RAM", self.sock_dir: "SOCKETS", self.run_dir: "RUN", self.gate_socket: "GATE"}
        out = []
        for arg in self._args(accel):
            for p, name in mine.items():
                if p:
                    arg = arg.replace(p, name)
            out.append(arg)
        return out

    def _setup(self):
        """The agent told what is this machine's own (agent.Agent.setup): its project, the
        host's clock, fresh bytes for its kernel's random generator."""
        payload = {"root": self.root, "time_ns": time.time_ns(), "seed": os.urandom(32).hex()}
        self.link.call(wire.SETUP, json.dumps(payload).encode(), timeout=30)

    def _boot(self):
        accel, why = accel_choice()
        if accel is None:               # /dev/kvm opens: does a guest really run on it?
            self.progress("trying KVM (once per host kernel)")
            try:
                self._boot_once("kvm", 30)
                _remember_accel("kvm", "a trial boot worked")
                self.accel, self.accel_why = "kvm", "a trial boot worked"
                return
            except VMError as e:
                self._kill()
                first = str(e).splitlines()[0] if str(e) else "no answer"
                accel, why = "tcg", f"/dev/kvm opens but a guest did not boot on it: {first[:200]}"
                _remember_accel(accel, why)
        self.accel, self.accel_why = accel, why
        last = None
        for _ in range(BOOT_TRIES):
            try:
                self._boot_once(accel, BOOT_TIMEOUT_S)
                return
            except VMError as e:
                last = e
                self._kill()
        raise VMError(f"the guest did not boot: {last} (console: {self.run_dir}/console.log)")

    def _boot_once(self, accel, timeout):
        t0 = time.monotonic()
        self.progress(f"booting the VM ({accel.upper()})")
        with open(self.ram, "wb") as f:            # a fresh, sparse RAM file
            f.truncate(self.memory_mb << 20)
        self.proc = self._spawn(self._args(accel))
        try:
            self._connect(timeout)
        except VMError as e:
            raise VMError("QEMU did not start: " + self._log_tail()) from e
        self._hold_ram()
        if not self.link.ping(timeout):
            raise VMError("no answer from the guest agent in "
                          f"{timeout:.0f} s" + (f"; QEMU: {self._log_tail()}" if self.proc.poll() is not None else ""))
        self.boot_ms = round((time.monotonic() - t0) * 1000)

    def _log_tail(self):
        try:
            with open(os.path.join(self.run_dir, "qemu.log"), "rb") as f:
                return f.read()[-400:].decode(errors="replace").strip()
        except OSError:
            return ""

    def alive(self, answer_within=15.0) -> bool:
        """QEMU runs, its port is open, and the agent answers a ping within `answer_within`
        seconds: an agent that no longer reads its port (wedged, or its port taken by another
        reader) is a dead machine, replaced by the caller, not one every later request waits
        out its timeout on."""
        if self.proc is None or self.proc.poll() is not None or self.link is None or self.link.closed:
            return False
        try:                            # powered off or panicked (paused by -action): dead now
            if self.qmp.cmd("query-status").get("status") in POWERED_OFF:
                return False
        except (VMError, OSError, ValueError):
            return False
        return self.link.ping(answer_within)

    # --- snapshot and restore ------------------------------------------------------------

    def _meta(self) -> dict:
        return {"setup": True, "memory_mb": self.memory_mb, "cpus": self.cpus, "accel": self.accel,
                "tools": self.tools, "packages": list(self.packages)}

    def snapshot(self, dest, finished=None) -> dict:
        """The guest's memory into `dest`. With `finished` (a step's snapshot): in the
        background (background.py), returning once the guest runs again, with "background":
        True; `finished(meta, error)` is called when the stream is complete (meta: the whole
        meta.json to commit) or failed. Without it (the kept boot), or when QEMU refuses the
        background method: stopped for the whole copy, returning the complete meta."""
        self.join_background()
        if finished is not None and self.background_refused is None:
            base = {**self._meta(), "format": memstore.CHUNKS_FORMAT,
                    "method": "background-snapshot: RAM write-protected (userfaultfd), written while the guest runs"}

            def done(info, error):
                if error is not None:
                    self._end_after_failed(error)
                finished(None if error else {**base, **info}, error)
            job = Background(self.qmp, dest, done)
            self.background = job       # joined (instantly once done) by the next operation
            try:
                pause_ms = job.start()
            except Refused as e:
                self.background = None
                self.background_refused = str(e)[:300]
            except VMError:
                self.background = None
                raise
            else:
                return {**base, "background": True, "pause_ms": pause_ms}
        return self._snapshot_stopped(dest)

    def _end_after_failed(self, error):
        """A failed background snapshot (a disk filled) leaves QEMU 7.2's guest RAM write-
        protected where not copied yet: the vCPU's next write there, maybe seconds later (a
        ping answers meanwhile), sleeps for ever, and the step in it with it. So QEMU is ended:
        the step ends, the next resumes from the newest snapshot kept (host.py says so)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.ended_why = (f"its last memory snapshot failed ({error}): it resumes from the "
                              "newest snapshot kept, and what ran in it since is gone")
            proc.kill()

    def join_background(self, timeout=None):
        """Wait for a background snapshot being written (a restore, gc and stop need QEMU's
        migration, or the files, as it leaves them)."""
        job, feed = self.background, self.feeding
        if job is not None and not job.join(timeout):
            raise VMError("a background memory snapshot did not finish")
        if feed is not None:            # QEMU migrates once at a time: the restore's end first
            if not feed.done.wait(FEED_WAIT_S if timeout is None else timeout):
                # a QEMU that stopped reading (or asking) leaves the feed blocked in a send:
                # ended, which ends the send; its guest is gone, and the caller says so
                self._kill()
                feed.done.wait(5)
                self.feeding = None
                raise VMError(f"QEMU took not all of a restore's pages in {FEED_WAIT_S:.0f} s: ended")
            self.feeding = None
            deadline = time.monotonic() + 10
            try:
                while self.qmp is not None and time.monotonic() < deadline and \
                        self.qmp.cmd("query-migrate").get("status") == "postcopy-active":
                    time.sleep(0.005)
            except (VMError, OSError, ValueError):
                pass                    # QEMU ended (its feed failed): alive() says so

    def _snapshot_stopped(self, dest) -> dict:
        """Pause, migrate the device state alone, clone the RAM file, resume: into `dest`."""
        if self.anon_ram:
            raise VMError("a background snapshot failed, and this guest's memory (restored from "
                          f"a step's) is no file to clone: {self.background_refused}")
        t0 = time.monotonic()
        self.qmp.cmd("stop")
        try:
            self.qmp.cmd("migrate-set-capabilities", capabilities=capabilities(False))
            state = os.path.join(dest, memstore.DEVICE_STATE)
            self.qmp.cmd("migrate", uri="exec:cat > " + shlex.quote(state))
            self._wait_migration()
            faults.point("vm-memory-migrated")      # device state written, RAM not yet cloned
            # In memory (tmpfs) the clone is a copy at memory speed; the copy to the disk is
            # made after `cont`, the guest running again meanwhile.
            staged = os.path.join(self.ram_dir, "ram.snapshot") if self.ram_dir != self.run_dir \
                else os.path.join(dest, memstore.RAM)
            how: list[str] = []
            ram_bytes = memstore.clone(self._ram_source(), staged, how=how)
        finally:
            self.qmp.cmd("cont")
        pause_ms = round((time.monotonic() - t0) * 1000, 1)
        if staged != os.path.join(dest, memstore.RAM):
            try:
                memstore.clone(staged, os.path.join(dest, memstore.RAM), how=how)
            finally:
                remove(staged)
        dev_bytes = os.path.getsize(os.path.join(dest, memstore.DEVICE_STATE))
        # the method that ran: QEMU's device state alone (x-ignore-shared) while stopped, and
        # the RAM file cloned: "reflink" or "copy" (in /dev/shm during the pause, then to disk)
        method = "x-ignore-shared, RAM " + "+".join(how) + (" via /dev/shm" if len(how) > 1 else "")
        if self.background_refused:
            method += f" (QEMU refused a background snapshot: {self.background_refused})"
        return {**self._meta(), "pause_ms": pause_ms, "method": method,
                "bytes": ram_bytes + dev_bytes, "ram_bytes": ram_bytes, "device_bytes": dev_bytes}

    def _wait_migration(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.qmp.cmd("query-migrate").get("status")
            if st == "completed":
                return
            if st in ("failed", "cancelled"):
                raise VMError(f"QEMU's migration {st}")
            time.sleep(0.002)
        raise VMError("QEMU's migration did not finish")

    def restore(self, src, check=None, lazy=True) -> dict:
        """The guest as snapshot `src` left it, running: a new QEMU fed the snapshot's pages as
        the guest asks for them (postcopy.py; `lazy`, a snapshot with a page index), or the
        whole stream first, or the device state with its RAM file a clone of the snapshot's.
        `check()` (raises when `src` is damaged) runs meanwhile on another thread, and the
        guest only runs once it has passed."""
        self.join_background()          # the snapshot asked for may be the one being written
        t0 = time.monotonic()
        checked = _spawner_check.submit(check) if check else None
        meta = memstore.read_meta(src)
        stream = meta.get("format") == memstore.CHUNKS_FORMAT
        # the drive the snapshot's guest had mounted, whatever the policy asks for now
        if meta.get("tools") and not os.path.isfile(meta["tools"]):
            raise VMError(f"the tool image this memory snapshot's guest had mounted is gone ({meta['tools']})")
        self.tools = meta.get("tools")
        self.packages = tuple(meta.get("packages") or ())
        self._kill()
        self._prepare()
        self.memory_mb = meta.get("memory_mb", self.memory_mb)
        self.cpus = meta.get("cpus", self.cpus)
        chosen, why = accel_choice()
        accel = meta.get("accel") or self.accel or chosen or "tcg"
        self.accel, self.accel_why = accel, self.accel_why or why
        how: list[str] = []
        self.anon_ram = stream
        if stream:                      # RAM comes in the stream, into anonymous memory
            how.append("postcopy" if lazy and postcopy.can_feed(src, meta) else "stream")
        else:
            memstore.clone(os.path.join(src, memstore.RAM), self.ram, size=self.memory_mb << 20, how=how)
        if how == ["postcopy"]:         # its chunks checked while QEMU starts
            try:
                self.feeding = postcopy.prepare(src, memchunks.root(self.state), meta)
            except VMError as e:
                raise VMError(f"the memory snapshot {src} could not be restored: {e}") from None
        cloned_ms = round((time.monotonic() - t0) * 1000, 1)
        self.proc = self._spawn(self._args(accel, incoming=True))
        stream_errors: list[str] = []
        try:
            self._connect(30)
            self._hold_ram()
            feed = self._incoming(src, meta, how[0] if stream else None, stream_errors)
            deadline = time.monotonic() + 60
            while True:
                st = self.qmp.cmd("query-status").get("status")
                if st in ("paused", "postmigrate", "prelaunch") and \
                        self.qmp.cmd("query-migrate").get("status") == "completed":
                    break
                if st == "running":
                    break
                if feed is not None and feed.error:
                    stream_errors.append(feed.error)
                if stream_errors or time.monotonic() > deadline or self.proc.poll() is not None:
                    raise VMError(f"QEMU did not take the snapshot back ({st}): {self._log_tail()}")
                time.sleep(0.002)
            if checked is not None:
                checked.result()
            self.qmp.cmd("cont")
        except (VMError, OSError, ValueError) as e:
            feed, self.feeding = self.feeding, None     # its check's finding is the cause
            self._kill()
            if feed is not None:
                feed.close()
            cause = stream_errors[0] if stream_errors else (feed and feed.error) or str(e)
            raise VMError(f"the memory snapshot {src} could not be restored: {cause}") from None
        running_ms = round((time.monotonic() - t0) * 1000, 1)
        if not self.link.ping(30):
            feed, self.feeding = self.feeding, None
            self._kill()
            raise VMError("the restored guest's agent does not answer"
                          + (f" ({feed.error})" if feed is not None and feed.error else ""))
        if meta.get("setup"):           # an agent that knows SETUP (older snapshots' do not)
            self._setup()
        # restore_ms: until the guest runs again (its vCPU continued); answering_ms: until
        # its agent has answered (what a step waits for); clone_ms: of those, the RAM copy
        return {"restore_ms": running_ms, "clone_ms": cloned_ms, "ram": how[0] if how else None,
                "answering_ms": round((time.monotonic() - t0) * 1000, 1)}

    def _incoming(self, src, meta, how, stream_errors):
        """Start QEMU's incoming migration from snapshot `src`: fed page by page (how
        "postcopy": the Feed returned), the whole stream through a pipe ("stream"), or the
        device state file (None: the RAM file was cloned)."""
        if how == "postcopy":           # pages as the guest asks for them, the rest meanwhile
            proc = self.proc

            def ended(why):             # pages failed after "run": QEMU would wait, paused
                self.ended_why = f"a restore's page could not be sent ({why})"
                if proc.poll() is None:
                    proc.kill()
            self.feeding.on_error = ended
            return postcopy.start(self.qmp, self.feeding)
        incoming.start(self.qmp, src, meta, memchunks.root(self.state), how == "stream", stream_errors)
        return None

    # --- stop ------------------------------------------------------------------------------

    def _kill(self):
        if self.link is not None:
            self.link.close()
            self.link = None
        if self.qmp is not None:
            try:
                self.qmp.close()
            except OSError:
                pass
            self.qmp = None
        if self.ram_fd is not None:
            os.close(self.ram_fd)
            self.ram_fd = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None

    def stop(self):
        try:                            # the last step's memory written whole, then stopped;
            self.join_background(STOP_WAIT_S)   # not past what `envgit daemon stop` waits
        except VMError:
            pass
        self._kill()
        if self.sock_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
            self.sock_dir = None
        remove(self.ram)
        if self.ram_dir and self.ram_dir != self.run_dir:
            shutil.rmtree(self.ram_dir, ignore_errors=True)
