"""The gate's cost: per keep-alive HTTPS request and for a 100 MiB download, intercepted
(TLS terminated, each request judged) and tunnelled, beside a direct connection to the same
local HTTPS server, all measured in this run with curl as the client.

    .venv/bin/python bench/bench_proxy.py [--requests N] [--runs N] [--mib N]

The server is a separate process (asyncio + ssl, keep-alive) so that it does not share the
gate's interpreter. The gate runs in this process's event loop, as in the daemon; clients
reach it on its loopback TCP port, and (one row) through a socat bridge to its unix socket,
the way the sandbox does. Anchor (notes/wire.md, nginx, one busy core): direct 0.08 ms,
intercepting 1.5 ms, tunnelling 0.28 ms per request; 100 MiB at 581 MiB/s direct, ~110
intercepting, ~440 tunnelling.
"""

import argparse
import asyncio
import os
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

INTERCEPTED, TUNNELLED = "bench-l7.example.test", "bench-tunnel.example.test"
CHUNK = 1 << 20


# --- the server (a child process) --------------------------------------------------------------

async def serve(cert, key, port_file, mib):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    block = os.urandom(CHUNK)

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path == b"/big":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (mib * CHUNK))
                    for _ in range(mib):
                        writer.write(block)
                        await writer.drain()
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    Path(port_file).write_text(str(srv.sockets[0].getsockname()[1]))
    await srv.serve_forever()


# --- measuring -------------------------------------------------------------------------------

async def curl(*args) -> str:
    p = await asyncio.create_subprocess_exec("curl", "-sS", *args, stdout=asyncio.subprocess.PIPE,
                                             stderr=asyncio.subprocess.PIPE)
    out, err = await p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"curl {' '.join(args[:3])}… failed: {err.decode()[-400:]}")
    return out.decode()


async def per_request_ms(via, url, n, runs) -> float:
    """Median over runs of the median time of requests 2..n on one keep-alive connection."""
    meds = []
    for _ in range(runs):
        args = [*via, "-w", "%{time_total}\n"] + [a for _ in range(n) for a in ("-o", "/dev/null", url)]
        times = [float(x) * 1000 for x in (await curl(*args)).split()]
        meds.append(statistics.median(times[1:]))
    return statistics.median(meds)


async def per_second(via, url, n, runs, conns=4) -> float:
    """Median over runs of requests per second, `conns` keep-alive connections at once (a curl
    each, n requests each), the wall time from the first curl's start to the last one's end."""
    rates = []
    for _ in range(runs):
        args = [*via] + [a for _ in range(n) for a in ("-o", "/dev/null", url)]
        t = time.perf_counter()
        await asyncio.gather(*(curl(*args) for _ in range(conns)))
        rates.append(conns * n / (time.perf_counter() - t))
    return statistics.median(rates)


async def download_mib_s(via, url, runs) -> float:
    speeds = []
    for _ in range(runs):
        out = await curl(*via, "-o", "/dev/null", "-w", "%{speed_download}", url)
        speeds.append(float(out) / (1 << 20))
    return statistics.median(speeds)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=int, default=100)
    args = ap.parse_args()

    from envgit.policy import load_policy
    from envgit.proxy import Gate
    from gitserver import TestCA

    tmp = Path(tempfile.mkdtemp(prefix="envgit-bench-proxy-"))
    ca = TestCA(tmp / "ca")
    cert, key = ca.issue([INTERCEPTED, TUNNELLED])
    port_file = tmp / "port"
    server = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", str(cert), str(key),
                                                  str(port_file), str(args.mib))
    bridge = None
    try:
        for _ in range(100):
            if port_file.exists() and port_file.read_text():
                break
            await asyncio.sleep(0.05)
        port = int(port_file.read_text())
        (tmp / "envgit.yaml").write_text(          # through the real loader, as a project has it
            f'version: 1\nnetwork:\n  allow: ["{INTERCEPTED}:{port}", "{TUNNELLED}:{port}"]\n'
            f'  l7:\n    {INTERCEPTED}: {{ methods: [GET] }}\nirreversible: []\n')
        pol = load_policy(tmp / "envgit.yaml")
        records = []
        gate = Gate(lambda: pol, tmp / "state", {INTERCEPTED: "127.0.0.1", TUNNELLED: "127.0.0.1"},
                    lambda step, rec: records.append(rec), None, upstream_ca=ca.cert_path)
        await gate.start(tcp_port=0)
        cred = gate.open_step(1)
        # the socat bridge runs in this process's pid namespace: tie the credential to it, as
        # a step's launcher ties it to its sandbox's (the gate refuses an untied one)
        gate.bind_step(1, os.stat("/proc/self/ns/pid").st_ino)
        bundle = tmp / "clients.pem"
        bundle.write_bytes(gate.ca_cert_path.read_bytes() + ca.cert_path.read_bytes())
        host, gport = gate.tcp_address
        through = ["--cacert", str(bundle), "-x", f"http://{cred}@{host}:{gport}"]
        bridge_port = gport + 1 if gport < 65000 else gport - 1
        bridge = await asyncio.create_subprocess_exec(
            "socat", f"TCP-LISTEN:{bridge_port},bind=127.0.0.1,reuseaddr,fork,nodelay",
            f"UNIX-CONNECT:{gate.socket_path}") if shutil.which("socat") else None
        await asyncio.sleep(0.3)
        via_unix = ["--cacert", str(bundle), "-x", f"http://{cred}@127.0.0.1:{bridge_port}"]

        def direct(name):
            return ["--cacert", str(ca.cert_path), "--resolve", f"{name}:{port}:127.0.0.1"]

        small = f"https://{{}}:{port}/small"
        big = f"https://{{}}:{port}/big"
        n, runs = args.requests, args.runs
        rows = []
        d_req = await per_request_ms(direct(INTERCEPTED), small.format(INTERCEPTED), n, runs)
        i_req = await per_request_ms(through, small.format(INTERCEPTED), n, runs)
        judged = sum(1 for r in records if r["host"] == INTERCEPTED and r["status"] == 200)
        if judged < n * runs:      # the intercepted row must really be judged request by request
            raise SystemExit(f"only {judged} of {n * runs} intercepted requests were recorded")
        d_rps = await per_second(direct(INTERCEPTED), small.format(INTERCEPTED), n, runs)
        i_rps = await per_second(via_unix if bridge else through, small.format(INTERCEPTED), n, runs)
        t_req = await per_request_ms(through, small.format(TUNNELLED), n, runs)
        u_req = await per_request_ms(via_unix, small.format(INTERCEPTED), n, runs) if bridge else None
        d_big = await download_mib_s(direct(INTERCEPTED), big.format(INTERCEPTED), runs)
        i_big = await download_mib_s(through, big.format(INTERCEPTED), runs)
        t_big = await download_mib_s(through, big.format(TUNNELLED), runs)
        rows = [
            ("per request, direct", f"{d_req:.3f} ms", "", "0.08 ms", ""),
            ("per request, intercepted", f"{i_req:.3f} ms", f"+{i_req - d_req:.3f} ms", "1.5 ms",
             "goal <= +1 ms " + ("ok" if i_req - d_req <= 1 else "MISSED")),
            ("per request, tunnelled", f"{t_req:.3f} ms", f"+{t_req - d_req:.3f} ms", "0.28 ms", ""),
        ]
        if u_req is not None:
            rows.append(("per request, intercepted via socat+unix", f"{u_req:.3f} ms",
                         f"+{u_req - d_req:.3f} ms", "", "the sandbox's path"))
        rows += [
            ("requests/s, 4 keep-alive conns, direct", f"{d_rps:.0f}/s", "", "", ""),
            ("requests/s, 4 conns, intercepted" + (" via socat" if bridge else ""), f"{i_rps:.0f}/s",
             f"x{i_rps / d_rps:.2f}", "", "goal >= 1000 " + ("ok" if i_rps >= 1000 else "MISSED")),
        ]
        rows += [
            (f"{args.mib} MiB download, direct", f"{d_big:.0f} MiB/s", "", "581 MiB/s", ""),
            (f"{args.mib} MiB download, intercepted", f"{i_big:.0f} MiB/s", f"x{i_big / d_big:.2f}",
             "~110 MiB/s", "goal >= 200 " + ("ok" if i_big >= 200 else "MISSED")),
            (f"{args.mib} MiB download, tunnelled", f"{t_big:.0f} MiB/s", f"x{t_big / d_big:.2f}",
             "~440 MiB/s", "goal >= 400 " + ("ok" if t_big >= 400 else "MISSED")),
        ]
        print(f"gate benchmark: {n} keep-alive requests x {runs} runs (median of medians), "
              f"{args.mib} MiB x {runs} runs (median); curl {(await curl('--version')).split()[1]}, "
              f"{os.cpu_count()} CPUs")
        widths = [max(len(r[i]) for r in rows + [("what", "envgit", "vs direct", "anchor", "")])
                  for i in range(5)]
        for r in [("what", "envgit", "vs direct", "anchor", "")] + rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        await gate.stop()
    finally:
        for p in (server, bridge):
            if p and p.returncode is None:
                p.terminate()
                await p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
    else:
        asyncio.run(main())
