"""What stops a job: `JobConfigError`, raised before any record runs.

A record's own trouble never stops a job: it is that record's error line (the kinds of
`structspec.jobs.lines.ERROR_KINDS`).
"""

from __future__ import annotations


class JobConfigError(Exception):
    """A job that cannot start: unknown schema, unreadable input, bad template, an output that is not a job's.
    Says what to fix."""
