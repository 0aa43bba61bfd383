"""common.prepared: a damaged prepared file is one line naming it (also when raised in a DataLoader worker
process), and the checks a preparation uses to make a damaged output again."""

from __future__ import annotations

import json
import multiprocessing
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from common import exit_codes
from common.data import make_loader
from common.prepared import (
    PreparedFileError,
    load_npy,
    npy_problem,
    npz_problem,
    read_json,
    require_finite,
)
from tests.damage import damage

REMEDY = "prepare it again"


@pytest.mark.parametrize("how", ["truncate", "garbage", "delete"])
@pytest.mark.parametrize("mmap", [False, True])
def test_a_damaged_npy_is_one_line_naming_it(tmp_path, how, mmap):
    path = tmp_path / "mel.npy"
    np.save(path, np.zeros((40, 8), np.float32))
    damage(path, how)
    with pytest.raises(PreparedFileError) as e:
        load_npy(path, REMEDY, mmap=mmap)
    message = str(e.value)
    assert message.startswith(f"prepared file {path} ") and message.endswith(f": {REMEDY}") and "\n" not in message
    assert ("is missing" if how == "delete" else "is damaged") in message
    assert npy_problem(path) is not None


def test_shape_and_non_finite_values_are_named(tmp_path):
    path = tmp_path / "mel.npy"
    np.save(path, np.zeros((40, 8), np.float32))
    assert npy_problem(path, (40, 8)) is None and npy_problem(path, (None, 8)) is None
    assert npy_problem(path, (None, 80)) == "has shape [40, 8], expected [any, 80]"
    with pytest.raises(PreparedFileError, match=r"has shape \[40, 8\], expected \[any, 80\]"):
        load_npy(path, REMEDY, shape=(None, 80))
    bad = np.zeros((40, 8), np.float32)
    bad[3, 2] = np.nan
    np.save(path, bad)
    assert npy_problem(path) == "holds NaN or infinite values"
    with pytest.raises(PreparedFileError, match="holds NaN or infinite values: prepare it again"):
        require_finite(load_npy(path, REMEDY, mmap=True)[:5], path, REMEDY)


def test_npz_and_json_checks(tmp_path):
    npz = tmp_path / "x.npz"
    np.savez(npz, mel=np.zeros((4, 3), np.float32))
    assert npz_problem(npz, {"mel": (4, None)}) is None
    assert npz_problem(npz, {"mel": None, "f0": None}) == "is damaged (it lacks f0)"
    damage(npz, "truncate")
    assert npz_problem(npz, {"mel": None}).startswith("is damaged")
    manifest = tmp_path / "speakers.json"
    manifest.write_text(json.dumps({"a": 0}))
    assert read_json(manifest, REMEDY) == {"a": 0}
    for content in (b"\x82\x00garbage", b"{not json", b"[1, 2]"):
        manifest.write_bytes(content)
        with pytest.raises(PreparedFileError, match=f"prepared file {manifest} is damaged .*: {REMEDY}$"):
            read_json(manifest, REMEDY)


class _Damaged(Dataset):
    def __init__(self, path):
        self.path = path

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return torch.from_numpy(np.array(load_npy(self.path, REMEDY)))


def test_the_error_comes_through_loader_workers_as_its_one_line_and_the_exit_does_not_wait_for_them(tmp_path, capsys):
    """A DataLoader re-creates a worker's error from its traceback text; the trainer still prints one line,
    and the workers (which ignore SIGTERM) are stopped, so the process can exit."""
    path = tmp_path / "spec.npy"
    path.write_bytes(b"garbage")
    loader = make_loader(_Damaged(path), batch_size=2, num_workers=2)

    def body() -> int:
        next(iter(loader))
        return 0

    assert exit_codes.run_main(body, (PreparedFileError,)) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"error: prepared file {path} is damaged") and err.count("\n") == 1
    assert "Traceback" not in err and "worker" not in err
    deadline = time.time() + 10
    while multiprocessing.active_children() and time.time() < deadline:
        time.sleep(0.05)
    assert not [c for c in multiprocessing.active_children() if c.daemon]
