"""``python -m powerd.cli``, as ``python -m powerd``."""

from powerd.cli import main

main()
