"""Domain errors. Each carries the field at fault and a hint that says how to fix it.

They are turned into a command-line message (exit code 2) or an HTTP problem document in exactly
one place each; library code only raises them.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of every error the planner raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.hint:
            end = "" if text.rstrip().endswith((".", "!", "?")) else "."
            text += f"{end} To fix: {self.hint}"
        return text


class ProblemError(PlannerError, ValueError):
    """The input does not describe a valid problem (a field is missing, of the wrong type or out of range)."""


class InfeasibleError(PlannerError):
    """The input is valid but no plan can satisfy it (e.g. a sample does not fit in memory on every rank)."""


class VerificationError(PlannerError):
    """A plan breaks an invariant of its problem."""
