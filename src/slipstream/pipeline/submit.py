"""The script ``spark-submit`` runs: ``spark-submit [--master URL] <this file> --input DIR --output DIR``.

spark-submit executes a file as ``__main__``, where relative imports do not work; this file imports
the package absolutely and hands over to :func:`slipstream.pipeline.run.main`. ``SUBMIT_SCRIPT`` is
its path, for scripts that build the command.
"""

from __future__ import annotations

import sys
from pathlib import Path

SUBMIT_SCRIPT = str(Path(__file__).resolve())


def main() -> int:
    """Run the report with this process's arguments."""
    from slipstream.pipeline.run import main as run_main

    return run_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
