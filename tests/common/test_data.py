import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from common.data import BucketBatchSampler, ResumableSampler, make_loader, sample_rng


class Keys(Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, key):
        index, rng = sample_rng(key)
        return torch.tensor([index, int(rng.integers(1 << 30))])


def test_sampler_shards_and_resumes_mid_epoch():
    ranks = [ResumableSampler(Keys(), seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    for s in ranks:
        s.set_epoch(4)
    a, b = (list(s) for s in ranks)
    assert {k[0] for k in a} | {k[0] for k in b} == set(range(23))
    s = ranks[0]
    s.set_epoch(4)
    s.skip_samples(5)
    assert list(s) == a[5:]
    assert list(s) == a  # skip applies to one iteration only
    s.set_epoch(5)
    assert [k[0] for k in s] != [k[0] for k in a]


def test_sample_rng_is_per_key_and_loader_with_workers_is_reproducible():
    _, r1 = sample_rng((3, 0, 1))
    _, r2 = sample_rng((3, 0, 2))
    assert r1.integers(1 << 30) != r2.integers(1 << 30)
    assert sample_rng(5)[1].integers(100) == sample_rng(5)[1].integers(100)

    def batches(workers):
        s = ResumableSampler(Keys(), seed=1)
        s.set_epoch(2)
        return torch.cat(list(make_loader(Keys(), batch_size=4, sampler=s, num_workers=workers)))

    state = torch.get_rng_state()
    assert torch.equal(batches(0), batches(2))
    assert torch.equal(state, torch.get_rng_state())  # the loader did not consume the global RNG


class SignalDispositions(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, key):
        import signal

        return torch.tensor([signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                             signal.getsignal(signal.SIGTERM) is signal.SIG_IGN])


def test_loader_workers_leave_ctrl_c_and_sigterm_to_the_trainer():
    """A terminal's Ctrl-C reaches every process of the group: a worker must not die under the trainer
    (or run its handler) while the trainer finishes the step and saves."""
    (batch,) = make_loader(SignalDispositions(), batch_size=2, num_workers=1)
    assert batch.all()


def test_bucket_sampler_groups_lengths_and_resumes():
    lengths = np.random.default_rng(0).integers(10, 500, size=101)
    s = BucketBatchSampler(lengths, batch_size=8, num_buckets=5, seed=2, num_replicas=2, rank=0)
    s.set_epoch(1)
    batches = list(s)
    other = BucketBatchSampler(lengths, batch_size=8, num_buckets=5, seed=2, num_replicas=2, rank=1)
    other.set_epoch(1)
    assert len(batches) == len(list(other))  # equal count per rank (no DDP deadlock)
    spread = [np.ptp(lengths[[k[0] for k in b]]) for b in batches]
    assert np.mean(spread) < 0.5 * np.ptp(lengths)  # batches are length-homogeneous
    s.skip_batches(3)
    assert list(s) == batches[3:]
    with pytest.raises(ValueError):
        BucketBatchSampler([], batch_size=2)


def test_too_few_batches_for_the_ranks_is_one_config_line_naming_batch_size():
    """6 items at batch 4 with drop_last make 1 batch: 2 processes cannot each get one (a DDP run would
    deadlock at the epoch's end). A ConfigError (exit 2, one line), not a bare ValueError traceback."""
    from common.errors import ConfigError

    sampler = BucketBatchSampler([10] * 6, batch_size=4, num_buckets=1, num_replicas=2, rank=0, drop_last=True)
    with pytest.raises(ConfigError, match=r"batch_size 4: 6 training items make 1 batch\(es\) an epoch, fewer than the 2"):
        list(sampler)


def test_frame_budget_batches_hold_the_budget_cover_the_epoch_and_resume():
    """max_frames: every batch's items, padded to their bucket's longest rounded up to frame_multiple,
    hold at most max_frames frames (an item over the budget alone); without drop_last each item comes
    once an epoch; the same (seed, epoch) gives the same batches; skip_batches continues exactly; ranks
    get equal counts, the same every epoch."""
    lengths = np.random.default_rng(1).integers(20, 900, size=97)
    lengths[5] = 3000  # longer than the whole budget: a batch of its own

    def sampler(**kw):
        return BucketBatchSampler(lengths, batch_size=16, num_buckets=6, seed=7, max_frames=2000, frame_multiple=16,
                                  **kw)

    s = sampler()
    s.set_epoch(3)
    batches = [[k[0] for k in b] for b in s]
    assert sorted(i for b in batches for i in b) == list(range(97))
    padded = {i: -(-int(lengths[bucket].max()) // 16) * 16 for bucket in s.buckets for i in bucket}
    assert all(len(b) * padded[b[0]] <= 2000 or len(b) == 1 for b in batches)
    assert [5] in batches and max(len(b) for b in batches) > 2  # short buckets still batch several
    again = sampler()
    again.set_epoch(3)
    assert [[k[0] for k in b] for b in again] == batches
    again.set_epoch(3)
    again.skip_batches(4)
    assert [[k[0] for k in b] for b in again] == batches[4:]
    ranks = [sampler(num_replicas=3, rank=r, drop_last=True) for r in range(3)]
    counts = set()
    for epoch in (0, 1):
        for r in ranks:
            r.set_epoch(epoch)
            counts.add(len(list(r)))
    assert len(counts) == 1  # equal on every rank, and in every epoch (steps_per_epoch)
