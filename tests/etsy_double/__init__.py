"""A test double of Etsy's Open API v3 (tests only): :mod:`.app` serves it, :mod:`.spec` reads
the vendored part of Etsy's OpenAPI document it validates against. Nothing outside ``tests/``
uses it, and it pretends to be Etsy only to the connector under test."""
