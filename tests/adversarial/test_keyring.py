"""Class 6: the caller's kernel keyring.

bwrap joins a fresh session keyring, but keys are reached by serial number (/proc/keys lists
them), and a key whose owner is the step's own uid (host root for a root step, the person
otherwise) grants it the key's user permissions: without more, a step reads the caller's
keys and adds keys to the caller's keyrings. The keyring system calls are refused (seccomp).
The oracles: a canary in a key planted outside, and a key the step would plant in the
caller's user keyring, looked for outside afterwards.
"""

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "a key whose owner is the step's own uid (host root for a root step, the person otherwise) grants "
    "that uid the key's permissions: the caller's keys must be out of reach for both")

PY = "/usr/bin/python3"

# plant: outside, a key with the canary in the caller's user keyring (@u), readable by its
# user; prints its serial and the keyring's. steal: inside, read the key by serial and add a
# key to the caller's keyring and to the step's own. planted: outside, is the step's key
# there. clean: outside, unlink both.
KEYS = r'''
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sc = libc.syscall
sc.restype = ctypes.c_long
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[__import__("os").uname().machine]
USER_KEYRING = ctypes.c_int(-4)
cmd = sys.argv[1]
if cmd == "plant":
    k = sc(ADD_KEY, b"user", b"envgit-canary", sys.argv[2].encode(), len(sys.argv[2]), USER_KEYRING)
    sc(KEYCTL, 5, k, 0x3f3f0000)                                  # SETPERM: possessor, user: all
    print(k, sc(KEYCTL, 0, USER_KEYRING, 1))                      # GET_KEYRING_ID @u
elif cmd == "steal":
    k, u = int(sys.argv[2]), int(sys.argv[3])
    buf = ctypes.create_string_buffer(512)
    n = sc(KEYCTL, 11, k, buf, 512)                               # READ
    print("read", n, buf.raw[:max(n, 0)].decode(errors="replace"))
    n = sc(KEYCTL, 6, k, buf, 512)                                # DESCRIBE
    print("describe", n, buf.raw[:max(n, 0)].decode(errors="replace"))
    print("into-caller", sc(ADD_KEY, b"user", b"envgit-planted", b"x", 1, ctypes.c_long(u)))
    print("into-own", sc(ADD_KEY, b"user", b"envgit-own", b"x", 1, ctypes.c_int(-3)))
    open("keyring-step-ran", "w").close()
elif cmd == "planted":
    print(sc(KEYCTL, 10, USER_KEYRING, b"user", b"envgit-planted", 0))    # SEARCH: serial or -1
elif cmd == "clean":
    for d in (b"envgit-canary", b"envgit-planted"):
        k = sc(KEYCTL, 10, USER_KEYRING, b"user", d, 0)
        if k > 0:
            sc(KEYCTL, 9, k, USER_KEYRING)                        # UNLINK
'''


def test_the_callers_keys_are_out_of_reach(attacker):
    (attacker.root / "keys.py").write_text(KEYS)
    attacker.own(attacker.root / "keys.py")
    try:
        out = attacker.host(f"{PY} keys.py plant {CANARY}")
        key, keyring = out.stdout.split()
        assert int(key) > 0 and int(keyring) > 0, out.stdout + out.stderr
        # the oracle works: outside, the person's own process does read the key
        assert CANARY in attacker.host(f"{PY} keys.py steal {key} {keyring}").stdout
        assert attacker.host(f"{PY} keys.py planted").stdout.strip() != "-1"
        attacker.host(f"{PY} keys.py clean; rm keyring-step-ran")
        assert attacker.host(f"{PY} keys.py planted").stdout.strip() == "-1"
        key, keyring = attacker.host(f"{PY} keys.py plant {CANARY}").stdout.split()

        r = attacker.envgit("run", "--", PY, "keys.py", "steal", key, keyring)
        assert r.returncode == 0, r.stderr
        assert (attacker.root / "keyring-step-ran").exists()           # the step itself ran
        assert CANARY not in r.stdout + r.stderr
        assert "envgit-canary" not in r.stdout                          # not even its description
        lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines())
        assert lines["into-caller"].strip() == "-1" and lines["into-own"].strip() == "-1"
        assert attacker.host(f"{PY} keys.py planted").stdout.strip() == "-1"
    finally:
        attacker.host(f"{PY} keys.py clean")
