"""bench.metric_separation's table: each metric's direction comes from common.best_by, NaN reads n/a."""

from __future__ import annotations

import math

from bench.metric_separation import table


def test_table_rows_directions_and_missing_values():
    text = table("t", ["f0_rmse", "speaker_sim"], {"step": 0, "f0_rmse": 1234.56}, {"step": 9, "f0_rmse": 80.0,
                 "speaker_sim": 0.91234}, {"noise": {"f0_rmse": math.nan, "speaker_sim": 0.5}})
    lines = text.splitlines()
    assert lines[2] == "| metric | first validation (step 0) | last validation (step 9) | noise | direction |"
    assert lines[4] == "| f0_rmse | 1234.6 | 80.0 | n/a | lower is better |"
    assert lines[5] == "| speaker_sim | n/a | 0.912 | 0.500 | higher is better |"
