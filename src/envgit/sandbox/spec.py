"""The bwrap command line for one step under a policy. Runs in the session daemon."""

import dataclasses
import os
from dataclasses import dataclass

from ..policy import resolve
from ..policy.globs import has_magic
from . import backend, kernel, loopback, network, signing
from . import publish as pub
from .environ import cache_env, credential_env, project_cache, scrub, withhold_real_values
from .launch import LANDLOCK
from .masks import Masks, deny_origin
from .projectscan import ProjectScan
from .view import build_view

NAMESPACES = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try", "--unshare-net", "--disable-userns"]


INNER_INSIDE = "/run/envgit/control.sock"


@dataclass
class Spec:
    argv: list[str]          # bwrap … -- CMD (without --seccomp, added by the client)
    env: dict[str, str]
    masked: list[str]        # paths covered by a deny in this step's view
    denied_literal: list[str]  # every absolute deny entry without a glob, present or not
    withheld_env: list = dataclasses.field(default_factory=list)  # variables a credential's real value was taken out of
    protected: list = dataclasses.field(default_factory=list)  # read-only in the project (view.py)


def build(policy, project: str, cwd: str, argv: list[str], host_env: dict, state_dir: str,
          session_tmp: str, scan: ProjectScan, step_env: dict, net: network.Net | None = None,
          inner_socket: str | None = None, agent: dict | None = None, home: str | None = None,
          publish: tuple[str, list[int]] | None = None, masks: Masks | None = None) -> Spec:
    """`net`: the gate to reach, or None for a step with no network at all. `inner_socket`:
    the daemon's inner control socket to bind in (an agent's sandbox, whose shim asks for
    steps through it). `agent`: what an agent's own sandbox needs besides the policy, from
    its envgit adapter: {"read": [paths], "write": [paths], "protect": [paths inside those
    writable paths that stay read-only], "env": {name: value}}; the policy's denies still
    cover them. `home`: the home whose view the step gets, when not `host_env`'s HOME (a
    step asked for from inside an agent's sandbox: its session's, never the request's).
    `publish`: (the host directory of the socket files, the step ports) of the ports the
    step publishes (publish.py). `masks`: where the placeholders of the denied paths are made
    (masks.py; the daemon watches them), else a directory of the state's own."""
    home = os.path.normpath(home or host_env.get("HOME") or os.path.expanduser("~"))
    landlock = backend.current() == backend.LANDLOCK
    if landlock:
        if net is not None and not net.tcp_port:
            net = None          # no network namespace, and no gate port to reach instead
        session_tmp = os.path.realpath(session_tmp)
    rules = resolve(policy, project, home)
    agent = agent or {}
    if agent.get("read") or agent.get("write") or agent.get("protect"):
        def extra(key):
            return tuple((os.path.normpath(p), "agent") for p in agent.get(key, []))
        rules = dataclasses.replace(rules, allow_abs=rules.allow_abs + extra("read"),
                                    write_abs=rules.write_abs + extra("write"),
                                    protect_abs=rules.protect_abs + extra("protect"))
    # The home view is read-only: package caches go to the project's own cache directory
    # (environ.py: kept between sessions), or to the step's /tmp when it has none.
    cache = project_cache(project, state_dir)
    if masks is None:
        masks = Masks(os.path.join(state_dir, "sandbox", "masks", "unwatched"))
    view = build_view(rules, state_dir, session_tmp, scan, masks, deny_origin(policy), cache)
    view.args = kernel.without_host_proc(view.args)
    # /proc and /sys read-only or masked, and (as root) the host files only root can read: after
    # the view, whose `--proc /proc` they cover.
    kargs, kmasked = kernel.mounts(view.args, state_dir, [rules.project] + [p for p, _ in rules.write_abs]
                                   + ([cache] if cache else []),
                                   [p for p, _ in rules.allow_abs], view.masked)
    view.args += kargs
    view.masked += kmasked
    ours = {"HOME": home, "TMPDIR": "/tmp", **step_env, **agent.get("env", {})}
    if publish is not None and publish[1]:
        view.args += pub.mounts(publish[0])
        argv = pub.wrap(argv, publish[1])
    if net is not None and landlock:       # the gate's port; its trust directory by its own name
        view.args += ["--ro-bind", net.certs_dir, net.certs_dir]
        ours.update(network.environment(net))
        ours["ENVGIT_LANDLOCK_PORT"] = str(net.tcp_port)     # landlock_run.py's one TCP port
    elif net is not None:
        view.args += network.mounts(net)
        ours.update(network.environment(net))
        argv = network.wrap(loopback.wrap(argv, loopback.forwards(policy.network_allow), net.credential))
    if inner_socket is not None:
        view.args += ["--dir", "/run/envgit", "--ro-bind", inner_socket, INNER_INSIDE]
        ours["ENVGIT_INNER_SOCKET"] = INNER_INSIDE
    offline = network.OFFLINE_ENV if net is None else {}     # fail at once, no retries
    env = scrub(host_env, policy.env_pass, {**cache_env(cache), **offline, **policy.env_set}, ours)
    if net is not None and getattr(policy, "signing", None):  # commits signed by the gate (signing.py)
        public = signing.public_key(signing.key_path(policy.signing))
        if public:
            env.update(signing.git_environment(env, public))
    withheld = withhold_real_values(policy, env, host_env)   # a real value passed in under another name
    env.update(credential_env(policy, env, session_tmp))      # placeholders only; the gate swaps real values
    # As root bwrap keeps the capabilities of the new user namespace, and with them
    # CAP_DAC_OVERRIDE would read the mode-000 masks: drop them all.
    caps = ["--cap-drop", "ALL"] if os.geteuid() == 0 else []
    literal = [p for p, _ in rules.deny_abs if not has_magic(p)]
    if landlock:
        pointed = landlock_environment(view.args, state_dir, session_tmp)
        env.update(pointed)
        shown = [a for k in ("GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL") for a in ("--ro-bind", pointed[k], pointed[k])]
        ll = [LANDLOCK, *caps, "--die-with-parent", *view.args, *shown, "--chdir", cwd, "--", *argv]
        return Spec(ll, env, view.masked, literal, withheld, view.protected)
    bw = ["bwrap", *NAMESPACES, *caps, "--die-with-parent", "--hostname", "envgit",
          *view.args, "--chdir", cwd, "--", *argv]
    return Spec(bw, env, view.masked, literal, withheld, view.protected)


def landlock_environment(view_args, state_dir, session_tmp) -> dict:
    """Where the Landlock backend cannot show a path as another (landlock_run.py), the program
    is pointed at the other path instead: the step's own tmp directory, and git's sanitised
    configs (git refuses to run when a config file it looks for is unreadable, as the hidden
    originals are; an empty file stands in for one the view does not show)."""
    shown = {view_args[i + 2]: view_args[i + 1] for i, a in enumerate(view_args[:-2]) if a == "--ro-bind"}
    from .view import _empty_config
    empty = _empty_config(state_dir)
    home_cfg = [src for dst, src in shown.items() if dst.endswith("/.gitconfig")]
    return {"TMPDIR": session_tmp,
            "GIT_CONFIG_SYSTEM": shown.get("/etc/gitconfig", empty),
            "GIT_CONFIG_GLOBAL": home_cfg[0] if home_cfg else empty}
