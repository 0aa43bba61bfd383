"""The exit codes every script of the repo uses, so a launcher or a cluster scheduler can tell
what happened without reading the log (documented once in the README)."""

OK = 0  # training (or the script's job) completed
BAD_INPUT = 2  # bad input, config, flag or output location: fix it and run again
NON_FINITE = 3  # stopped on a streak of non-finite losses/gradients; the last good checkpoint is named
OUT_OF_MEMORY = 4  # CUDA out of memory; the message says which settings to lower
INTERRUPTED = 130  # SIGINT/SIGTERM: a checkpoint was saved first, `--resume auto` continues
