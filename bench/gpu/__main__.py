"""`python -m bench.gpu [--out DIR] [--dry-run] [--budget-minutes 8] [--compile-minutes 2.5] [--sections a,b]`:
the GPU check (bench/gpu/check.py), with the arguments `python -m bench.gpu_check` took before it became a
package."""

from bench.gpu.check import main

if __name__ == "__main__":
    raise SystemExit(main())
