"""The one exception type a user sees.

Anything the user can fix (a bad file, a bad parameter, a missing model) is raised as a
``UserError`` whose message names the problem and the fix in one line. The CLI prints it
without a traceback and exits with code 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input, files or environment, with a one-line fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
