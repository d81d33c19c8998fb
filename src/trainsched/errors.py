"""The one exception type for user errors.

Anything the user can fix (a malformed file, an unknown name, an impossible size, a model that
does not fit) raises :class:`TrainschedError` with a message that says what was wrong and how to
fix it. The CLI prints that message on one line and exits with status 2. Internal invariants use
``assert`` instead.
"""


class TrainschedError(Exception):
    """A problem with the user's input, explained in the message."""
