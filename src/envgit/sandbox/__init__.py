"""The sandbox: what a step can see, write and reach.

Two entry points, one per side of the daemon socket:
  spec.build(...)     the bwrap command line and environment (daemon: needs the policy)
  seccomp.program()   the seccomp filter the client hands to bwrap (standard library only)
This __init__ imports nothing, so the client's import of seccomp stays light."""
