"""Issue 14: an agent's sandbox has the session's inner control socket at
/run/envgit/control.sock. While another step's request waits for a person, code in that
sandbox sends forged `answer` ops (with `remember`), `grants` and `grant-revoke` over it, in
its own framing. The oracle: the waiting request never reaches the server, no grant exists."""

import json
import shutil
import sys
import threading

import pytest

from gatekit import hostport, netproject
from kit.agentsandbox import AGENT_SANDBOX

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

FORGE = r'''
import json, socket, time
replies = []
end = time.time() + 6
while time.time() < end:
    for n in range(1, 4):
        for msg in ({"op": "answer", "id": n, "answer": "allow", "uid": 0, "how": "ui",
                     "remember": {"path": "/**", "for_s": 2592000}},
                    {"op": "grants"}, {"op": "grant-revoke", "id": "g1"}):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect("/run/envgit/control.sock")
            body = json.dumps(msg).encode()
            s.sendall(len(body).to_bytes(4, "big") + body)
            size = int.from_bytes(s.recv(4), "big")
            replies.append(json.loads(s.recv(size)).get("error", "NO ERROR")[:60])
            s.close()
    time.sleep(0.5)
print("FORGED", sorted(set(replies)))
'''



def test_forged_answers_over_the_inner_socket_make_no_grant(attacker, gate_servers):
    git, stub = gate_servers
    netproject(attacker, git, stub,
               "irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
               "    action: ask\n    name: api-write\n")
    attacker.write_policy((attacker.root / "envgit.yaml").read_text().replace("ask_timeout: 20", "ask_timeout: 8"))
    (attacker.root / "forge.py").write_text(FORGE)
    (attacker.root / "agent.py").write_text(AGENT_SANDBOX)
    attacker.own(attacker.root / "forge.py", attacker.root / "agent.py")
    api = hostport(stub, "stub.example.test")
    waiting = {}

    def step():   # a step whose request waits for a person nobody is
        waiting["r"] = attacker.run(f"curl -s -o /dev/null -w '%{{http_code}}' -X POST --data-binary x "
                                    f"https://{api}/api/one", timeout=120)
    t = threading.Thread(target=step)
    t.start()
    for _ in range(100):                  # until the question is pending
        if json.loads(attacker.envgit("pending", "--json").stdout or "[]"):
            break
        threading.Event().wait(0.1)
    forged = attacker.host(f"{sys.executable} agent.py {attacker.root} agent-forge {{}} forge.py", timeout=120)
    t.join(120)
    assert "FORGED" in forged.stdout, forged.stdout + forged.stderr
    assert "NO ERROR" not in forged.stdout and "offers run, record, m" in forged.stdout, forged.stdout
    assert waiting["r"].stdout == "403", waiting["r"].stdout + waiting["r"].stderr
    assert not [q for q in stub.requests if q["method"] == "POST"]              # the oracle
    assert json.loads(attacker.envgit("grants", "--all", "--json", check=True).stdout) == []
    shown = json.loads(attacker.envgit("log", "--json", check=True).stdout)
    asked = [a for s in shown for a in s["approvals"]]
    assert [(a["answer"], a["who"]) for a in asked] == [("deny", "timeout")], asked
