"""The local HTTPS git server and stubs live in the package (the demo serves its remote with
them); the tests import them from here."""

from envgit.localhttps import GitServer, HTTPSServer, TestCA  # noqa: F401
