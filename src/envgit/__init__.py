"""envgit: version control for the environment an AI coding agent works in."""

__version__ = "0.1.0"
