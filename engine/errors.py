"""Error types the command line and the app turn into one-line messages."""


class UserError(ValueError):
    """Bad input from the user (a path, a flag, a prompt): the CLI exits with status 2."""

    exit_status = 2  # every command maps an error to the same status through this


class ModelLoadError(UserError):
    """A model or draft that cannot be loaded as given (missing files, wrong tensors)."""
