"""The errors of the data layer, each a one-line message that the command line prints as a refusal
(exit status 2, like a configuration problem).

  DataError        input data the run cannot use: a malformed file, an empty split, a damaged cache
                   (defined in `sparse_runner.checks`, which the rest of the runner also raises);
  DataFormatError  a data file (or hub dataset) without the expected layout; the message names the file
                   and line;
  DataUnavailable  the data could not be obtained (hub unreachable and not cached, a package registry
                   out of reach); the message says what to do instead.
"""

from __future__ import annotations

from sparse_runner.checks import DataError

__all__ = ["DataError", "DataFormatError", "DataUnavailable"]


class DataFormatError(DataError):
    """A data file (or hub dataset) does not have the expected layout; the message names file and line."""


class DataUnavailable(DataError):
    """The data could not be obtained (hub unreachable and not cached); the message says what to do."""
