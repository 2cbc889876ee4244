"""Error types that map onto the CLI's exit codes (2 = bad usage, 1 = runtime failure)."""


class ConfigError(ValueError):
    """Invalid user input: unknown name, out-of-range value, missing data folder, malformed YAML.

    The CLI prints the message as one line and exits with code 2. Messages must name the field and
    what is allowed, e.g. ``train.epochs: must be an integer >= 1, got 0``.
    """


class RunFailure(RuntimeError):
    """A run that started and then failed (the CLI exits with code 1)."""
