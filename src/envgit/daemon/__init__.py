"""The session daemon: one per project, started on demand by `envgit run`, exits when idle.

It owns everything heavy (the policy parser, the journal writer, the snapshotter, the proxy);
clients speak to it over `.envgit/daemon.sock` with JSON lines (see protocol in server.py).
Import `envgit.daemon.client` from the hot path: it is standard library only."""
