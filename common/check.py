"""`python -m common.check` (and `make check`): print the hardware report before a long run.

Exit status 0 whenever the report could be made, GPU or not: a CPU-only machine is a valid
setup for tests and the demo, and the report itself says what is missing.
"""

from __future__ import annotations

import sys

from common import exit_codes
from common.hardware import hardware_report, preset_name
from common.presets import PRESET_CHOICES, preset_summary


def main() -> int:
    return exit_codes.run_main(report)


def report() -> int:
    """The hardware report and the preset `auto` picks; `main` runs it through `common.exit_codes.run_main`."""
    print(hardware_report())
    print(f"Presets     --preset {{{','.join(PRESET_CHOICES)}}} on every trainer; auto picks here:")
    for line in preset_summary(preset_name("auto", say=lambda _line: None)):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
