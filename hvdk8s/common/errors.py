"""The one exception type the CLI turns into a clean message and exit code 2."""


class UserError(Exception):
    """Bad input the user can fix: the message names the field, file or flag."""
