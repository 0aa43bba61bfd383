"""`python -m common.check` (and `make check`): print the hardware report before a long run.

Exit status 0 whenever the report could be made, GPU or not: a CPU-only machine is a valid
setup for tests and the demo, and the report itself says what is missing.
"""

from __future__ import annotations

import sys

from common.hardware import hardware_report


def main() -> int:
    print(hardware_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
