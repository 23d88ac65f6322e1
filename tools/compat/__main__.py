"""python -m tools.compat (see tools/compat/README.md)."""
import sys
import traceback

from .cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(2)
