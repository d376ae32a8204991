"""A project on the VM tier for a test: a home of its own, `envgit init`, `backend: vm` with the
memory asked for, the guest image from the machine's shared cache (built once per machine)."""

import os

from conftest import Env, make_home

VM_CACHE = os.environ.get("ENVGIT_VM_CACHE") or "/var/tmp/envgit-test-vm-cache"


def vm_project(base, memory="256MiB") -> Env:
    home = make_home(base)
    root = home / "proj"
    root.mkdir()
    e = Env(home, root, {"ENVGIT_VM_CACHE": VM_CACHE, "ENVGIT_DAEMON_IDLE": "600"})
    e.envgit("init", check=True)
    with open(root / "envgit.yaml", "a") as f:
        f.write(f"backend: vm\nvm: {{ memory: {memory}, cpus: 1 }}\n")
    return e
