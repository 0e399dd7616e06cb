"""Exceptions raised by tallmh for bad input.

Each one subclasses :class:`ValueError`, so ``except ValueError`` keeps working, and each message names
the problem (which leaf, which argument, which value) rather than failing later inside compiled code.
"""


class TallmhError(ValueError):
    """Base class of tallmh's input errors."""


class DataError(TallmhError):
    """The data pytree is unusable: mismatched leading lengths, empty, non-finite values, ..."""


class ModelError(TallmhError):
    """The model misbehaves at the initial point: wrong shape, non-finite log prior or likelihood."""


class ConfigError(TallmhError):
    """An option of a test, proposal or run is out of its valid range."""


class TrustWarning(UserWarning):
    """A run's own evidence says its answer should not be trusted (R-hat, ESS, audit, normal approximation, support)."""


class Stopped(KeyboardInterrupt):
    """A termination signal (SIGTERM, SIGHUP) turned into an interrupt, so that a run stops the way Ctrl-C
    stops it (the draws made so far kept); ``signum`` is the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


class DataChanged(DataError):
    """A data file changed (size or modification time) while a run read it; ``result`` holds the draws made
    before the change was seen (a partial :class:`~tallmh.reporting.results.Result`, also in the checkpoint if any)."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class CLIError(Exception):
    """A problem with the command line or the environment of the ``tallmh`` command, reported in one line
    (exit status 2; not a :class:`ValueError`, unlike the input errors above)."""
