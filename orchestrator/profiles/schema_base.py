"""What every profile section shares: strict types and unknown keys refused by name."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

PositiveInt = Annotated[int, Field(gt=0)]


class Section(BaseModel):
    """Strict types (YAML `"4"` is not 4), unknown keys named with the allowed ones."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(f"unknown key {key!r} (allowed: {', '.join(cls.model_fields)})")
        return data
