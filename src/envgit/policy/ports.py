"""A published port as the policy (`network.publish`) and `envgit run -p` give it: PORT or
HOST_PORT:STEP_PORT (docker's -p order). Pure: sandbox/publish.py checks the rest (a port the
policy's loopback hosts already use inside) and does the publishing."""

FIRST_PORT = 1024          # net.ipv4.ip_unprivileged_port_start's default in a new namespace


class PublishError(ValueError):
    pass


def parse(value) -> tuple[int, int]:
    """(host port, step port) of 5173, "5173" or "8000:8080"; PublishError saying why not."""
    text = str(value).strip() if not isinstance(value, bool) else ""
    host, _, inside = text.rpartition(":")
    try:
        step_port = int(inside)
        host_port = int(host) if host else step_port
    except ValueError:
        raise PublishError(f"{value!r} is not a port to publish: give PORT or HOST_PORT:STEP_PORT, "
                           "e.g. 5173 or 8000:8080") from None
    for port in (host_port, step_port):
        if not 1 <= port <= 65535:
            raise PublishError(f"{value!r}: a port is a number from 1 to 65535")
    if step_port < FIRST_PORT:
        raise PublishError(f"{value!r}: a step cannot listen on port {step_port} (below "
                           f"{FIRST_PORT}, nobody in the sandbox may bind one); run the "
                           f"server on a higher port and publish that, e.g. -p {host_port}:8080")
    return host_port, step_port
