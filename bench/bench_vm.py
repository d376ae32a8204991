"""VM tier benchmark (backend: vm): envgit's memory snapshots beside QEMU's own methods on the
same guest, in one run.

    .venv/bin/python bench/bench_vm.py [--runs N] [--memory MB] [--first-step-only]

Measures, medians of N runs (default 3; boots are the slow part under TCG):
  first step, booted      a fresh session's first step: a fresh QEMU booted to a command's exit
                          status (image cached; the booted guest then kept, vm/kept.py)
  first step, kept boot   the same from the booted guest kept in the image's cache (restored,
                          checked and set up for its project: no boot)
  step snapshot, idle     envgit's per-step memory snapshot as steps take it (vm/background.py):
                          the guest's pause (QEMU's STOP to RESUME), how long the step waited,
                          the stream's write while the guest runs, the new chunks it stored;
                          beside it the stopped method steps took before (stop, device state with
                          x-ignore-shared, clone of the RAM file's touched pages, cont), interleaved
  step snapshot, 300 MB   the same with a guest process holding 300 MB of touched memory
  restore to running      a new QEMU from each until the guest runs again (and the time until
                          its agent answers, and until every page is in): a step's snapshot
                          fed page by page as the guest asks (postcopy), beside the same
                          snapshot's whole stream read first (the method before), and the
                          stopped method's RAM file
Anchors on the same guest, same run: `savevm`/`loadvm` (HMP, internal qcow2 snapshot: needs a
qcow2 drive, added for the anchor only) and plain migrate-to-file (`stop` + `migrate
exec:cat > f`, full RAM) / `-incoming` restore. It says whether the guest ran under KVM or TCG.
"""

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from envgit.vm import memchunks, memstore, wire  # noqa: E402
from envgit.vm.qemu import QemuMachine  # noqa: E402


class Quiet:
    def __init__(self):
        self.buf = []

    def out(self, k, d):
        self.buf.append(d)

    def pump(self, send, stop):
        send(wire.STDIN_EOF)


def run(m, cmd):
    io = Quiet()
    code, _ = m.run({"argv": ["sh", "-c", cmd], "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/"}, io)
    return code, b"".join(io.buf).decode(errors="replace")


class AnchorMachine(QemuMachine):
    """The same guest with a small qcow2 drive, which `savevm` needs to hold its snapshot."""

    qcow2 = None
    keep_boot = False           # booted each time: a kept boot is for the machines envgit runs

    def _args(self, accel, incoming=False):
        return super()._args(accel, incoming) + [
            "-drive", f"if=none,id=d0,file={self.qcow2},format=qcow2",
            "-device", "virtio-blk-device,drive=d0"]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def snapshot_series(m, work, runs, tag):
    """A step's memory snapshot as steps take it (background, chunked) beside the stopped
    method (stop, device state, RAM file cloned, cont) that steps took before, interleaved on
    the same guest; then restores of the last of each."""
    got = {k: [] for k in ("pause", "wait", "write", "bytes", "stored", "st_pause", "st_bytes")}
    croot = memchunks.root(m.state)
    for i in range(runs):
        run(m, "true")
        d = os.path.join(work, f"{tag}-bg-{i}")
        os.makedirs(d)
        done, meta_done = threading.Event(), {}

        def finished(meta, error, d=d, done=done, meta_done=meta_done):
            if meta is not None:
                meta_done.update(meta)
                meta_done.update(memchunks.store(croot, os.path.join(d, memstore.STREAM),
                                                 os.path.join(d, memchunks.LIST)))
                memstore.commit(d, meta_done)
            done.set()
        t0 = time.monotonic()
        meta = m.snapshot(d, finished)
        got["wait"].append((time.monotonic() - t0) * 1000)
        assert meta.get("background"), meta
        done.wait(600)
        got["pause"].append(meta_done["pause_ms"])
        got["write"].append(meta_done["write_ms"])
        got["bytes"].append(meta_done["bytes"])
        got["stored"].append(meta_done["stored"])
        run(m, "true")
        d = os.path.join(work, f"{tag}-stopped-{i}")
        os.makedirs(d)
        meta = m._snapshot_stopped(d)
        memstore.commit(d, meta)
        got["st_pause"].append(meta["pause_ms"])
        got["st_bytes"].append(meta["bytes"])
    restores: dict[str, list] = {"bg": [], "bg-stream": [], "stopped": []}
    for _ in range(runs):
        for kind in restores:
            t0 = time.monotonic()
            back = m.restore(os.path.join(work, f"{tag}-{kind.split('-')[0]}-{runs - 1}"),
                             lazy=kind != "bg-stream")
            m.join_background()             # a postcopy restore's pages all sent
            restores[kind].append({**back, "all_in_ms": (time.monotonic() - t0) * 1000})
    for d in os.listdir(work):
        if d.startswith(f"{tag}-"):
            shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    return ({k: med(v) for k, v in got.items()},
            {kind: {k: med([r[k] for r in rs]) for k in rs[0] if k != "ram"} for kind, rs in restores.items()})


def _snapshot_rows(rows, what, f, r):
    rows.append((f"step snapshot, {what}: guest paused (background)", f"{f['pause']:.0f} ms", "",
                 f"step waited {f['wait']:.0f} ms"))
    rows.append(("  … written while the guest runs / new chunks stored", f"{f['write']:.0f} ms",
                 f"{f['stored'] / 1e6:.0f} MB", f"stream {f['bytes'] / 1e6:.0f} MB"))
    rows.append(("  anchor: stopped method (before): guest paused / bytes", f"{f['st_pause']:.0f} ms",
                 f"{f['st_bytes'] / 1e6:.0f} MB", f"pause ratio {f['pause'] / f['st_pause']:.3f}"))
    rows.append((f"restore to running, {what}: pages as the guest asks (postcopy)",
                 f"{r['bg']['restore_ms']:.0f} ms", "",
                 f"agent {r['bg']['answering_ms']:.0f}, every page in {r['bg']['all_in_ms']:.0f}"))
    rows.append(("  before: the whole stream read first", f"{r['bg-stream']['restore_ms']:.0f} ms", "",
                 f"agent {r['bg-stream']['answering_ms']:.0f}, ratio "
                 f"{r['bg']['restore_ms'] / r['bg-stream']['restore_ms']:.2f}"))
    rows.append(("  anchor: from the RAM file (stopped method)", f"{r['stopped']['restore_ms']:.0f} ms", "",
                 f"RAM copy {r['stopped']['clone_ms']:.0f}, agent {r['stopped']['answering_ms']:.0f}"))


def anchors(m, work, runs):
    """savevm/loadvm and plain migrate-to-file on `m` (an AnchorMachine, booted)."""
    save, load, mig, inc, mig_bytes = [], [], [], [], []
    for i in range(runs):
        t0 = time.monotonic()
        m.qmp.cmd("human-monitor-command", **{"command-line": f"savevm s{i}"})
        save.append((time.monotonic() - t0) * 1000)
        t0 = time.monotonic()
        out = m.qmp.cmd("human-monitor-command", **{"command-line": f"loadvm s{i}"})
        load.append((time.monotonic() - t0) * 1000)
        if out and "Error" in out:
            print("loadvm:", out.strip(), file=sys.stderr)
    for i in range(runs):
        f = os.path.join(work, f"full-{i}.state")
        t0 = time.monotonic()
        m.qmp.cmd("stop")
        m.qmp.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": False}])
        m.qmp.cmd("migrate", uri="exec:cat > " + shlex.quote(f))
        m._wait_migration()
        m.qmp.cmd("cont")
        mig.append((time.monotonic() - t0) * 1000)
        mig_bytes.append(os.path.getsize(f))
    # restore from the plain migration file: a new QEMU with -incoming, full RAM read back
    f = os.path.join(work, f"full-{runs - 1}.state")
    for _ in range(runs):
        t0 = time.monotonic()
        m._kill()
        m._prepare()
        m.proc = m._spawn(m._args(m.accel, incoming=True))
        m._connect(30)
        m.qmp.cmd("migrate-incoming", uri="exec:cat " + shlex.quote(f))
        while m.qmp.cmd("query-migrate").get("status") != "completed":
            time.sleep(0.002)
        m.qmp.cmd("cont")
        m.link.ping(60)
        inc.append((time.monotonic() - t0) * 1000)
    return med(save), med(load), med(mig), med(inc), med(mig_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--memory", type=int, default=1024, help="guest RAM in MB (default 1024)")
    ap.add_argument("--first-step-only", action="store_true", help="only the two first-step rows")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="envgit-bench-vm-")
    proj = os.path.join(work, "proj")
    os.makedirs(proj)
    rows = []
    try:
        boots, boot_only, restored, kept_ms = [], [], [], []
        m = None
        # a fresh session's first step, booted (and the booted guest then kept, as the first
        # boot of an image does) and from the kept boot, interleaved so both see the same load
        for i in range(args.runs):
            for use_kept in (False, True):
                if m is not None:
                    m.stop()
                fresh = os.path.join(work, f"proj-{i}-{use_kept}")     # a new project each time
                os.makedirs(fresh)
                m = QemuMachine(fresh, os.path.join(fresh, ".envgit", "vm"), memory_mb=args.memory)
                t0 = time.monotonic()
                m.boot(use_kept=use_kept)
                code, _ = run(m, "true")
                assert code == 0
                took = (time.monotonic() - t0) * 1000
                if use_kept:
                    assert m.came_up.get("how") == "restored", m.came_up
                    restored.append(took)
                    kept_ms.append(m.came_up["ms"])
                else:
                    boots.append(took)
                    boot_only.append(m.boot_ms)
        accel = m.accel.upper()
        rows.append(("first step of a fresh session, booted", f"{med(boots) / 1000:.2f} s", "",
                     f"boot alone {med(boot_only) / 1000:.2f} s"))
        rows.append(("first step of a fresh session, from the kept boot", f"{med(restored) / 1000:.2f} s",
                     "", f"restore+check+setup {med(kept_ms):.0f} ms"))
        if args.first_step_only:
            m.stop()
            return _table(rows, accel, args)
        f, r = snapshot_series(m, work, args.runs, "idle")
        _snapshot_rows(rows, "idle guest", f, r)
        # 300 MB touched by a process that stays (random bytes: no zero page to skip)
        code, out = run(m, "python3 -c 'import os,time\nb=bytearray(os.urandom(1<<20))*300\n"
                           "open(\"/tmp/held\",\"w\").write(\"1\")\ntime.sleep(1e9)' >/dev/null 2>&1 & "
                           "while [ ! -e /tmp/held ]; do sleep 0.2; done; echo held")
        assert "held" in out, out
        f, r = snapshot_series(m, work, args.runs, "touched")
        _snapshot_rows(rows, "300 MB touched", f, r)
        m.stop()
        # anchors: the same guest (300 MB touched), QEMU's own methods
        a = AnchorMachine(proj, os.path.join(work, "anchor"), memory_mb=args.memory)
        a.qcow2 = os.path.join(work, "anchor.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", a.qcow2, "64M"], check=True)
        a.boot()
        run(a, "python3 -c 'import os,time\nb=bytearray(os.urandom(1<<20))*300\n"
               "open(\"/tmp/held\",\"w\").write(\"1\")\ntime.sleep(1e9)' >/dev/null 2>&1 & "
               "while [ ! -e /tmp/held ]; do sleep 0.2; done")
        save, load, mig, inc, mig_bytes = anchors(a, work, args.runs)
        a.stop()
        rows.append(("anchor: savevm / loadvm, 300 MB touched", f"{save:.0f} ms", "", f"loadvm {load:.0f} ms"))
        rows.append(("anchor: stop + migrate to file / -incoming restore, 300 MB",
                     f"{mig:.0f} ms", f"{mig_bytes / 1e6:.0f} MB", f"restore {inc:.0f} ms"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _table(rows, accel, args)


def _table(rows, accel, args):
    print(f"\nVM tier, QEMU microvm, {accel}, guest {args.memory} MB, medians of {args.runs} "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"| {'measure':<58} | {'time':>9} | {'bytes':>7} | {'':<26} |")
    print(f"|{'-' * 60}|{'-' * 11}|{'-' * 9}|{'-' * 28}|")
    for name, t, b, extra in rows:
        print(f"| {name:<58} | {t:>9} | {b:>7} | {extra:<26} |")


if __name__ == "__main__":
    main()
