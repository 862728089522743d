"""The capping and phase-inference rules (policies/)."""
