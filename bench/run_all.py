"""`make bench`: every trainer's benchmark in one process run, one after another.

Benchmarks print ratios measured in the same run (never timed assertions in tests). Pass a
trainer name to run one: `python -m bench.run_all vae`.
"""

from __future__ import annotations

import importlib
import sys
import time

BENCHES = {
    "vocoder": "bench.bench_vocoder",
    "tts": "bench.bench_tts",
    "tts_clone": "bench.bench_clone",
    "vae": "bench.bench_vae",
    "mas": "bench.bench_mas",  # the alignment search both TTS models run inside their forward
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}", file=sys.stderr)
        return 2
    from common.hardware import hardware_report

    print(hardware_report(), flush=True)
    failed = []
    for name in names:
        print(f"\n=== bench: {name} ===", flush=True)
        start = time.perf_counter()
        try:
            importlib.import_module(BENCHES[name]).main([])
        except Exception as exc:  # noqa: BLE001 - one broken bench must not hide the others
            failed.append(name)
            print(f"bench {name} failed: {type(exc).__name__}: {exc}", flush=True)
        print(f"=== {name}: {time.perf_counter() - start:.0f} s ===", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
