"""The read models and renderers the porcelain (commands/) and its other faces (`envgit ui`,
`envgit export`, the agent launchers) share: how a step, an agent, a session, a time and a
command line are named (names.py), a step's diff as files and unified text (diffs.py), which
contents are withheld (secrets.py), what they ask of the daemon and the journal (requests.py),
and how an operational failure is said (errors.py).

A floor below commands/, ui/, export/ and agents/: it imports none of them, so each of those
can use it without importing another face of envgit.
"""
