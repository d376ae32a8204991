"""What the tests share: their tiers (tiers.py), the machine-wide locks (locks.py)."""
