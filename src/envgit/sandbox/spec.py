"""The bwrap command line for one step under a policy. Runs in the session daemon."""

import dataclasses
import os
from dataclasses import dataclass

from ..policy import resolve
from ..policy.globs import has_magic
from . import kernel, loopback, network, signing
from . import publish as pub
from .environ import cache_env, credential_env, project_cache, scrub, withhold_real_values
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
    if net is not None:
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
    bw = ["bwrap", *NAMESPACES, *caps, "--die-with-parent", "--hostname", "envgit",
          *view.args, "--chdir", cwd, "--", *argv]
    literal = [p for p, _ in rules.deny_abs if not has_magic(p)]
    return Spec(bw, env, view.masked, literal, withheld, view.protected)
