"""`envgit doctor`: every piece envgit needs from this machine, with the fix when it is missing."""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


# What `envgit <agent>` can promise, per agent (docs/AGENTS.md has the detail).
AGENTS = [
    ("codex", "enforced: envgit is its exec-server, every command and file operation a sandboxed step"),
    ("claude", "enforced: Claude runs inside the sandbox (file tools under its mounts, all traffic "
               "through the gate), every Bash call a sandboxed step of its own"),
    ("copilot", "recorded and routed as far as hooks allow, not enforced: bash calls rewritten into "
                "envgit steps, its own file tools and traffic outside the sandbox"),
]


def _apt(pkg):
    return f"apt-get install -y {pkg}" if os.geteuid() == 0 else f"sudo apt-get install -y {pkg}"


def checkout() -> str | None:
    """The source checkout envgit runs from (an editable install made by dev/run), or None
    when it was installed as a package (pipx, pip): the fixes differ."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return top if os.path.isfile(os.path.join(top, "dev", "run")) and \
        os.path.isfile(os.path.join(top, "pyproject.toml")) else None


def _landlock() -> bool:
    """Steps run with Landlock on this host (sandbox/backend.py): what bwrap needs is missing,
    and the weaker backend stands in."""
    from .sandbox import backend
    return backend.host_is_landlock()


def _sandbox_check() -> list[Check]:
    """Which sandbox steps get here, and, for Landlock, what is weaker (backend.WEAKER)."""
    from .sandbox import backend
    try:
        which = backend.current()
    except RuntimeError as e:
        return [Check("sandbox", False, str(e), "allow user namespaces (the checks below), or use "
                      "Linux 6.7+ with Landlock enabled")]
    if which == backend.BWRAP:
        return [Check("sandbox", True, "steps run in bubblewrap's namespaces")]
    return [Check("sandbox", True, "steps run with Landlock + seccomp (degraded: "
                  + "; ".join(backend.weaker()) + ")",
                  "for the full sandbox, allow user namespaces (the checks below); an organisation "
                  "policy's `degraded_sandbox: forbid` refuses steps here", required=False)]


def _python_fix() -> str:
    if checkout():
        return "install Python >= 3.12 (apt-get install python3.12, or pyenv) and re-run dev/run"
    return ("install Python >= 3.12 (apt-get install python3.12, or pyenv), then reinstall envgit "
            "with it: pipx reinstall --python python3.12 envgit")


def _agent_fix(agent) -> str:
    from .agents.install import PINNED
    package, version = PINNED[agent]
    return (f"optional: npm install -g {package}@{version} (the version envgit is tested with), "
            f"or set ENVGIT_{agent.upper()}_BIN to its path")


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def run_checks() -> list[Check]:
    out = []
    from . import __version__
    top = checkout()
    out.append(Check("envgit", True, f"{__version__}, " + (f"a checkout at {top} (dev/run installs it)" if top
                     else f"installed as a package in {sys.prefix}"), required=False))
    v = sys.version_info
    out.append(Check("python", v >= (3, 12), f"{sys.version.split()[0]} ({sys.executable})", _python_fix()))
    from .sandbox.launch import LaunchError, trusted_binary
    try:
        bwrap = trusted_binary("bwrap")      # as every sandbox finds it: never from PATH
    except LaunchError as e:
        bwrap = None
        out.append(Check("bubblewrap", False, str(e), _apt("bubblewrap")))
    if bwrap:
        ver = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
        m = re.search(r"(\d+)\.(\d+)", ver)
        new_enough = m is not None and (int(m.group(1)), int(m.group(2))) >= (0, 8)
        out.append(Check("bubblewrap", new_enough, f"{ver} at {bwrap}",
                         "envgit needs bubblewrap >= 0.8 (--disable-userns): " + _apt("bubblewrap")))
        r = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/",
                            "--dev", "/dev", "--proc", "/proc", "true"], capture_output=True, text=True)
        out.append(Check("namespaces", r.returncode == 0,
                         "bwrap can create user, pid, net, ipc, uts and cgroup namespaces"
                         if r.returncode == 0 else f"bwrap failed: {r.stderr.strip()}",
                         "see the user-namespace checks below", required=r.returncode == 0 or not _landlock()))
    out += _sandbox_check()
    clone = _read("/proc/sys/kernel/unprivileged_userns_clone")
    if clone is not None:
        out.append(Check("kernel.unprivileged_userns_clone", clone == "1", clone,
                         "sysctl -w kernel.unprivileged_userns_clone=1 (and persist it in /etc/sysctl.d/)"))
    maxns = _read("/proc/sys/user/max_user_namespaces")
    if maxns is not None:
        out.append(Check("user.max_user_namespaces", maxns != "0", maxns,
                         "sysctl -w user.max_user_namespaces=15000", required=not _landlock()))
    aa = _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if aa is not None:
        out.append(Check("kernel.apparmor_restrict_unprivileged_userns", aa == "0" or os.geteuid() == 0, aa,
                         "Ubuntu 24.04+: add an AppArmor profile allowing userns for bwrap, or "
                         "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"))
    for tool, pkg, why in (("socat", "socat", "the in-sandbox bridge to the proxy"),
                           ("git", "git", "git itself"),
                           ("perl", "perl-base", "every step's exit-status reporter (sandbox/launch.py)")):
        if tool in ("socat", "git", "perl"):    # as envgit finds them: never from PATH
            try:
                path = trusted_binary(tool)
            except LaunchError:
                path = None
        else:
            path = shutil.which(tool)
        out.append(Check(tool, bool(path), path or f"not found ({why})", _apt(pkg)))
    tiocsti = _read("/proc/sys/dev/tty/legacy_tiocsti")
    if tiocsti is not None:
        out.append(Check("dev.tty.legacy_tiocsti", True,
                         f"{tiocsti}; envgit's seccomp filter refuses TIOCSTI either way", required=False))
    for agent, level in AGENTS:
        path = os.environ.get(f"ENVGIT_{agent.upper()}_BIN") or shutil.which(agent)
        out.append(Check(f"agent {agent}", bool(path), f"{path or 'not found'}: {level}",
                         _agent_fix(agent), required=False))
    state = _state_dir()
    if state:
        ok = os.access(state, os.W_OK)
        out.append(Check("state dir", ok, state, f"make {state} writable by {os.getuid()}"))
    out += credential_checks()
    out += vm_checks()
    return out


def vm_checks() -> list[Check]:
    """The VM tier (backend: vm): QEMU, the guest image, and KVM or TCG (TCG said with its cost)."""
    from .vm import image, qemu
    out = []
    q = qemu.qemu_binary()
    out.append(Check("vm qemu", bool(q), q or "qemu-system-x86_64 not found (only backend: vm needs it)",
                     _apt("qemu-system-x86"), required=False))
    accel, why = qemu.accel_choice()
    if accel == "kvm":
        out.append(Check("vm accel", True, f"KVM ({why})", required=False))
    elif accel == "tcg":
        out.append(Check("vm accel", False, f"TCG, QEMU's CPU emulator: about 40x slower than the host "
                         f"inside the guest, boot ~5-20 s once per machine, then a kept booted guest "
                         f"restored in ~1 s ({why})",
                         "a host with working KVM (/dev/kvm that is not nested kvm-pvm)", required=False))
    else:
        out.append(Check("vm accel", True, "/dev/kvm opens: the first VM boot tries KVM once", required=False))
    mke2fs = shutil.which("mke2fs", path="/usr/sbin:/sbin:/usr/bin:/bin")
    out.append(Check("vm mke2fs", bool(mke2fs), mke2fs or "mke2fs not found: the VM tier writes the "
                     "guest's tool drive with it (only backend: vm needs it)", _apt("e2fsprogs"),
                     required=False))
    try:
        root = image.cache_root()
        built = [e for e in os.listdir(root) if image.Image(os.path.join(root, e)).ok()]
    except OSError:
        built = []
    kept = sum(1 for e in built for k in _listdir(os.path.join(image.cache_root(), e)) if k.startswith("booted-"))
    out.append(Check("vm image", bool(built), f"{len(built)} built under {image.cache_root()}, {kept} booted "
                     "guest(s) kept (a fresh start restores one instead of booting)" if built
                     else "not built yet: the first step with backend: vm builds it from Debian "
                          "packages (apt-get download, ~30 s)", required=False))
    return out


def _listdir(p):
    try:
        return os.listdir(p)
    except OSError:
        return []


def credential_checks() -> list[Check]:
    """Each credential of the project's policy: does its source resolve here (this shell's
    environment, as a session this shell starts would read it)? Never its value."""
    from .credentials.source import CredentialError, read, require_botocore
    from .paths import NoProject, find_project
    from .policy import PolicyError, load_policy
    try:
        pol = load_policy(find_project().policy)
    except (NoProject, PolicyError, OSError):
        return []
    out = []
    for name, cred in pol.credentials.items():
        (kind, where), = cred["from"].items()
        try:
            read(name, cred["from"], policy=pol)
            if kind == "profile":
                require_botocore()
            out.append(Check(f"credential {name}", True, f"{kind} {where!r} resolves (value not "
                             f"shown); sent only to {', '.join(cred['hosts'])}", required=False))
        except CredentialError as e:
            out.append(Check(f"credential {name}", False, str(e),
                             f"make credentials.{name}.from in envgit.yaml resolve", required=False))
    return out


def _state_dir():
    from .paths import NoProject, find_project
    try:
        return find_project().state
    except NoProject:
        return None
