"""Config texts for the agent's and the controller's config tests."""

from __future__ import annotations

import re
from pathlib import Path


def with_broker_files(tmp_path: Path, text: str) -> str:
    """``text`` with its broker files (/etc/powerd/...) made in ``tmp_path``: they must
    exist when the config loads (issue 12, point 6)."""

    def made(match: re.Match[str]) -> str:
        path = tmp_path / match[2]
        path.write_text("x\n")
        return f'{match[1]}"{path}"'

    pattern = r'^((?:# )?(?:password|ca|cert|key)_file = )"/etc/powerd/([^"]+)"'
    return re.sub(pattern, made, text, flags=re.M)
