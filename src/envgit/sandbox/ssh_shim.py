#!/usr/bin/env python3
"""envgit's `ssh` inside a step: git's SSH transport (GIT_SSH_COMMAND, and /usr/bin/ssh
itself, both this file) asks the session's gate to open the connection on the host.

    ssh [-p PORT] [-l USER] [-o SendEnv=GIT_PROTOCOL] [-46Tq] [USER@]HOST COMMAND…

Bound also as /run/envgit/bin/ssh-keygen, git's signing program when the policy has `signing:`
(sandbox/signing.py): as that name it sends what git asks it to sign to the gate
(proxy/sshsign.py) and writes the signature back; any other ssh-keygen use is the real one's.

Only the destination, the port and the remote command are sent, with this process's stdin,
stdout and stderr (SCM_RIGHTS); the gate (proxy/sshgit.py) runs the person's own ssh on the
host, allows git's three services only, judges a push ref by ref, and replies with the exit
status. No key, agent socket or ssh option of the step's reaches the host's ssh.

Standalone on purpose (standard library only, no envgit import): it runs inside the sandbox,
where the envgit package is not visible; it is bound in read-only. Its framing is the inner
socket's (inner_shim.py): a 4-byte big-endian length and a UTF-8 JSON object, the three fds
with the first bytes.
"""

import array
import base64
import json
import os
import socket
import sys

SOCKET = "/run/envgit/ssh.sock"
# Options git's OpenSSH variant passes, and harmless flags: anything else would be a setting of
# the step's for the host's ssh, which it never gets.
FLAGS = set("46TqvxaknNC")
TAKES_ARG = set("plo")
GIT_OPTIONS = ("SendEnv=GIT_PROTOCOL", "BatchMode=yes")
MAX_REPLY = 1 << 20
MAX_PAYLOAD = 40 * 1024      # a commit or tag to sign, base64'd within the gate's 64 KiB frame


class Usage(Exception):
    pass


def parse(argv):
    """{host, user, port, command} from an OpenSSH-style command line; Usage says what is not
    carried."""
    out = {"user": None, "port": None}
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        j = 1
        while j < len(arg):
            c = arg[j]
            if c in FLAGS:
                j += 1
                continue
            if c not in TAKES_ARG:
                raise Usage(f"option -{c} is not carried: inside an envgit step, ssh only opens git's "
                            "own connections, with the person's ssh settings on the host")
            value = arg[j + 1:]
            if not value:
                i += 1
                if i >= len(argv):
                    raise Usage(f"option -{c} needs a value")
                value = argv[i]
            if c == "p":
                if not value.isdigit() or not 0 < int(value) < 65536:
                    raise Usage(f"-p {value!r} is not a port")
                out["port"] = int(value)
            elif c == "l":
                out["user"] = value
            elif value not in GIT_OPTIONS:
                raise Usage(f"-o {value} is not carried: the host's ssh uses the person's own "
                            "settings (~/.ssh/config); inside a step ssh only opens git's connections")
            break
        i += 1
    if i >= len(argv):
        raise Usage("no destination")
    dest = argv[i]
    user, at, host = dest.rpartition("@")
    if at:
        out["user"] = user
    out["host"] = host
    out["command"] = " ".join(argv[i + 1:])
    if not out["command"]:
        raise Usage(f"no remote command: inside an envgit step, ssh to {host} runs git's services "
                    "only (git-upload-pack, git-receive-pack, git-upload-archive '<repository>')")
    return out


def _exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("the envgit gate closed the connection")
        buf += chunk
    return buf


def ask(target):
    msg = {"op": "git-ssh", **target}
    proto = os.environ.get("GIT_PROTOCOL")
    if proto:
        msg["protocol"] = proto
    return request(msg, [0, 1, 2])


REAL_SSH_KEYGEN = "/usr/bin/ssh-keygen"


def sign_files(argv) -> int:
    """As git's signing program (`ssh-keygen -Y sign -n NAMESPACE -f KEY [-U] FILE…`): each
    FILE's bytes go to the gate, which signs them with the policy's key on the host
    (proxy/sshsign.py) and answers the signature, written to FILE.sig as ssh-keygen would.
    Anything else (`-Y verify`, `-Y find-principals`, …: public data only) is the real
    ssh-keygen's."""
    if argv[:2] != ["-Y", "sign"]:
        if os.access(REAL_SSH_KEYGEN, os.X_OK):
            os.execv(REAL_SSH_KEYGEN, [REAL_SSH_KEYGEN, *argv])
        print("envgit: ssh-keygen: only signing goes through envgit here", file=sys.stderr)
        return 255
    namespace, files, i = None, [], 2
    while i < len(argv):
        a = argv[i]
        if a in ("-n", "-f", "-O") and i + 1 < len(argv):
            namespace = argv[i + 1] if a == "-n" else namespace
            i += 2
            continue
        if a in ("-U", "-q"):
            i += 1
            continue
        files.append(a)
        i += 1
    if not files:
        print("envgit: ssh-keygen: signing through the gate needs the file to sign", file=sys.stderr)
        return 255
    for path in files:
        with open(path, "rb") as f:
            payload = f.read(MAX_PAYLOAD + 1)
        if len(payload) > MAX_PAYLOAD:
            print(f"envgit: ssh-keygen: {path} is over {MAX_PAYLOAD} bytes: not signed", file=sys.stderr)
            return 255
        try:
            reply = request({"op": "sign", "namespace": namespace or "",
                             "payload": base64.b64encode(payload).decode()})
        except (OSError, EOFError, ValueError) as e:
            print(f"envgit: ssh-keygen: cannot reach the envgit gate from this step ({e}): signing "
                  "goes through a step's gate (network.allow in envgit.yaml names a host)", file=sys.stderr)
            return 255
        if "error" in reply or not isinstance(reply.get("signature"), str):
            print(reply.get("error") or "envgit: ssh-keygen: the gate sent no signature", file=sys.stderr)
            return reply.get("exit", 255) if isinstance(reply.get("exit"), int) else 255
        with open(path + ".sig", "w") as f:
            f.write(reply["signature"])
    return 0


def request(msg, fds=None):
    """One frame to the gate (with `fds` on its first bytes) and its reply."""
    body = json.dumps(msg, ensure_ascii=True, separators=(",", ":")).encode()
    data = len(body).to_bytes(4, "big") + body
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ.get("ENVGIT_SSH_SOCKET", SOCKET))
    with s:
        try:
            if fds:
                s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                s.sendall(data[4:])
            else:
                s.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            # the gate refuses some connections before reading them (a step with too many
            # open): its one line is there to read all the same
            try:
                return _reply(s)
            except (OSError, EOFError, ValueError):
                raise e from None
        return _reply(s)


def _reply(s):
    size = int.from_bytes(_exact(s, 4), "big")
    if size > MAX_REPLY:
        raise EOFError(f"the envgit gate sent a {size}-byte reply")
    out = json.loads(_exact(s, size))
    return out if isinstance(out, dict) else {"error": "envgit: a reply that is not an object"}


def main(argv):
    if os.path.basename(sys.argv[0]) == "ssh-keygen":
        return sign_files(argv)
    try:
        target = parse(argv)
    except Usage as e:
        print(f"envgit: ssh: {e}", file=sys.stderr)
        return 255
    try:
        reply = ask(target)
    except (OSError, EOFError, ValueError) as e:
        print(f"envgit: ssh: cannot reach the envgit gate from this step ({e}); git over ssh works "
              "in a step whose policy allows the host (network.allow in envgit.yaml)", file=sys.stderr)
        return 255
    if "error" in reply:
        print(reply["error"], file=sys.stderr)
        return reply.get("exit", 255)
    return reply.get("exit_code", 255)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
