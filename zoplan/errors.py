"""The project's user-facing error type.

Anything a user can cause (bad file, unknown model, layout that does not fit) raises
ZoError with the numbers in the message. The CLIs catch it, print one red line and exit
with code 2. `assert` is kept for programmer errors only.
"""

EXIT_USER_ERROR = 2


class ZoError(Exception):
    """A problem the user can fix; the message is shown as one line."""
