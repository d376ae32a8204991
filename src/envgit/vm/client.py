"""`envgit run` on the VM tier: the caller's streams to and from the step's command in the
guest, over the daemon's step socket (vm/host.py). Standard library only (the hot path).

With a terminal on stdin, the terminal is put in raw mode for the step (the guest's pty does
the line discipline, so Ctrl-C reaches the command as it would locally) and its size follows
SIGWINCH; without one, stdin is copied until EOF and SIGINT, SIGTERM, SIGHUP and SIGQUIT sent
to this process are passed on to the command's process group in the guest.
"""

import _signal as signal  # type: ignore[import-not-found]  # the builtin (no stub): `signal` imports enum
import os
import socket
import struct

from . import wire

FORWARDED = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)


def run_step(vm: dict, conn=None) -> tuple[int, int, float]:
    """(exit code, signal number or 0, ms) of the step whose socket and token are in `vm`.
    `conn`: the daemon connection, whose pushes (a gate's question, a notice) are said on
    stderr meanwhile; a question is answered from another terminal (`envgit approve ID`),
    this one being the guest command's."""
    import select
    import time
    t0 = time.monotonic()
    tty = os.isatty(0)
    rows, cols = _winsize()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(vm["sock"])
    s.sendall(wire.pack(wire.HELLO, f"{vm['token']} {int(tty)} {rows} {cols}".encode()))
    saved = None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    old = {}
    pending_signals = []
    try:
        if tty:
            import termios
            import tty as ttymod
            saved = termios.tcgetattr(0)
            ttymod.setraw(0)
        signal.set_wakeup_fd(wake_w)
        old[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, lambda *_: pending_signals.append(signal.SIGWINCH))
        for sg in FORWARDED:
            old[sg] = signal.signal(sg, lambda n, _f: pending_signals.append(n))
        reader = wire.Reader()
        stdin_open = True
        daemon = conn.sock if conn is not None else None
        while True:
            watch: list = [s, wake_r] + ([0] if stdin_open else []) + ([daemon] if daemon is not None else [])
            try:
                ready, _, _ = select.select(watch, [], [])
            except InterruptedError:
                ready = []
            while pending_signals:
                sg = pending_signals.pop(0)
                if sg == signal.SIGWINCH:
                    s.sendall(wire.pack(wire.WINSIZE, struct.pack("!HH", *_winsize())))
                else:
                    s.sendall(wire.pack(wire.SIGNAL, struct.pack("!I", sg)))
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            if daemon is not None and daemon in ready:
                if not conn.fill():
                    daemon = None       # the daemon went away; the command goes on
                while daemon is not None and conn.has_frame():
                    _said(conn.read_frame(), tty)
            if 0 in ready:
                try:
                    data = os.read(0, 65536)
                except OSError:
                    data = b""
                if data:
                    s.sendall(wire.pack(wire.STDIN, data))
                else:
                    stdin_open = False
                    if not tty:
                        s.sendall(wire.pack(wire.STDIN_EOF))
            if s in ready:
                data = s.recv(65536)
                if not data:
                    return 125, 0, _ms(t0)
                reader.feed(data)
                for kind, _, payload in reader.frames():
                    if kind == wire.STDOUT:
                        wire.write_all(1, payload)
                    elif kind == wire.STDERR:
                        wire.write_all(2, payload)
                    elif kind == wire.EXIT:
                        code, sig = wire.read_exit(payload)
                        return code, sig, _ms(t0)
                    elif kind == wire.ERROR:
                        os.write(2, b"envgit: " + payload + b"\n")
                        return 125, 0, _ms(t0)
    finally:
        if saved is not None:
            import termios
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        signal.set_wakeup_fd(-1)
        for sg, h in old.items():
            signal.signal(sg, h)
        os.close(wake_r)
        os.close(wake_w)
        s.close()


def _said(frame, tty):
    """A push from the daemon during the step, as one line on stderr (inert: its text is the
    step's choice)."""
    from ..inert import inert
    kind = frame.get("push")
    if kind == "notice":
        text = inert(str(frame.get("text", "")))
    elif kind == "ask":
        q = frame.get("question") or {}
        text = (f"envgit: step {q.get('step')} asks: " + inert(
            f"{q.get('method')} {q.get('host')}{q.get('path')} ({q.get('kind') or 'request'}) by rule "
            f"{q.get('rule')}") + f"; answer from another terminal: envgit approve {frame.get('id')} / "
            f"envgit deny {frame.get('id')} (no answer in {frame.get('timeout') or 120:g} s denies)")
    elif kind == "asked":
        text = inert(f"envgit: question {frame.get('id')}: {frame.get('answer')} ({frame.get('who')})")
    else:
        return
    os.write(2, (text + ("\r\n" if tty else "\n")).encode())


def _ms(t0):
    import time
    return round((time.monotonic() - t0) * 1000, 3)


def _winsize():
    try:
        import fcntl
        import termios
        rows, cols = struct.unpack("HHHH", fcntl.ioctl(1 if os.isatty(1) else 0, termios.TIOCGWINSZ, b"\0" * 8))[:2]
        return rows or 24, cols or 80
    except (OSError, ImportError):
        return 24, 80
