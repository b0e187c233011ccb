"""Small message contracts that exercise every feature of the DSL, for tests of any binding.

:func:`scan_request` has every field type, nested objects, arrays of objects, nullable and
default-bearing fields (including nullable with a default, and required with a default), limits,
formats, units, sensitive fields at the top level, inside an object and inside array items, and
a declared tolerance for fields a newer version adds. Built directly from the frozen model, so
tests do not depend on the YAML loader.
"""

from __future__ import annotations

from accord.contracts.model import FieldSpec, MessageContract, Tolerance

__all__ = ["plain_note", "scan_request"]


def scan_request() -> MessageContract:
    view = FieldSpec(
        type="object",
        fields={
            "angle": FieldSpec(type="number", required=True, minimum=0, maximum=360, unit="deg"),
            "label": FieldSpec(type="string", nullable=True, max_length=32),
            "token": FieldSpec(type="string", sensitive=True),
            "zoom": FieldSpec(type="number", default=1.0, exclusive_minimum=0),
        },
    )
    return MessageContract(
        name="scan-request",
        wire_version=3,
        owner="testing",
        description="A request touching every feature of the contract DSL.",
        max_bytes=4096,
        payload={
            "modelId": FieldSpec(type="string", required=True, pattern="^[A-Za-z0-9_-]{1,64}$"),
            "secret": FieldSpec(type="string", required=True, sensitive=True, min_length=4),
            "objectKey": FieldSpec(type="string", format="object-key"),
            "requestedAt": FieldSpec(type="string", format="date-time"),
            "mode": FieldSpec(type="string", required=True, enum=("fast", "full"), default="fast"),
            "quality": FieldSpec(type="integer", minimum=1, maximum=10, default=5, multiple_of=1),
            "note": FieldSpec(type="string", nullable=True, default=None, max_length=64),
            "retries": FieldSpec(type="integer", nullable=True, minimum=0, maximum=5),
            "colour": FieldSpec(type="string", nullable=True, enum=("red", "blue")),
            "tags": FieldSpec(
                type="array",
                items=FieldSpec(type="string", min_length=1, max_length=16),
                max_items=4,
                default=(),
            ),
            "views": FieldSpec(type="array", items=view, min_items=1, max_items=8),
            "options": FieldSpec(
                type="object",
                fields={
                    "lights": FieldSpec(type="boolean", default=True),
                    "credentials": FieldSpec(
                        type="object",
                        sensitive=True,
                        fields={"user": FieldSpec(type="string", required=True)},
                    ),
                    "scale": FieldSpec(type="number", required=True, minimum=0.001, unit="m"),
                },
            ),
            "extras": FieldSpec(type="object", description="free-form annotations"),
            "legacy": FieldSpec(type="boolean", deprecated=True),
        },
        tolerates=(Tolerance(version=4, fields=("hint", "views[].tilt", "options.shadow")),),
    )


def plain_note() -> MessageContract:
    """The smallest useful contract: no defaults, nothing sensitive."""
    return MessageContract(
        name="plain-note",
        wire_version=1,
        owner="testing",
        payload={
            "text": FieldSpec(type="string", required=True, max_length=280),
            "count": FieldSpec(type="integer", minimum=0),
        },
    )
