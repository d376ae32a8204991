"""Red team 12: the notice after a step ("tried to reach X, not in network.allow; to allow it,
make line N read: ...") must not be a way for a step to have the person allow what envgit
otherwise keeps out on purpose.

network.py: "IP literals, `localhost`, and the cloud metadata names are reachable only when an
entry names them exactly". The resolver records any dotted name a step asks for, and
netadvice.wanted_hosts keeps any dotted name of [a-z0-9-_.]: a step that sends one raw DNS
query for the cloud metadata name, the metadata IP or the host's loopback (no real client
resolves an IP literal through DNS) gets envgit to print the exact line that allows it.
Oracle: the notice on stderr.
"""


ASK = r'''
import socket, struct, sys
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(3)
for name in sys.argv[1:]:
    body = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0\x00\x01\x00\x01"
    c.sendto(struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + body, ("127.0.0.1", 53))
    print(c.recv(512)[3] & 15)
'''

GUARDED = ["metadata.google.internal", "instance-data.ec2.internal", "metadata.azure.internal",
           "169.254.169.254", "127.0.0.1", "127.1", "10.0.0.1"]


def _notice(attacker, names):
    attacker.write_policy("version: 1\nnetwork:\n  allow: []\n")
    script = attacker.root / "ask.py"
    script.write_text(ASK)
    attacker.own(script)
    r = attacker.envgit("run", "--", "python3", "ask.py", *names, timeout=60)
    assert r.stdout.split() == ["3"] * len(names), r.stdout + r.stderr
    return [line for line in r.stderr.splitlines() if "network.allow" in line]


def test_the_notice_never_offers_a_cloud_metadata_or_loopback_host(attacker):
    said = "\n".join(_notice(attacker, GUARDED + ["pypi.example.org"]))
    for host in GUARDED:
        assert f'"{host}"' not in said, f"envgit suggests allowing {host}: {said}"


def test_a_step_asking_only_for_the_metadata_name_gets_no_line_to_paste(attacker):
    said = _notice(attacker, ["metadata.google.internal"])
    assert not any("metadata.google.internal" in s and "allow" in s for s in said), said


def test_the_gates_denial_notice_never_offers_the_metadata_service(attacker):
    """The same through the gate (the network on, the step asking the proxy itself): the
    denial of the metadata address and name is said with the line that allows them."""
    attacker.write_policy('version: 1\nnetwork:\n  allow: ["example.org"]\n')
    r = attacker.run("curl -s -m 5 -p http://169.254.169.254/latest/meta-data/ -o /dev/null; "
                     "curl -s -m 5 http://metadata.google.internal/computeMetadata/v1/ -o /dev/null; true",
                     timeout=60)
    said = "\n".join(line for line in r.stderr.splitlines() if "network.allow" in line)
    for host in ("169.254.169.254", "metadata.google.internal"):
        assert f'"{host}"' not in said, f"envgit suggests allowing {host}: {said}"
