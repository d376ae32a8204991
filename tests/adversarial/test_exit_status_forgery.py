"""Red team 12: the exit status `envgit run` reports and records is the command's own.

The reporter (launch.py REPORTER, perl, "envgit-step") is the command's parent inside the
sandbox and writes the command's raw wait status to a pipe that `envgit run` reads (64 bytes,
`raw.strip().isdigit()`). The reporter runs as the step's own uid in the step's own pid
namespace, so any process of the step can open /proc/<reporter>/fd/<report fd> (a pipe:
opening it through /proc gives a new writable end) and write a status of its choosing first.
Oracle: `envgit run`'s exit code and the journal's `exit` for a command that exits 3.
"""

import json

import pytest

pytestmark = pytest.mark.both_uids(
    "a step reaches its reporter's pipe through /proc/PID/fd, which the kernel allows by uid (ptrace "
    "access): a root step is uid 0 with its capabilities dropped, a non-root user's step is in a user "
    "namespace: the forgery must fail for both")

# Every pipe the reporter (our parent) holds gets "0\n" padded to the 64 bytes envgit reads:
# the reporter's own "768\n" then comes after what is read, and is never seen.
FORGE_ZERO = r'''
for f in /proc/$PPID/fd/[3-9] /proc/$PPID/fd/[1-9][0-9]; do
  case $(readlink "$f") in pipe:*) printf '0\n%62s' '' > "$f" 2>/dev/null && echo forged >&2;; esac
done
exit 3
'''

# A grandchild does it (a test's helper, a package's install script): the command itself
# failed and says so with its own exit code.
FORGE_FROM_CHILD = r'''
reporter=$PPID
sh -c 'for f in /proc/'"$reporter"'/fd/[3-9] /proc/'"$reporter"'/fd/[1-9][0-9]; do
  case $(readlink "$f") in pipe:*) printf "0\n%62s" "" > "$f" 2>/dev/null;; esac
done'
exit 7
'''

# A "signal" forged: 9 is SIGKILL's raw status, so envgit would say 137 / killed.
FORGE_SIGNAL = r'''
for f in /proc/$PPID/fd/[3-9] /proc/$PPID/fd/[1-9][0-9]; do
  case $(readlink "$f") in pipe:*) printf '9\n%62s' '' > "$f" 2>/dev/null;; esac
done
exit 0
'''


def _recorded_exit(attacker):
    return json.loads(attacker.envgit("show", "last", "--json").stdout).get("exit_code")


def test_a_step_cannot_forge_its_own_exit_status(attacker):
    r = attacker.run(FORGE_ZERO)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert _recorded_exit(attacker) == 3


def test_a_steps_child_cannot_turn_a_failure_into_success(attacker):
    r = attacker.run(FORGE_FROM_CHILD)
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert _recorded_exit(attacker) == 7


def test_a_step_cannot_forge_a_signal_death(attacker):
    r = attacker.run(FORGE_SIGNAL)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert _recorded_exit(attacker) == 0
