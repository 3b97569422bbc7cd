"""The one exception type for mistakes a user can fix.

The CLI prints a UserError as a single line and exits non-zero; anything else is a bug in this
project and keeps its traceback (shown with --debug)."""


class UserError(Exception):
    """Bad input, a missing artifact or an environment problem, with what to do about it."""


class Interrupted(UserError):
    """A long stage was stopped by a signal after saving what it needs to resume."""
