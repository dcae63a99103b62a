"""Errors a user can act on. The CLI prints them as one line; anything else is a bug."""

class HetspecError(Exception):
    """Base class: a problem with the input or the environment, not with hetspec."""


class CheckpointError(HetspecError):
    """A model path that does not exist, is not a supported format, or is corrupt."""


class InvalidRequestError(HetspecError):
    """A generation request that cannot be served (empty prompt, too long, bad params)."""


class ExportError(HetspecError):
    """Drafter export failed."""


class ProfileError(HetspecError):
    """A placement profile that is malformed, or that cannot run on this machine."""
