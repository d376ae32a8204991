"""Receiving descriptors a caller passes with a frame's first bytes (SCM_RIGHTS), as the
daemon's inner socket (daemon/inner.py) and the gate's ssh socket (proxy/sshpipes.py) both do.
Standard library only."""

import array
import os
import socket

MAX_FDS = 3         # a caller's stdin, stdout and stderr: any more are closed at once


def recv_with_fds(conn, n: int) -> tuple[bytes, list[int]]:
    """Up to `n` bytes (fewer only when the caller hung up) and the descriptors that came with
    the first of them, close-on-exec (never inherited by another step's sandbox started
    meanwhile); at most MAX_FDS are kept, the rest closed. On an error the kept ones are
    closed too."""
    fds = array.array("i")
    data, anc, _, _ = conn.recvmsg(n, socket.CMSG_LEN(16 * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    got = list(fds)
    for fd in got[MAX_FDS:]:
        os.close(fd)
    got = got[:MAX_FDS]
    try:
        while len(data) < n:
            more = conn.recv(n - len(data))
            if not more:
                break
            data += more
    except BaseException:
        for fd in got:
            os.close(fd)
        raise
    return data, got
