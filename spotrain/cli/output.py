"""What every command prints with: lines written at once (a boot script or a pipe reads them
as they come), and JSON for scripts."""

from __future__ import annotations

import json
import math
from typing import Any


def say(message: str) -> None:
    print(message, flush=True)


def json_text(document: Any) -> str:
    """JSON without the non-standard Infinity: a time or interval that never comes is null."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(document), indent=1, allow_nan=False)
