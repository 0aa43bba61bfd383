"""The vocoder demo's data: real readers out of a Debian package (a small one built here in the
package's layout, never downloaded), held out by reader through test_prefixes, and the espeak-ng
fallback when the package cannot be fetched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from speech.demo_recordings import (
    HELD_OUT_READERS,
    PEAK,
    TRAIN_READERS,
    RecordingsUnavailable,
    make_recordings_corpus,
)
from vocoder.prepare_data import PrepareError, prepare

from .conftest import tiny_config, voiced_tone

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb (Debian) not installed")


def _build_deb(root, readers=TRAIN_READERS + HELD_OUT_READERS, clips=3):
    """A .deb laid out like tuxpaint-stamps-default: stamps/<category>/<stamp>_desc_<lang>.ogg, 44.1 kHz stereo."""
    pkg = root / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text("Package: tuxpaint-stamps-default\nVersion: 1\nArchitecture: all\n"
                                            "Maintainer: test <t@t>\nDescription: test\n")
    for r, reader in enumerate(readers):
        for c in range(clips):
            d = pkg / "usr/share/tuxpaint/stamps" / f"cat{c}"
            d.mkdir(parents=True, exist_ok=True)
            tone = voiced_tone(1.2 + 0.1 * c, 44100, f0=110 + 20 * r, seed=c, amp=0.1 + 0.05 * r)
            sf.write(d / f"stamp{c}_desc_{reader}.ogg", np.stack([tone, tone], 1), 44100, format="OGG")
        sf.write(pkg / "usr/share/tuxpaint/stamps/cat0/short_desc_fr.ogg", voiced_tone(0.3, 44100), 44100, format="OGG")
    subprocess.run(["dpkg-deb", "--build", "-Zgzip", str(pkg), str(root / "tux.deb")], check=True, capture_output=True)
    return root / "tux.deb"


@needs_dpkg
def test_corpus_from_package_layout(tmp_path):
    deb = _build_deb(tmp_path)
    rec = make_recordings_corpus(tmp_path / "readers", 22050, train_per_reader=2, held_out_per_reader=1, deb=deb)
    readers = [f.split("/")[0] for f in rec["files"]]
    assert {r: readers.count(r) for r in set(readers)} == {**dict.fromkeys(TRAIN_READERS, 2),
                                                            **dict.fromkeys(HELD_OUT_READERS, 1)}
    assert not any("short" in f for f in rec["files"])  # the 0.3 s clip is under MIN_SECONDS
    for f in rec["files"]:
        wav, sr = sf.read(tmp_path / "readers" / f)
        assert sr == 22050 and wav.ndim == 1
        assert np.abs(wav).max() == pytest.approx(PEAK, abs=2e-3)  # peak-normalised (int16 rounding)
    assert "GPL-2" in rec["licence"]
    assert json.loads((tmp_path / "readers" / "corpus.json").read_text()) == rec
    # reused as it is: no package needed the second time
    assert make_recordings_corpus(tmp_path / "readers", 22050, 2, 1, deb=tmp_path / "missing.deb") == rec


@needs_dpkg
def test_package_without_a_reader_is_refused(tmp_path):
    deb = _build_deb(tmp_path, readers=TRAIN_READERS)
    with pytest.raises(RecordingsUnavailable, match="no description clips for reader"):
        make_recordings_corpus(tmp_path / "readers", 22050, deb=deb)


def test_failed_download_is_reported(tmp_path, monkeypatch):
    """apt-get that cannot fetch (no network, no package list) -> RecordingsUnavailable, not a traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package tuxpaint-stamps-default' >&2\nexit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    if shutil.which("dpkg-deb") is None:
        (bin_dir / "dpkg-deb").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "dpkg-deb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(RecordingsUnavailable, match="Unable to locate package"):
        make_recordings_corpus(tmp_path / "readers", 22050)


def test_test_prefixes_hold_out_whole_speakers(tmp_path):
    for spk, f0 in (("anna", 200), ("boris", 110), ("chen", 150)):
        (tmp_path / "wavs" / spk).mkdir(parents=True)
        for i in range(2):
            sf.write(tmp_path / "wavs" / spk / f"{i}.wav", voiced_tone(1.0, 22050, f0=f0, seed=i), 22050)
    manifest = prepare(tiny_config("test_prefixes=[chen/]"), [tmp_path / "wavs"], tmp_path / "bin",
                       num_workers=0, log=lambda *a: None)
    valid = [manifest["items"][i]["source"] for i in manifest["valid"]]
    assert len(valid) == 2 and all("/chen/" in s for s in valid)
    assert not any("/chen/" in manifest["items"][i]["source"] for i in manifest["train"])
    with pytest.raises(PrepareError, match="test_prefixes select 0 of 6"):
        prepare(tiny_config("test_prefixes=[nobody/]"), [tmp_path / "wavs"], tmp_path / "bin2",
                num_workers=0, log=lambda *a: None)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (make setup installs it)")
def test_demo_falls_back_to_espeak_with_one_line(tmp_path, monkeypatch, capsys):
    """No package to be had: the demo says so in one line and prepares espeak-ng speech, random held-out files."""
    from vocoder import demo

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: no network' >&2\nexit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cfg = tiny_config("val_num=2")
    manifest, prepared = demo.demo_dataset(cfg, False, tmp_path / "readers", tmp_path / "wavs", tmp_path / "bin_out",
                                           sentences=1)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: no real recordings")]
    assert len(notes) == 1 and "E: no network" in notes[0]
    assert prepared == tmp_path / "bin_out" and cfg.test_prefixes == []
    assert len(manifest["valid"]) == 2 and len(manifest["train"]) == 4  # 1 sentence x 6 espeak-ng voices
