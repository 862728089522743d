"""The error every planner input reader raises, and reading an input file's text with it.

Profiles, mixes, cap sweeps and non-GPU terms files all report bad input as a
:class:`ProfileError` that names the file and, where there is one, the line.
"""

from __future__ import annotations

from pathlib import Path


class ProfileError(ValueError):
    """Bad planner input. The message names the file and, where there is one, the line.

    ``line`` is 1-based as an editor shows it (for a CSV the header is line 1).
    """

    def __init__(self, source: str | Path, problem: str, line: int | None = None) -> None:
        self.source = str(source)
        self.line = line
        self.problem = problem
        where = self.source if line is None else f"{self.source}:{line}"
        super().__init__(f"{where}: {problem}")


def read_input_text(path: str | Path, what: str = "", kind: str = "text") -> str:
    """A planner input file's text (UTF-8, a byte-order mark dropped), or a ProfileError.

    ``what`` names the input in the message ("the mix"); ``kind`` the format ("TOML").
    """
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        reading = f"cannot read {what}".rstrip()
        raise ProfileError(path, f"{reading}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ProfileError(path, f"not a UTF-8 {kind} file") from None
