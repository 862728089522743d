"""The core installed alone at its minimum pins (tests/support/lean_install.py)."""
