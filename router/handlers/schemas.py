"""Checking call_tool's parameters against the tool's input schema, before the backend is called."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from jsonschema import exceptions as schema_errors
from jsonschema.validators import validator_for

logger = logging.getLogger(__name__)


class SchemaValidators:
    """Compiled JSON Schema validators, cached by schema text (compiling costs far more than checking)."""

    def __init__(self, size: int = 2048) -> None:
        self._size = size
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def _validator(self, schema_json: str) -> Any:
        if schema_json in self._cache:
            self._cache.move_to_end(schema_json)
            return self._cache[schema_json]
        validator: Any = None
        try:
            schema = json.loads(schema_json)
            cls = validator_for(schema)
            cls.check_schema(schema)
            validator = cls(schema)
        except (ValueError, TypeError, schema_errors.SchemaError) as exc:
            # An unusable schema must not block calls: the backend still checks its own arguments.
            logger.debug("input schema not usable for validation: %s", exc)
        self._cache[schema_json] = validator
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return validator

    def problem(self, schema_json: str, parameters: Mapping[str, Any]) -> str | None:
        """What is wrong with `parameters` under the schema, naming the field; None when they fit."""
        if not schema_json:
            return None
        validator = self._validator(schema_json)
        if validator is None:
            return None
        try:
            error = schema_errors.best_match(validator.iter_errors(parameters))
        except Exception as exc:  # e.g. a $ref that does not resolve: let the backend judge
            logger.debug("input schema validation failed: %r", exc)
            return None
        if error is None:
            return None
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        message = error.message if len(error.message) <= 300 else error.message[:297] + "..."
        return f"parameters{path}: {message}"
