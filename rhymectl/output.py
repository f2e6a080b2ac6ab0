"""Where output goes: results on stdout (one JSON object with --json), logs on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

log = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
