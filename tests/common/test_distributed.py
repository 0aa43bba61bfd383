"""common.distributed outside a process group."""

from common.distributed import any_rank


def test_any_rank_single_process():
    assert any_rank(True) is True and any_rank(False) is False
