"""Fakes of the libraries powerd wraps (pynvml)."""
