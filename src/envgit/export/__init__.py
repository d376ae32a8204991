"""What envgit hands to others: one self-contained record per step (records.py) and a static
HTML report a reviewer opens without envgit (html.py)."""
