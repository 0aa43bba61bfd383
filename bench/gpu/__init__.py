"""The user-facing GPU check (`make gpu-check` = `shell/gpu_check.sh` = `python -m bench.gpu`): everything this
repository claims about CUDA, measured in one run on one GPU. `check.py` holds the run and its report; the
other modules are its sections and the trainers they drive (see check.py's docstring for which is which).

Kept as one package so the check's files sit together, apart from the benchmarks around it in bench/. Importing
the package imports nothing else: `python -m bench.gpu.row` (one measurement in a process of its own) stays light.
"""
