"""A step between its begin and its end, as the session daemon holds it (`Session.live`, step
id -> LiveStep): written by server.py's `begin` (a sandboxed step, a record-only one) and
`vm_begin`, added to by inner.py (the stderr of an inner step's caller, its process) and by
the gate's callbacks while the step runs (its requests, the denials said), read by `end`."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LiveStep:
    argv: list[str]
    policy: Any                     # the policy the step began under (policy.Policy)
    conn: Any                       # its client's connection (pushes go there), None for inner.py's
    routes: dict                    # the escape routes fingerprinted before it (sandbox/routes.py)
    tree_before: str | None         # the last tree when it began (takeback.py brings paths back to it)
    masked: list[str] = field(default_factory=list)    # denied paths its sandbox masks
    home: str = ""                  # its HOME ("" for a record-only step: no sandbox)
    tmp: str | None = None          # its own /tmp, removed after it (None: none of its own)
    vm: bool = False                # run in the project's microVM (backend: vm)
    protected: list[str] = field(default_factory=list)  # backend vm: paths it may not write
    requests: list[dict] = field(default_factory=list)  # its network requests, as the gate recorded them
    said: set = field(default_factory=set)   # denials already said on its stderr (said once a step)
    stderr_fd: int | None = None    # an inner step's caller's stderr (inner.py): notices go there
    proc: Any = None                # an inner step's process (inner.py)
    published: Any = None           # the ports it publishes, listened for on the host (publish.py)
    agent_session: bool = False     # an agent's own (marked agent-session): its hosts advised exactly
    learn: bool = False             # runs in learn mode (daemon/learn.py, policy/learn.py)
    denied_reads: dict = field(default_factory=dict)  # path -> {path, rule, where}: placeholders it opened (denials.py)
    session: str = ""               # the session it belongs to (`envgit learn off --session` ends its learn mode)
