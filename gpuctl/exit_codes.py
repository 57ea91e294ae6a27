"""Exit codes of every `gpuctl` verb (documented in README.md)."""

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of `gpuctl` verbs, for scripts and cron.

    OK: done. FAILURE: an unexpected internal error. USAGE: bad flags or arguments. CONFIG: the
    fleet config (or a theme/state file) is invalid. NOTHING_TO_DO: nothing matched (no free slice
    to move). PARTIAL: a change applied on some nodes, not all (the output says which). CONFLICT:
    a stale generation, a leased slice, or a refused confirmation. UNREACHABLE: a node needed for
    the verb could not be reached. LEASE_REVOKED: `gpuctl run`'s lease was revoked by a reassignment
    (CMD was ended). INTERRUPTED: Ctrl-C.
    """

    OK = 0
    FAILURE = 1
    USAGE = 2
    CONFIG = 3
    NOTHING_TO_DO = 4
    PARTIAL = 5
    CONFLICT = 6
    UNREACHABLE = 7
    LEASE_REVOKED = 8
    INTERRUPTED = 130
