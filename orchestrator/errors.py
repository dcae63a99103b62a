"""Errors a user can act on. The CLI prints them as one line; anything else is a bug."""


class HetspecError(Exception):
    """Base class: a problem with the input or the environment, not with hetspec."""


class CheckpointError(HetspecError):
    """A model path that does not exist, is not a supported format, or is corrupt."""


class InvalidRequestError(HetspecError, ValueError):
    """A request or frame that cannot be served (empty prompt, too long, bad params).

    `field` names the offending field when the caller knows it: the service layer sends it
    to clients as machine-readable status metadata beside the one-line message.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ExportError(HetspecError):
    """Drafter export failed."""


class ProfileError(HetspecError):
    """A placement profile that is malformed, or that cannot run on this machine."""
