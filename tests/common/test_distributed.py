"""common.distributed outside a process group."""

from common.distributed import any_rank


def test_any_rank_single_process():
    assert any_rank(True) is True and any_rank(False) is False


def test_ddp_falls_back_to_gloo_where_torch_has_no_nccl(monkeypatch):
    """Windows' torch has no NCCL: a multi-GPU run there must start on gloo, not fail in init_process_group."""
    import torch.distributed as dist

    from common.distributed import pick_backend

    assert pick_backend(False) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert pick_backend(True) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert pick_backend(True) == "nccl"
