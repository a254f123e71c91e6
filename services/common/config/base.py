"""The base of every section, and a helper the sections share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


def _non_default(section: BaseModel) -> list[str]:
    return [k for k, f in type(section).model_fields.items() if getattr(section, k) != f.default]
