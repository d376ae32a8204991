"""Credentials kept outside the sandbox (policy `credentials:`).

A step sees a placeholder per credential and session (placeholder.py), shaped so its client
accepts it, in the variables and git/npm settings the clients read (sandbox/environ.py). The
daemon reads the real value from its source on the host (source.py) only when the gate swaps
it into an allowed request to one of the credential's hosts (proxy/credentials.py). A
placeholder seen going anywhere else is denied and marks the step `credential-misuse`.
"""
