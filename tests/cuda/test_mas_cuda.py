"""On a CUDA GPU: `maximum_path` on CUDA tensors uses the batched PyTorch MAS, gives the numba path
exactly, and never synchronises with the host (`torch.cuda.set_sync_debug_mode("error")` turns any
sync — .item(), a copy to the host, nonzero — into an error). Skipped without CUDA."""

from __future__ import annotations

import torch

from tests.cuda.conftest import CUDA_ONLY
from tests.tts.test_alignment_torch import random_batch
from tts.alignment import maximum_path, maximum_path_numba

pytestmark = CUDA_ONLY


def test_cuda_mas_matches_numba_without_a_host_sync():
    g = torch.Generator().manual_seed(11)
    batches = [random_batch(g, ties=i % 2 == 1) for i in range(12)]
    batches.append((torch.randn(16, 120, 400, generator=g), torch.ones(16, 120, 400)))  # a training-sized batch
    for value, mask in batches:
        expected = maximum_path_numba(value, mask)
        value, mask = value.cuda(), mask.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            path = maximum_path(value, mask)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert path.device == value.device and path.dtype == value.dtype
        assert torch.equal(path.cpu(), expected)
