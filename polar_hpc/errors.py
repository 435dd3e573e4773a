"""polar-hpc's errors: one base, `PolarError`, and the kinds a user tells apart.

Every error polar-hpc raises on purpose is a `PolarError`; the CLI prints its message on one line
(no traceback) and exits with its `exit_code`:

- `ConfigError` (2): bad user input: a file, line or row, field or argument; nothing was started.
- `SubmissionError` (2): Slurm would not take the job (no `sbatch` here, sbatch refused it, a job
  of the run is still queued or running, nothing is left to resume); nothing was submitted.
- `RequestRefused` (2): a running job refused a client's request, with its reason (a
  `ConfigError`: the job judged the request bad input).
- `ChildFailed` (1): a child process exited or never became ready; the message carries its log.
- `ToolFailed` (1): a tool polar-hpc runs (skopeo, umoci, buildah, apptainer) is missing or failed.
- `WeightUpdateFailed` (1): no engine loaded the weights a client asked for.

Each room's own errors (a sandbox's, a shard's format, an engine's answer) derive from `PolarError`
with exit code 1. A module of its own at the bottom, so processes that never read a config file
(the proxy) raise these without importing the YAML and pydantic machinery."""


class PolarError(Exception):
    """An error polar-hpc raises by design; the CLI prints it and exits with `exit_code`."""

    exit_code = 1


class ConfigError(PolarError):
    """Bad user input."""

    exit_code = 2


class SubmissionError(PolarError):
    """Slurm would not take the job."""

    exit_code = 2


class RequestRefused(ConfigError):
    """A running job refused a client's request."""


class ChildFailed(PolarError):
    """A child process exited or never became ready."""


class ToolFailed(PolarError):
    """A tool polar-hpc runs is missing or failed (not the input's fault)."""


class WeightUpdateFailed(PolarError):
    """No engine loaded the weights."""
