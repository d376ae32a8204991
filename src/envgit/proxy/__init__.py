"""The network gate: mitmproxy, embedded in the session daemon's event loop, with envgit's
addons (one job each: flowstate.py) asking envgit.policy.network about every connection and
request.

    gate = Gate(get_policy, state_dir, resolve, record, ask, upstream_ca=None, ask_timeout=120)
    await gate.start()              # listens on state_dir/"proxy.sock"; start(tcp_port=0): also TCP
    cred = gate.open_step(step_id)  # "user:password" for the step's Proxy-Authorization
    gate.close_step(step_id)
    gate.ca_cert_path               # the session CA's certificate (PEM)
    gate.ca_bundle_dir()            # certs dir for the sandbox's /etc/ssl/certs
    await gate.stop()

Importing this package imports mitmproxy (about half a second): the daemon only.
"""

from .gate import Gate, resolve_from_env, upstream_ca_from_env

__all__ = ["Gate", "resolve_from_env", "upstream_ca_from_env"]
