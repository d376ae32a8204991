"""The sandbox's only way out: a bridge on 127.0.0.1:3128 inside the step's network namespace
to the gate's unix socket outside, the proxy variables pointing at it, and the session CA
trusted by every client that reads the usual places.

The namespace has loopback only, so a program that ignores the proxy variables gets no
network at all: the sandbox fails closed. Without `network.allow` there is no bridge either.
"""

import os
from dataclasses import dataclass

PORT = 3128
SOCKET_INSIDE = "/run/envgit/proxy.sock"
CERTS_INSIDE = "/etc/ssl/certs"
BUNDLE_INSIDE = CERTS_INSIDE + "/ca-certificates.crt"

# socat listens before the command starts (it is reparented to the sandbox's init by the
# subshell, so a shell that `wait`s for its children does not wait for it; the subshell prints
# its pid); the loop reads /proc/net/tcp with shell builtins until 127.0.0.1:3128 is in LISTEN
# state, and gives up as soon as socat is gone (it could not start: a bad ENVGIT_SOCAT, a
# missing library) or after 2000 reads. The table is read on fd 3, scoped to the inner loop,
# and the command is exec'ed outside it: its stdin, stdout, stderr and terminal are exactly
# the ones `envgit run` got, and no other descriptor is left open in it. A socat that is not
# installed at all is found before the step begins (_socat: the daemon refuses the step).
# socat runs in a session of its own (setsid, from the system's directories: util-linux and
# busybox have it), out of the terminal's foreground group: a Ctrl-C the command survives (a
# REPL, a dev server) must not end the step's network with it.
SETSID = """\
ss=
for f in /usr/bin/setsid /bin/setsid; do [ -x "$f" ] && { ss=$f; break; }; done
"""
BRIDGE = SETSID + f"""\
pid=$( ($ss socat TCP-LISTEN:{PORT},bind=127.0.0.1,reuseaddr,fork,nodelay,backlog=128 \
UNIX-CONNECT:{SOCKET_INSIDE} </dev/null >/dev/null 2>&1 & echo $!) )
i=0
up=
while [ $i -lt 2000 ]; do
  while read -r _ local _ state _ <&3; do
    if [ "$local" = 0100007F:0C38 ] && [ "$state" = 0A ]; then up=1; break; fi
  done 3</proc/net/tcp
  [ -n "$up" ] && exec "$@"
  kill -0 "$pid" 2>/dev/null || break
  i=$((i+1))
done
echo "envgit: the network bridge did not start (socat ended at once: check it with envgit doctor; \
apt-get install socat)" >&2
exit 125
"""


# A step with no network at all: its lookups fail at once (resolver.py), and these make the
# package clients that retry every failure (npm: 10 s then 60 s per request, even "host not
# found"; pip: 5 tries with back-off) give up on the first, as nothing outside can answer a
# later try either. Defaults only: the policy's env.set overrides them.
OFFLINE_ENV = {"npm_config_fetch_retries": "0", "PIP_RETRIES": "0", "UV_HTTP_RETRIES": "0",
               "CARGO_NET_RETRY": "0"}


@dataclass
class Net:
    """What the daemon hands the sandbox for one step with network."""
    socket: str            # the gate's unix socket (outside path)
    certs_dir: str         # regenerated /etc/ssl/certs: system roots + the session CA
    credential: str        # "user:password" naming this step to the gate
    tcp_port: int | None = None   # Landlock steps: the gate's port on 127.0.0.1 (no bridge)


def mounts(net: Net) -> list[str]:
    return ["--dir", "/run/envgit", "--ro-bind", net.socket, SOCKET_INSIDE,
            "--ro-bind", net.certs_dir, CERTS_INSIDE, *ssh_mounts(net)]


# git over ssh (proxy/sshgit.py): the gate's ssh socket beside proxy.sock, and envgit's `ssh`
# (sandbox/ssh_shim.py) where git's transport and a typed `ssh` look for it. Its name is `ssh`
# so that git speaks to it as to OpenSSH (port, protocol v2).
SSH_SOCKET_INSIDE = "/run/envgit/ssh.sock"
SSH_INSIDE = "/run/envgit/bin/ssh"
HOST_SSH = ("/usr/bin/ssh", "/usr/local/bin/ssh")


def ssh_mounts(net: Net) -> list[str]:
    """The gate's ssh socket and its copy of the shim (proxy/sshgit.py `listen`), if there."""
    state = os.path.dirname(net.socket)
    sock, shim = os.path.join(state, "ssh.sock"), os.path.join(state, "bin", "ssh")
    if not (os.path.exists(sock) and os.path.isfile(shim)):
        return []
    out = ["--ro-bind", sock, SSH_SOCKET_INSIDE, "--dir", os.path.dirname(SSH_INSIDE),
           "--ro-bind", shim, SSH_INSIDE,
           # the same shim as git's signing program (signing.py): it signs through the gate
           "--ro-bind", shim, os.path.join(os.path.dirname(SSH_INSIDE), "ssh-keygen")]
    for p in HOST_SSH:          # a typed `ssh host git-upload-pack …` lands there too
        if os.path.isfile(p) and not os.path.islink(p):
            out += ["--ro-bind", shim, p]
    return out


def wrap(argv: list[str]) -> list[str]:
    """The bridge prelude before `argv`; LaunchError (with the fix) when socat is missing."""
    return ["/bin/sh", "-c", BRIDGE.replace("$ss socat ", f"$ss {_socat()} ", 1), "envgit-bridge", *argv]


def _socat() -> str:
    """socat by absolute path from a trusted system directory (launch.trusted_binary), never
    the step's PATH, where a project's virtualenv could put one of a step's making. Missing,
    the step is refused before it begins, at once, as envgit's own failure (exit 125)."""
    import shlex

    from .launch import LaunchError, trusted_binary
    try:
        return shlex.quote(trusted_binary("socat"))
    except LaunchError as e:
        raise LaunchError(f"{e}. The network bridge of a step with network.allow needs socat: "
                          "apt-get install socat (dnf install socat, apk add socat)") from None


def environment(net: Net) -> dict[str, str]:
    """The proxy and CA variables of a step with network: the bridge's 127.0.0.1:3128 and the
    trust directory bound at /etc/ssl/certs, or for a Landlock step (no namespace to bridge,
    no path shown as another) the gate's own TCP port and the trust directory where it is."""
    port = net.tcp_port or PORT
    bundle_dir = net.certs_dir if net.tcp_port else CERTS_INSIDE
    url = f"http://{net.credential}@127.0.0.1:{port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    # The CA table in shared/notes/wire.md: each client's own variable for the same bundle.
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
                 "PIP_CERT", "CARGO_HTTP_CAINFO", "NODE_EXTRA_CA_CERTS", "npm_config_cafile",
                 "AWS_CA_BUNDLE"):
        env[name] = os.path.join(bundle_dir, "ca-certificates.crt")
    env["SSL_CERT_DIR"] = bundle_dir
    env["UV_SYSTEM_CERTS"] = "1"
    if not net.tcp_port:
        env["GIT_SSH_COMMAND"] = SSH_INSIDE     # git over ssh through the gate (ssh_mounts)
    user, _, password = net.credential.partition(":")
    env["JAVA_TOOL_OPTIONS"] = " ".join(
        f"-D{scheme}.proxyHost=127.0.0.1 -D{scheme}.proxyPort={port} -D{scheme}.proxyUser={user} "
        f"-D{scheme}.proxyPassword={password}" for scheme in ("http", "https")) + \
        " -Dhttp.nonProxyHosts=localhost|127.0.0.1"
    return env
