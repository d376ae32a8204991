"""The session daemon: one per project, started on demand by `envgit run`, exits when idle.

It owns everything heavy (the policy parser, the journal writer, the snapshotter, the proxy);
clients speak to it over `.envgit/daemon.sock` in length-prefixed marshal frames: a 4-byte
big-endian length, then a marshal dump of a dict of plain values (client.py says why; frames.py
bounds them before they are decoded). The inner socket a sandbox reaches speaks JSON instead.
Import `envgit.daemon.client` from the hot path: it is standard library only."""
