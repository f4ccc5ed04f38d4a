"""The program name and the one error type of ``train_gpt.py`` (shared by the modules beside it)."""

PROG = "train_gpt.py"


class CLIError(Exception):
    """A bad input: printed as one line, exit code 2, nothing written."""
