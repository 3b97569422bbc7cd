"""The one exception type for mistakes a user can fix.

The CLI prints a UserError as a single line and exits non-zero; anything else is a bug in this
project and keeps its traceback (shown with --debug)."""


class UserError(Exception):
    """Bad input, a missing artifact or an environment problem, with what to do about it; `param`: the
    request field it is about, where it came over HTTP."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class Interrupted(UserError):
    """A long stage was stopped by a signal after saving what it needs to resume. The process exits
    128 + the signal's number, the shell's convention (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum
