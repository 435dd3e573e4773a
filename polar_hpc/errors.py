"""`ConfigError`: bad user input. The CLI prints its message and exits with code 2, no traceback.

A module of its own at the bottom, so processes that never read a config file (the proxy) raise it
without importing the YAML and pydantic machinery."""


class ConfigError(Exception):
    """Bad user input; the CLI prints it and exits with code 2."""
