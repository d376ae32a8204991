"""What the gate's addons share: the keys of `flow.metadata`, and what the gate knows of one
client connection (`Conn`).

The addons run in this order in one mitmproxy master (gate.py, `Gate.start`); mitmproxy calls
each event on each of them in turn. What one addon finds out about a flow it puts in
flow.metadata under one of the keys below, for the addons after it and for the flow's later
events; none reaches into another addon.

  Steps           steps.py        which step a connection belongs to (proxy auth; 407 if none)
  Judge           judge.py        policy.network's decision: deny, ask or allow; the record made
  Record          record.py       bytes counted both ways; the record sent when the flow ends
  CredentialSwap  credentials.py  placeholders looked for on requests, real values swapped in
  EchoGuard       echoguard.py    real values in answers go back to the step as placeholders

Each key, and the addon that sets it:
"""

import time
from dataclasses import dataclass, field
from typing import Protocol

STEP = "envgit.step"            # Steps: the step (int) the request belongs to
CONN = "envgit.conn"            # Steps: the client connection's Conn
RECORD = "envgit.record"        # Judge (CredentialSwap's misuse denials update it): the request's
                                # journal record (a dict), emitted and removed by Record at its end
JUDGED = "envgit.judged"        # Judge, or CredentialSwap denying before it: the request is judged
                                # (mitmproxy runs `request` again at the end of a body streamed on)
JUDGED_AS = "envgit.judged_as"  # Judge: the Request it judged (record.py reads its facts from it)
ANSWERED = "envgit.answered"    # Judge, CredentialSwap: the gate answered the request itself (a
                                # denial, a 502): no server body to count or look at
COUNTED = "envgit.counted"      # Record: the request's bytes are counted (its second `request`)
CREDENTIALS = "envgit.credentials"  # CredentialSwap.requestheaders: the names of the credentials
                                # whose placeholders a covered request carries, swapped in `request`
LOOKED_S = "envgit.looked_s"    # CredentialSwap: seconds spent looking in requestheaders (swap_us)
SWAPPED = "envgit.swapped"      # CredentialSwap: swapped in already (the second `request`)
PARTIAL = "envgit.partial"      # bodies.py: the body was judged on its first BODY_CAP bytes
CUT = "envgit.cut"              # Judge, CredentialSwap: chunk -> why the request is cut off there,
                                # or "" (bodies.py shows it each chunk of a body streamed on)
ON_BODY = "envgit.on_body"      # EchoGuard: flow -> None, a buffered response's look, called by
                                # Record.response before the record is made


class Counter(Protocol):
    """The client side of a connection as the gate accepted it (gate.Counted)."""
    up: int                                   # bytes read from the client
    down: int                                 # bytes written to it

    def hold(self) -> None: ...               # read nothing more from the client until release()
    def release(self) -> None: ...
    def close(self) -> None: ...              # close the client's socket


@dataclass
class Conn:
    """What the gate knows about one client connection (made by Gate when it accepts it)."""
    step: int | None = None
    connect: tuple[str, int] | None = None   # the CONNECT target
    tunnelled: bool = False
    started: float = field(default_factory=time.time)
    counter: Counter | None = None            # the socket, counted (gate.Counted)
    # Judge: the tunnel was opened by learn mode (policy/learn.py `lesson`): intercepted, and
    # recorded at its end if no request was seen inside it
    learned: dict | None = None
    requests: int = 0                         # Judge: requests seen inside the tunnel
