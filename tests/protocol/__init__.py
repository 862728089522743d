"""The wire protocol and the one vocabulary (powerd/protocol.py, powerd/vocabulary.py)."""
