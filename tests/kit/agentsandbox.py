"""The agent's sandbox, built by the session daemon as an agent adapter builds it (`spec` with
`inner`, after a record-only `begin`), with a script of the test's running inside: how the
attack tests reach the inner socket from where an agent's own commands run. `AGENT_SANDBOX` is
Python source, run on the host as the person; argv: the project root, the session name, the
launcher's extra environment (JSON), the script inside (a file in the project), its arguments."""

AGENT_SANDBOX = r'''
import json, os, subprocess, sys
from envgit.daemon.client import connect
from envgit.paths import Project
from envgit.sandbox.seccomp import program
root, session, extra, script = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
conn = connect(Project(root))
helper = conn.request({"op": "begin", "argv": ["agent"], "cwd": root, "env": dict(os.environ),
                       "record_only": True, "session": session})
spec = conn.request({"op": "spec", "argv": ["/usr/bin/python3", root + "/" + script, *sys.argv[5:]],
                     "cwd": root, "env": {**os.environ, **extra}, "session": session,
                     "inner": True, "step": helper["step"]})
fd = os.memfd_create("s", 0)
os.write(fd, program())
os.lseek(fd, 0, 0)
r = subprocess.run([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                   pass_fds=[fd], capture_output=True, text=True, timeout=120)
conn.request({"op": "end", "step": helper["step"], "exit_code": r.returncode})
print(r.stdout + r.stderr)
'''
