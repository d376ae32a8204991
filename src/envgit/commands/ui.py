"""ui: the session as a page in a browser (src/envgit/ui/), served on 127.0.0.1 only."""

import os
import sys

from ..paths import find_project
from . import Usage, command, json_flag, out

HOST = "127.0.0.1"


def add_parsers(sub, argparse):
    s = command(sub, "ui", help="the session as a page: timeline, steps, asks and rewinds in a browser",
                example=["envgit ui", "envgit ui --port 8377 --no-open"],
                usage="envgit ui [--port N] [--no-open] [--json]",
                description="Serve the project's journal on 127.0.0.1 and print a URL carrying a random\n"
                            "token (without it every request is refused). The page reads the journal\n"
                            "and the snapshot store read-only; answers and rewinds go through the\n"
                            "session daemon like the CLI's. Ctrl-C stops it.")
    s.add_argument("--port", type=_port(argparse), default=0, metavar="N",
                   help="the port to listen on (default: a free one)")
    s.add_argument("--no-open", action="store_true", help="do not open a browser")
    json_flag(s)
    s.set_defaults(fn=cmd_ui)


def _port(argparse):
    def port(text):
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise argparse.ArgumentTypeError(f"{text!r}: give a port number, 1 to 65535")
        return int(text)
    return port


def cmd_ui(args):
    import secrets
    import socket

    from ..extras import need
    need("ui")                          # before the socket: a missing extra is said, nothing bound
    project = find_project()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((HOST, args.port))
    except OSError as e:
        sock.close()
        raise Usage(f"cannot listen on {HOST}:{args.port}: {e.strerror}; pick another --port "
                    "or leave it out (a free one is chosen)") from None
    sock.listen(64)
    sock.set_inheritable(False)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    import uvicorn

    from ..ui.app import make_app
    app = make_app(project, token, HOST, port)
    url = f"http://{HOST}:{port}/?token={token}"
    if args.json:
        out({"url": url, "host": HOST, "port": port, "pid": os.getpid(), "project": project.root})
    else:
        print(f"envgit ui: {url}\n(the token in it is the key to this page; Ctrl-C stops it)")
    sys.stdout.flush()
    import shutil
    import tempfile
    # The redirect page's directory is made here and removed in the finally, so a Ctrl-C that
    # lands while the browser starts (webbrowser waits for a command-line browser) leaves nothing.
    page_dir = None if args.no_open else tempfile.mkdtemp(prefix="envgit-ui-")   # mode 0700
    try:
        if page_dir:
            _open_browser(url, page_dir)
        # No access log: every request line carries the token.
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2, server_header=False)
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:       # before uvicorn took SIGINT over: a stop like any other
        pass
    finally:
        if page_dir:
            shutil.rmtree(page_dir, ignore_errors=True)
    return 0


def _open_browser(url: str, d: str) -> None:
    """Open the page in the person's browser without the token on its command line (which
    every local user can read in /proc): the browser is handed a file in `d` (a directory of
    the person's only) that redirects to the URL."""
    import html
    import webbrowser
    path = os.path.join(d, "open.html")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(url)}">'
                f'<a href="{html.escape(url)}">envgit ui</a>\n')
    try:
        webbrowser.open("file://" + path)
    except Exception:               # no browser here: the URL printed above is the way in
        pass
