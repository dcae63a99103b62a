"""The one error type of the protocol: a block or message that does not fit, naming the field."""


class BlockError(ValueError):
    """A block, descriptor or transfer was rejected; `field` is the offending field's path."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
