"""The gate: mitmproxy embedded in the caller's asyncio loop, listening on a unix socket, with
envgit's addons (one job each, in this order: steps.py, judge.py, record.py, credentials.py,
echoguard.py; flowstate.py says what they share) judging every connection and request by the
policy.

mitmproxy listens on TCP only, so the gate runs its own listeners (the unix socket, and a
loopback TCP port for tests and benchmarks) and hands each accepted connection to a
mitmproxy `ServerInstance.handle_stream`: the one semi-internal API used, hence the pin
(mitmproxy==12.3.1). mitmproxy's own `Master.run()` is not used: it would install an eager
task factory and an exception handler on the daemon's loop.
"""

import asyncio
import hmac
import itertools
import logging
import os
import secrets
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..paths import UnixAddress
from ..policy import hostnames, network
from . import bodies, ca
from .credvalues import CredentialValues
from .flowstate import Conn
from .sshgit import SSHGit

if TYPE_CHECKING:
    from mitmproxy.master import Master
    from mitmproxy.proxy.mode_servers import ServerInstance

log = logging.getLogger("envgit.proxy")

ASK_TIMEOUT = 120.0


def resolve_from_env(environ=os.environ) -> dict[str, str]:
    """ENVGIT_RESOLVE='name=127.0.0.1[,name2=::1][,name3=127.0.0.1:8443][,name4=[::1]:8443]'
    (test-only; the daemon's own environment, never the policy, never the sandbox's). With a
    port, the name's connections on every port go to that port: a test's server stands in
    for pypi.org:443 on a port of its own (the step, the policy and the records still say
    pypi.org:443)."""
    out = {}
    for item in environ.get("ENVGIT_RESOLVE", "").split(","):
        name, eq, addr = item.strip().partition("=")
        if eq and name and addr:
            out[hostnames.norm_host(name)] = addr.strip()
    return out


def _address(value: str) -> tuple[str, int | None]:
    """An ENVGIT_RESOLVE target: 'addr', 'v4:port', '[v6]:port' -> (addr, port or None)."""
    if value.startswith("["):
        addr, _, rest = value[1:].partition("]")
        return addr, int(rest[1:]) if rest.startswith(":") else None
    if value.count(":") == 1:
        addr, port = value.split(":")
        return addr, int(port)
    return value, None


def upstream_ca_from_env(environ=os.environ) -> Path | None:
    """ENVGIT_UPSTREAM_CA=/path/ca.pem: an extra root for verifying upstream servers
    (test-only: the local test servers' own CA), added to the system roots."""
    p = environ.get("ENVGIT_UPSTREAM_CA")
    return Path(p) if p else None


# A sandbox's open connections to the gate at once: each holds descriptors of the daemon, which
# every step and client of the project share, so one step's flood must not use them up. A
# package manager opens tens; past this a new one is closed at once.
MAX_CONNECTIONS_PER_SANDBOX = 512

# How long a connection made before start() has finished waits for it (mitmproxy's start-up
# takes about a second; a loaded machine many)
START_WAIT_S = 60


def _peer_pidns(sock):
    """The pid namespace (inode) of a unix-socket peer, from SO_PEERCRED; None for TCP."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        return os.stat(f"/proc/{pid}/ns/pid").st_ino if pid > 0 else None
    except OSError:
        return None


async def _listening(addresses, port) -> str | None:
    """The first of `addresses` something listens on at `port`: a dev server on `localhost`
    may have bound ::1 only (Node resolves localhost to it first) or 127.0.0.1 only, and
    mitmproxy tries one address."""
    for addr in addresses:
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(addr, port), 1.0)
        except (OSError, TimeoutError):
            continue
        w.close()
        return addr
    return None


def _import_mitmproxy() -> None:
    """What start() imports (about 0.3 s): on a thread, so the loop is not held meanwhile.

    mitmproxy/addons/__init__.py imports all of mitmproxy's ~30 default addons (flask for its
    onboarding page, ldap3 for proxy auth, pyparsing for its filters…) for default_addons(),
    which the gate never calls: the package is entered as a bare module with its search path,
    so only the five addons named here load (~140 ms less of every gate's start)."""
    import importlib.util
    import sys
    if "mitmproxy.addons" not in sys.modules:
        spec = importlib.util.find_spec("mitmproxy.addons")
        if spec is not None and spec.submodule_search_locations is not None:
            sys.modules["mitmproxy.addons"] = importlib.util.module_from_spec(spec)
    import mitmproxy.addons.core  # noqa: F401
    import mitmproxy.addons.disable_h2c  # noqa: F401
    import mitmproxy.addons.next_layer  # noqa: F401
    import mitmproxy.addons.proxyserver  # noqa: F401
    import mitmproxy.addons.tlsconfig  # noqa: F401
    import mitmproxy.master  # noqa: F401
    import mitmproxy.options  # noqa: F401
    import mitmproxy.proxy.mode_servers  # noqa: F401

    # the gate's own addons import mitmproxy.http (~90 ms): here too, not on the first step's path
    from . import credentials, echoguard, flows, judge, record, steps  # noqa: F401


class Counted:
    """The client side of one connection, counting bytes each way: a tunnel has no
    per-message hooks to count with. Everything else is the underlying stream's."""

    def __init__(self, reader, writer, peername, pidns=None):
        self._reader, self._writer, self._peer = reader, writer, peername
        self.up = self.down = 0
        self.pidns = pidns        # the pid namespace of the process on the other end (unix socket)
        self._held: asyncio.Event | None = None

    def hold(self) -> None:
        """Read nothing more from the client until release(): while a request waits for a
        person, the body it is still sending stays in the kernel's buffers and the client's,
        not in the daemon (mitmproxy queues whatever it reads while a hook runs)."""
        if self._held is None:
            self._held = asyncio.Event()

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.set()

    async def read(self, n=-1):
        while self._held is not None:
            await self._held.wait()
        data = await self._reader.read(n)
        self.up += len(data)
        return data

    def write(self, data):
        self.down += len(data)
        self._writer.write(data)

    def close(self) -> None:
        self._writer.close()

    def get_extra_info(self, name, default=None):
        if name in ("peername", "sockname") and self._peer[0] == "unix":
            return self._peer                      # mitmproxy wants (host, port) addresses
        return self._writer.get_extra_info(name, default)

    def __getattr__(self, name):
        return getattr(self._writer, name)


class Gate:
    """The network gate of one session. See the package doc for the interface."""

    def __init__(self, get_policy: Callable, state_dir: Path, resolve: dict[str, str],
                 record: Callable[[int, dict], None],
                 ask: Callable[[int, dict], Awaitable[tuple[str, str, str]]],
                 *, upstream_ca: Path | None = None, ask_timeout: float = ASK_TIMEOUT):
        self.policy = get_policy
        self.state_dir = Path(state_dir)
        self.resolve = {hostnames.norm_host(k): v for k, v in resolve.items()}
        self._record, self._ask = record, ask
        self.upstream_ca, self.ask_timeout = upstream_ca, ask_timeout
        self.credentials = CredentialValues()    # the placeholders and real values the addons share
        self.addons: list = []          # made by start(), once their modules are imported
        self.tcp_address: tuple[str, int] | None = None
        self._creds: dict[str, tuple[str, int]] = {}      # user -> (password, step)
        self._pidns: dict[int, int] = {}                  # step -> its sandbox's pid namespace
        self._learning: set[int] = set()                  # steps in learn mode (policy/learn.py)
        self._answers: dict[tuple, tuple] = {}            # effect -> (answer, who, how, at)
        self._asking: dict[tuple, asyncio.Future] = {}
        self._conns: dict[tuple, Conn] = {}               # peer -> its connection (and Counted)
        self._routes: dict[str, tuple] = {}                # server id -> (name, port)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._open_from: dict[int, int] = {}              # sandbox pid namespace -> its open connections
        self.master: Master | None = None
        self._instance: ServerInstance | None = None
        self._ready = asyncio.Event()     # start() has finished (or failed): connections go on
        self._listening = self._stopped = False
        self._waiting: dict[int, int] = {}               # sandbox pid namespace -> its connections waiting for start()
        self.ssh = SSHGit(self)                          # git over ssh (sshgit.py), beside proxy.sock

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "proxy.sock"

    @property
    def ca_cert_path(self) -> Path:
        return ca.ca_cert_path(self.state_dir)

    def ca_bundle_dir(self, system_certs: str = "/etc/ssl/certs") -> Path:
        """A regenerated certs directory (system roots + session CA, rehashed) to bind over
        /etc/ssl/certs in the sandbox; its bundle file is `<dir>/ca-certificates.crt`."""
        return ca.trust_dir(self.state_dir, system_certs, extra=self.upstream_ca)

    # --- life ----------------------------------------------------------------------------

    async def listen(self) -> None:
        """Listen on state_dir/proxy.sock (0600) now, before start(): a connection made
        meanwhile waits for it. So the first step of a session need not wait for mitmproxy's
        import and start-up (most of a second), only a request it makes in that time does."""
        if self._listening:
            return
        sock = self.socket_path
        self.state_dir.mkdir(parents=True, exist_ok=True)
        sock.unlink(missing_ok=True)
        old = os.umask(0o177)
        try:
            with UnixAddress(str(sock)) as addr:      # a deep project's path may be too long
                self._servers.append(await asyncio.start_unix_server(self._serve_when_ready, path=addr))
        finally:
            os.umask(old)
        self.ssh.listen()
        self._listening = True

    def ca_ready(self) -> bool:
        """The session CA is there already (made by an earlier session of this project): the
        sandbox's trust directory can be made before start()."""
        return self.ca_cert_path.is_file()

    async def start(self, tcp_port: int | None = None) -> None:
        """Listen on state_dir/proxy.sock (0600), unless listen() did; with `tcp_port` (0: any)
        also on 127.0.0.1, address in `tcp_address` (tests, benchmarks). Connections wait
        until it returns; if it fails, they are closed."""
        try:
            await self._start(tcp_port)
        finally:
            self._ready.set()

    async def _start(self, tcp_port):
        # mitmproxy's modules are imported on a thread: the daemon's loop (a step's end, the
        # next begin) goes on meanwhile
        await asyncio.to_thread(_import_mitmproxy)
        from mitmproxy import options
        from mitmproxy.addons import core, disable_h2c, next_layer, proxyserver, tlsconfig
        from mitmproxy.master import Master
        from mitmproxy.proxy.mode_servers import ServerInstance

        from .credentials import CredentialSwap
        from .echoguard import EchoGuard
        from .judge import Judge
        from .record import Record
        from .steps import Steps
        # In this order: each event runs on each in turn (flowstate.py); the swap after the
        # judge swaps only what it allowed.
        self.addons = [Steps(self), Judge(self), Record(self), CredentialSwap(self), EchoGuard(self)]
        bodies.install()

        self.state_dir.mkdir(parents=True, exist_ok=True)
        confdir = ca.ca_dir(self.state_dir)
        await asyncio.to_thread(ca.make_session_ca, confdir)    # mitmproxy's store loads it
        opts = options.Options()
        self.master = master = Master(opts, event_loop=asyncio.get_running_loop())
        servers = proxyserver.Proxyserver()
        master.addons.add(core.Core(), servers, next_layer.NextLayer(),
                          tlsconfig.TlsConfig(), disable_h2c.DisableH2C(), *self.addons)
        opts.update(
            mode=[],                          # mitmproxy listens on nothing; the gate does
            confdir=str(confdir),
            rawtcp=False,                     # else an SSH banner inside a tunnel gets through
            connection_strategy="lazy",       # judge before connecting upstream
            upstream_cert=False,              # never connect only to copy a certificate
            validate_inbound_headers=True,    # request smuggling (CL+TE, bad chunking)
            ssl_verify_upstream_trusted_ca=str(ca.upstream_bundle(self.state_dir, self.upstream_ca)),
            ssl_insecure=False,
            # HTTP/1.1 towards clients of intercepted hosts: with an HTTP/2 client and an
            # HTTP/1 server mitmproxy opens a new upstream connection for every request
            # (measured: 4.3 ms instead of 0.3 ms each). Tunnelled hosts keep HTTP/2.
            http2=False,
            websocket=True,
        )
        await master.running()                # tlsconfig loads the CA here
        self._instance = ServerInstance.make("regular", servers)
        await self.listen()
        if tcp_port is not None:
            srv = await asyncio.start_server(self._serve, "127.0.0.1", tcp_port)
            self._servers.append(srv)
            self.tcp_address = srv.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        self._stopped = True
        self._ready.set()                       # connections still waiting for start() are closed
        for srv in self._servers:
            srv.close()
        # Closing the client sockets lets mitmproxy wind each connection down itself
        # (cancelling its task would leave its timeout watchdog pending).
        for conn in list(self._conns.values()):
            if conn.counter is not None:
                conn.counter.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
        self._servers.clear()
        self.socket_path.unlink(missing_ok=True)
        self.ssh.close()
        if self.master is not None:
            await self.master.done()
            self.master = None

    async def _serve_when_ready(self, reader, writer):
        if not self._ready.is_set():
            # a sandbox's connections waiting count against its limit too (each holds a
            # descriptor of the daemon meanwhile)
            pidns = _peer_pidns(writer.get_extra_info("socket"))
            if pidns is not None and self._waiting.get(pidns, 0) >= MAX_CONNECTIONS_PER_SANDBOX:
                writer.close()
                return
            if pidns is not None:
                self._waiting[pidns] = self._waiting.get(pidns, 0) + 1
            try:
                await asyncio.wait_for(self._ready.wait(), START_WAIT_S)
            except TimeoutError:
                pass
            finally:
                if pidns is not None:
                    self._waiting[pidns] -= 1
        if self._instance is None or self._stopped:     # start() failed or hangs, or stop() came first
            writer.close()
            return
        await self._serve(reader, writer)

    async def _serve(self, reader, writer):
        task = asyncio.current_task()
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        peer = tuple(peer[:2]) if isinstance(peer, tuple) and peer else ("unix", next(self._ids))
        sock = writer.get_extra_info("socket")
        pidns = _peer_pidns(sock)
        if pidns is not None and self._open_from.get(pidns, 0) >= MAX_CONNECTIONS_PER_SANDBOX:
            writer.close()                      # a step's flood: its own connections only
            self._tasks.discard(task)
            return
        if pidns is not None:
            self._open_from[pidns] = self._open_from.get(pidns, 0) + 1
        counted = Counted(reader, writer, peer, pidns)
        self._conns[peer] = Conn(counter=counted)
        try:
            if sock is not None and sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await self._instance.handle_stream(counted, counted)
        finally:
            self._conns.pop(peer, None)         # after mitmproxy's client_disconnected
            self._tasks.discard(task)
            if pidns is not None:
                left = self._open_from.get(pidns, 1) - 1
                if left > 0:
                    self._open_from[pidns] = left
                else:
                    self._open_from.pop(pidns, None)

    def conn_of(self, client) -> Conn | None:
        """What the gate knows of a mitmproxy client connection (flowstate.Conn), by its peer."""
        peername = client.peername
        return self._conns.get(tuple(peername[:2])) if peername else None

    # --- steps ---------------------------------------------------------------------------

    def open_step(self, step_id: int, learn: bool = False) -> str:
        """The "user:password" a step's requests carry in Proxy-Authorization. `learn`: the
        step runs in learn mode (policy/learn.py), which only the daemon decides."""
        user, password = f"step{step_id}", secrets.token_urlsafe(18)
        self._creds[user] = (password, step_id)
        if learn:
            self._learning.add(step_id)
        else:
            self._learning.discard(step_id)
        return f"{user}:{password}"

    def learning(self, step_id) -> bool:
        return step_id in self._learning

    def stop_learning(self, step_id: int) -> None:
        """`envgit learn off` while the step runs: its next request is judged without it."""
        self._learning.discard(step_id)

    def bind_step(self, step_id: int, pidns: int) -> None:
        """Only connections from this pid namespace (the step's sandbox: its bridge) may use
        the step's credentials: another step that read them cannot be attributed to it."""
        self._pidns[step_id] = pidns

    def close_step(self, step_id: int) -> None:
        self._creds.pop(f"step{step_id}", None)
        self._pidns.pop(step_id, None)
        self._learning.discard(step_id)
        for key in [k for k in self._answers if k[0] == step_id]:
            del self._answers[key]

    def step_of(self, user: str, password: str, counter=None) -> int | None:
        """The step a request's credentials name, if they are valid *from where it came*: on
        the unix socket (every sandbox's way in) only from the pid namespace the step's
        credentials were tied to (bind_step, from its launcher); a credential never tied to a
        sandbox is refused, so one read by another process gets it nothing. The loopback TCP
        listener, opened only by tests and benchmarks (start(tcp_port=…)), has no peer to
        check and takes the password alone."""
        entry = self._creds.get(user)
        if not entry or not hmac.compare_digest(entry[0].encode(), password.encode()):
            return None
        if counter is not None and getattr(counter, "_peer", ("",))[0] != "unix":
            return entry[1]                       # the test listener (no unix peer)
        bound = self._pidns.get(entry[1])
        if bound is None or getattr(counter, "pidns", None) != bound:
            return None                           # untied, or the right password from the wrong sandbox
        return entry[1]

    def step_in(self, sock) -> int | None:
        """The open step whose sandbox (bind_step's pid namespace) the peer of the unix socket
        `sock` is in, or None: how a connection that carries no credentials (sshgit.py) is
        attributed. Never by the daemon's own namespace, a VM step's, which every host
        process shares."""
        pidns = _peer_pidns(sock)
        if pidns is None or pidns == os.stat("/proc/self/ns/pid").st_ino:
            return None
        return next((s for s, ns in list(self._pidns.items()) if ns == pidns and self.step_open(s)), None)

    def step_open(self, step_id) -> bool:
        return step_id is not None and f"step{step_id}" in self._creds

    def emit(self, step_id, rec: dict) -> None:
        if step_id is None:
            return
        try:
            if getattr(self.policy(), "credentials", None):
                # The one place every request's record passes: no text of it (an error a
                # server's malformed answer made, quoting a token it echoed) keeps a real value.
                self.credentials.scrub(self.policy(), rec)
            # every text as UTF-8 holds it (a path's byte that is not UTF-8 as %XX): a record
            # the journal refused would leave the request on no record at all
            from .flows import as_texts  # imported by start(), before any flow
            self._record(step_id, as_texts(rec))
        except Exception:                         # a broken journal must not break the proxy
            log.exception("recording a request of step %s failed", step_id)

    # --- asks ----------------------------------------------------------------------------

    async def ask_once(self, step: int, effect: tuple, question: dict, d) -> tuple[str, str, str, float]:
        """The person's answer about this effect in this step (approval.approval_effect: a
        push's repository and exact ref updates, GraphQL operations, or method, host, path and
        query): asked once, remembered for the step, for exactly that effect. "allow-rule"
        covers what the prompt says: every request the same rule matches on this host and
        port, for the rest of the step. No answer within ask_timeout is a deny."""
        where = (hostnames.norm_host(question["host"]), question["port"])
        effect = (step, "effect", *where, *effect)       # never across hosts, whatever the effect
        wide = (step, "rule", d.rule, *where)
        for key in (effect, wide):
            if key in self._answers:
                answer, who, how, at = self._answers[key]
                return answer, who, f"{how}; given earlier in this step", at
        if effect not in self._asking:
            self._asking[effect] = asyncio.ensure_future(self._ask_person(step, question, effect, wide))
        return await asyncio.shield(self._asking[effect])

    async def _ask_person(self, step, question, effect, wide):
        try:
            answer, who, how = await asyncio.wait_for(self._ask(step, question), self.ask_timeout)
        except TimeoutError:
            answer, who, how = "deny", "timeout", f"no answer within {self.ask_timeout:g} s"
        except Exception as e:
            log.exception("asking about step %s failed", step)
            answer, who, how = "deny", "error", f"the question could not be asked: {e}"
        finally:
            self._asking.pop(effect, None)
        result = ("allow" if answer in ("allow", "allow-rule") else "deny", who, how, time.time())
        self._answers[wide if answer == "allow-rule" else effect] = result
        return result

    # --- upstream ------------------------------------------------------------------------

    async def route(self, server) -> None:
        """Before mitmproxy connects upstream: ENVGIT_RESOLVE names go to their mapped
        address; other names are resolved here and the address judged (a name of an allowed
        host must not lead to a loopback or metadata address)."""
        name, port = server.address[0], server.address[1]
        host = hostnames.norm_host(name)
        if host in self.resolve:
            addr, moved = _address(self.resolve[host])
            port = moved or port
        elif hostnames.ip_literal(host) is not None:
            return
        elif hostnames.is_special(host) == "a loopback name":
            # localhost is this machine's loopback whatever a resolver says (RFC 6761): the
            # address something listens on, as curl and browsers try both.
            addr = await _listening(("127.0.0.1", "::1"), port) or "127.0.0.1"
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as e:
                server.error = f"cannot resolve {host}: {e}"
                return
            # IPv4 first: the sandbox's host often has no IPv6 route, and only one is tried.
            infos.sort(key=lambda i: i[0] != socket.AF_INET)
            addr = str(infos[0][4][0])             # an IPv4 or IPv6 address (typed str | int)
            d = network.judge_address(self.policy(), host, port, addr)
            if d.action != "allow":
                server.error = f"envgit: {d.reason} (rule {d.rule})"
                return
        if server.sni is None:
            server.sni = name                     # verify the certificate for the name
        self._routes[server.id] = server.address
        server.address = (addr, port)

    def unroute(self, server) -> None:
        """Once connected, the connection goes back to its name: mitmproxy reuses an upstream
        connection only for a request to the same address, and requests name hosts. (The
        setter refuses changes on an open connection, to keep its address meaning what it
        connected to; here the name is what it connected *for*, which is what must match.)"""
        if server.id in self._routes:
            object.__setattr__(server, "address", self._routes.pop(server.id))
