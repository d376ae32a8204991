"""The gate listens before mitmproxy has started (proxy/gate.py `listen`, daemon/steps.py
`start_gate`): a connection made meanwhile waits and is then served; if the start fails, or
the gate stops first, it is closed, never left hanging. The real gate on a unix socket."""

import asyncio

import pytest

from envgit.proxy import Gate


async def ask(step, q):
    return "deny", "test", "test"


def gate(tmp_path):
    return Gate(lambda: None, tmp_path / "state", {}, lambda s, r: None, ask)


async def request(path) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n")
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(200), 30)
    finally:
        writer.close()


def test_a_connection_made_before_the_start_waits_and_is_served(tmp_path):
    async def go():
        g = gate(tmp_path)
        await g.listen()
        pending = asyncio.ensure_future(request(g.socket_path))
        await asyncio.sleep(0.3)
        assert not pending.done()               # listening, not yet serving
        await g.start()
        answer = await pending
        await g.stop()
        return answer
    # no proxy credentials: the gate's Steps addon answers 407, which proves mitmproxy served it
    assert asyncio.run(go()).startswith(b"HTTP/1.1 407")


@pytest.mark.parametrize("how", ["start fails", "stopped first"])
def test_a_waiting_connection_is_closed_when_the_gate_does_not_start(tmp_path, how):
    async def go():
        g = gate(tmp_path)
        await g.listen()
        pending = asyncio.ensure_future(request(g.socket_path))
        await asyncio.sleep(0.3)
        if how == "start fails":
            async def broken(tcp_port):
                raise RuntimeError("no")
            g._start = broken
            with pytest.raises(RuntimeError):
                await g.start()
        else:
            await g.stop()
        return await pending
    assert asyncio.run(go()) == b""             # closed at once, nothing served
