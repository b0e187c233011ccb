"""The base class of every generated contract model (hand-written, imported by generated code).

``datamodel-code-generator`` renders a field that may be *missing* but is not ``nullable`` as
``T | None = None``, which would also accept an explicit ``null``. The DSL says ``null`` is valid
only where ``nullable``, so the exported schema marks such fields with ``x-accord-not-null`` (it
reaches the model as ``json_schema_extra``) and :class:`ContractModel` refuses an explicit
``None`` for them before field validation. Everything else (strict types, ``extra="forbid"``,
defaults only when missing) is plain pydantic.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["NOT_NULL_KEY", "ContractModel"]

NOT_NULL_KEY = "x-accord-not-null"


class ContractModel(BaseModel):
    """Strict, closed, and exact about ``null``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_only_where_nullable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, info in cls.model_fields.items():
                extra = info.json_schema_extra
                if not isinstance(extra, dict) or not extra.get(NOT_NULL_KEY):
                    continue
                key = info.alias or name
                if key in data and data[key] is None:
                    raise ValueError(f"{key}: null is not allowed (the field is not nullable)")
        return data
