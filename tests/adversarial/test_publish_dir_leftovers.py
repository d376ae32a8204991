"""The directory of a step's published socket files (/run/envgit/publish inside) is the step's
to write: it leaves there a directory it made unreadable (chmod 000) and thousands of directories.
At the step's end the directory must still go, all of it (nothing of the step's is kept on the
host past its end), and its removal must not hold up the daemon: another client's requests
are answered meanwhile. Oracles: .envgit/publish/ on the host after the step, and how long the
daemon takes to answer a status request while the step ends."""

import threading
import time

import pytest

from envgit.daemon.client import connect
from envgit.paths import Project
from kit.ports import free_port as _free_port

pytestmark = pytest.mark.both_uids("a directory made unreadable by the step's uid is removed by the daemon's")

MANY = 4000


def test_what_a_step_leaves_in_its_publish_directory_goes_without_holding_the_daemon(attacker):
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    slowest = [0.0]
    stop = threading.Event()

    def ping():
        while not stop.is_set():
            t0 = time.monotonic()
            conn.request({"op": "status"})
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            time.sleep(0.05)

    script = ("cd /run/envgit/publish && mkdir -p locked/deeper && echo kept > locked/deeper/x && "
              "chmod 000 locked/deeper locked && mkdir many && cd many && "
              f"python3 -c 'import os\nfor i in range({MANY}): os.mkdir(str(i))' && touch {attacker.root}/made")
    pinger = threading.Thread(target=ping, daemon=True)
    pinger.start()
    try:
        r = attacker.envgit("run", "-p", str(_free_port()), "--", "sh", "-c", script)
    finally:
        stop.set()
        pinger.join(timeout=60)
    assert r.returncode == 0 and (attacker.root / "made").exists(), r.stderr
    published = attacker.root / ".envgit" / "publish"
    deadline = time.monotonic() + 60
    while list(published.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(published.iterdir()), list(published.rglob("*"))[:5]
    assert slowest[0] < 1.5, f"a status request waited {slowest[0]:.1f} s while the step ended"
