"""The agent versions envgit is tested against, and installing them from npm into a directory.

The adapters speak to seams that move between releases (Codex's exec-server protocol is
marked experimental), so the tests pin these versions; `install(prefix)` is what the tests
and a person setting up a machine call: `python -m envgit.agents.install DIR`."""

import fcntl
import os
import shutil
import subprocess
import sys

PINNED = {
    "codex": ("@openai/codex", "0.171.0"),
    "claude": ("@anthropic-ai/claude-code", "2.1.332"),
    "copilot": ("@github/copilot", "1.0.102"),
}

INSTALL_TIMEOUT_S = 900


class InstallError(Exception):
    pass


def binary(prefix: str, agent: str) -> str:
    return os.path.join(prefix, "node_modules", ".bin", agent)


def installed_version(prefix: str, agent: str) -> str | None:
    import json
    package, _ = PINNED[agent]
    try:
        with open(os.path.join(prefix, "node_modules", package, "package.json")) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def install(prefix: str, agents=tuple(PINNED)) -> dict[str, str]:
    """{agent: path of its executable}, installing the pinned versions that are absent.
    Two installs into one prefix at once (two launches, tests side by side) take turns: npm
    writing one node_modules twice at once leaves it broken."""
    os.makedirs(prefix, exist_ok=True)
    with open(os.path.join(prefix, ".envgit-install.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install(prefix, agents)


def _install(prefix: str, agents) -> dict[str, str]:
    missing = [a for a in agents if installed_version(prefix, a) != PINNED[a][1]
               or not os.access(binary(prefix, a), os.X_OK)]
    if missing:
        npm = shutil.which("npm")
        if npm is None:
            raise InstallError("npm is not installed")
        # Every pinned agent at once, saved in the prefix's package.json: npm prunes packages
        # a later install does not name, so installing one at a time would drop the others.
        specs = [f"{pkg}@{ver}" for pkg, ver in PINNED.values()]
        try:
            r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--save-exact",
                                "--prefix", prefix, *specs],
                               capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise InstallError(f"npm install {' '.join(specs)} took over {INSTALL_TIMEOUT_S} s") from None
        if r.returncode != 0:
            raise InstallError(f"npm install {' '.join(specs)} failed:\n{r.stderr[-2000:]}")
    out = {}
    for a in agents:
        path = binary(prefix, a)
        if not os.access(path, os.X_OK):
            raise InstallError(f"{PINNED[a][0]}@{PINNED[a][1]} installed no `{a}` executable")
        out[a] = path
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m envgit.agents.install DIR", file=sys.stderr)
        sys.exit(2)
    for name, path in install(sys.argv[1]).items():
        print(f"{name} {PINNED[name][1]} {path}")
