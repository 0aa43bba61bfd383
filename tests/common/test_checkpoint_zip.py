"""`common.checkpoint`: a zip whose index declares more than the file holds (issue 38, item 5) is refused
from the index alone, before `testzip` inflates it and before `torch.load` allocates its records; the
files torch.save writes (stored records) and torch's legacy non-zip format load as before."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from common.checkpoint import CheckpointError, damage, load_checkpoint, verify_checkpoint


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


STATE = {"trainer": "vae", "models": {"vae": {"w": torch.arange(64, dtype=torch.float32)}}}


@pytest.fixture
def nothing_inflated(monkeypatch):
    """Fails the test if a record is inflated (testzip) or the file reaches torch.load."""
    def refuse(*a, **k):
        raise AssertionError("read past the zip index")

    monkeypatch.setattr(zipfile.ZipFile, "testzip", refuse)
    monkeypatch.setattr(torch, "load", refuse)


def test_a_deflated_checkpoint_is_refused_from_its_index(tmp_path, nothing_inflated):
    path = tmp_path / "bomb.ckpt"
    with zipfile.ZipFile(io.BytesIO(_saved(STATE))) as old, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():  # 256 MB of zeros in place of the tensor: a 260 KB file
            new.writestr(info.filename, bytes(2**28) if info.filename.endswith("/data/0") else old.read(info))
    assert path.stat().st_size < 2**20
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(path)
    line = str(exc.value)
    assert str(path) in line and "compressed" in line and "256.0 MiB" in line and "\n" not in line
    assert "compressed" in verify_checkpoint(path)  # --resume auto skips it the same way


def _patch_central_size(data: bytes, name: str, size: int) -> bytes:
    """`data` (a zip) with the uncompressed size its central directory declares for `name` set to `size`."""
    at = data.index(b"PK\x01\x02")
    while True:
        n = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + n].decode().endswith(name):
            return data[:at + 24] + struct.pack("<I", size) + data[at + 28:]
        at = data.index(b"PK\x01\x02", at + 46)


def test_a_record_declaring_more_than_it_stores_is_refused(tmp_path, nothing_inflated):
    path = tmp_path / "liar.pt"
    path.write_bytes(_patch_central_size(_saved(STATE), "/data/0", 2**31))
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(path)
    assert str(path) in str(exc.value) and "declares 2048.0 MiB but stores 256 bytes" in str(exc.value)


def test_records_overlapping_beyond_the_file_are_refused(tmp_path):
    """Stored records each inside the file but together declaring more than it holds (records pointing at
    the same bytes): refused from the index."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data/0", bytes(4096))
    data = bytearray(buf.getvalue())
    cd = data.index(b"PK\x01\x02")
    end = data.index(b"PK\x05\x06")
    entry = bytes(data[cd:end])
    copies = 8  # the same central entry 8 times: 8 records over the same 4 KB
    body = bytes(data[:cd]) + entry * copies
    eocd = bytearray(data[end:])
    struct.pack_into("<HHII", eocd, 8, copies, copies, len(entry) * copies, cd)
    path = tmp_path / "overlap.pt"
    path.write_bytes(body + bytes(eocd))
    assert "more than the" in damage(path) and "overlap" in damage(path)


def test_files_torch_save_writes_still_load(tmp_path):
    path = tmp_path / "plain.pt"
    path.write_bytes(_saved(STATE))
    assert torch.equal(load_checkpoint(path)["models"]["vae"]["w"], STATE["models"]["vae"]["w"])
    assert damage(path) is None and verify_checkpoint(path) is None
    legacy = tmp_path / "legacy.pt"  # torch's pre-1.6 format is no zip: torch.load judges it, as before
    torch.save(STATE, legacy, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(legacy)
    assert torch.equal(load_checkpoint(legacy)["models"]["vae"]["w"], STATE["models"]["vae"]["w"])


def test_the_trainers_own_checkpoint_passes_the_index_check(tmp_path):
    """What every trainer saves (`save_atomic`: torch.save into a temp file) has stored records only."""
    from common.checkpoint import save_atomic

    path = save_atomic({**STATE, "rng": {"0": {"torch": torch.get_rng_state()}}}, Path(tmp_path) / "model_00000001.pt")
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    assert load_checkpoint(path)["trainer"] == "vae"


def test_the_piper_sniffer_reads_no_record_of_a_deflated_file(tmp_path, nothing_inflated, monkeypatch):
    """--init_from asks whether a file is a Piper .ckpt by reading its data.pkl record: a deflated file is
    not read there either (load_checkpoint then refuses it, naming the file)."""
    from tts.vits.published.start import is_piper_checkpoint

    path = tmp_path / "voice.pt"
    with zipfile.ZipFile(io.BytesIO(_saved({"state_dict": {"model_g.w": torch.zeros(8)}}))) as old, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            new.writestr(info.filename, old.read(info.filename))
    monkeypatch.setattr(zipfile.ZipFile, "read", lambda *a, **k: (_ for _ in ()).throw(AssertionError("inflated")))
    assert is_piper_checkpoint(path) is False
