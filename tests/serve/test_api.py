"""The HTTP API through Starlette's test client, on tiny checkpoints of every trainer: each endpoint answers
with its result and timings; every bad request is one 4xx line and the server goes on serving; a cancelled
request ends; two requests on one model run one at a time; the trainer is read from the file."""

from __future__ import annotations

import base64
import io
import threading
import time

import pytest
import soundfile as sf
import torch

from common.checkpoint import CheckpointError
from serve.__main__ import main as serve_main
from serve.app import create_app
from serve.models import Cancelled, Job, Limits, file_kind, load_models

from .tiny import SERVED_ORDER, local_client, png_bytes, wav_file_bytes


@pytest.fixture(scope="module")
def client(served):
    limits = Limits(max_upload_bytes=200_000, max_audio_seconds=3.0, max_pixels=64 * 64, max_text_chars=400)
    with local_client(create_app(served, limits)) as c:
        yield c


def _wav(content: bytes) -> tuple:
    data, sr = sf.read(io.BytesIO(content))
    return data, sr


def test_models_lists_each_trainer_by_id_never_by_path(client):
    j = client.get("/models").json()
    assert [(m["id"], m["kind"]) for m in j["models"]] == [
        ("vits-1", "vits"), ("clone-1", "clone"), ("vocoder-1", "vocoder"), ("vocoder-2", "vocoder"), ("vae-1", "vae")]
    vits = j["models"][0]
    assert vits["speakers"] == ["anna", "bobur"] and vits["scales"]["noise_scale"] == pytest.approx(0.667)
    assert j["limits"]["max_audio_seconds"] == 3.0
    page = client.get("/")
    assert page.status_code == 200 and "Reconstruct" in page.text and "Compare" in page.text


def test_speak_returns_a_wav_with_its_real_time_factor(client):
    r = client.post("/speak", data={"model": "vits-1", "text": "Салом, дунё! Bugun 5-sentabr.", "speaker": "bobur",
                                    "length_scale": "1.2"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav"
    wav, sr = _wav(r.content)
    assert sr == 22050 and len(wav) > 1000 and abs(len(wav) / sr - float(r.headers["x-audio-seconds"])) < 0.01
    assert float(r.headers["x-real-time-factor"]) > 0 and r.headers["x-sentences"] == "2"
    assert "x-hop-comb-db" in r.headers  # the speech's buzz at the frame rate (speech.buzz); empty when too short


def test_speak_with_the_cloning_model_a_reference_and_a_chosen_vocoder(client):
    for vocoder in ("", "vocoder-2"):  # its own (the config's path), then one of the served
        r = client.post("/speak", data={"model": "clone-1", "text": "Salom, dunyo!", "vocoder": vocoder},
                        files={"reference": ("me.wav", wav_file_bytes(1.5), "audio/wav")})
        assert r.status_code == 200, r.text
        wav, sr = _wav(r.content)
        assert sr == 22050 and len(wav) > 256


def test_vocode_gives_the_copy_synthesis_spectrograms_and_metrics(client):
    r = client.post("/vocode", data={"model": "vocoder-1"}, files={"audio": ("a.wav", wav_file_bytes(1.0), "audio/wav")})
    assert r.status_code == 200, r.text
    j = r.json()
    wav, sr = _wav(base64.b64decode(j["wav"]))
    assert sr == 22050 and len(wav) > 0.9 * sr
    assert base64.b64decode(j["spectrograms_png"])[:4] == b"\x89PNG"
    assert set(j["metrics"]) == {"mcd_dtw_db", "level_db", "f0_rmse", "f0_median_error", "f0_gross_error", "vuv_error",
                                 "periodicity", "hop_comb_db"}
    assert j["metrics"]["mcd_dtw_db"] > 0 and j["rtf"] > 0


def test_reconstruct_returns_the_image_its_psnr_and_tiles_when_large(client):
    r = client.post("/reconstruct", data={"model": "vae-1"}, files={"image": ("x.png", png_bytes(40, 24), "image/png")})
    assert r.status_code == 200, r.text
    from PIL import Image

    assert Image.open(io.BytesIO(r.content)).size == (40, 24)
    assert float(r.headers["x-psnr-db"]) > 0 and r.headers["x-tiled"] == "no"
    r = client.post("/reconstruct", data={"model": "vae-1", "tile_size": "64"},
                    files={"image": ("x.png", png_bytes(64, 40), "image/png")})
    assert r.status_code == 200 and r.headers["x-tiled"] == "no"  # 64 px is not larger than the tile


@pytest.mark.parametrize("path,data,files,status,words", [
    ("/speak", {"model": "vits-1", "text": "   "}, None, 400, "text is empty"),
    ("/speak", {"model": "vits-1", "text": "x" * 401}, None, 400, "more than the limit"),
    ("/speak", {"model": "vits-1", "text": "salom", "speaker": "zed"}, None, 400, "not in this model's speakers"),
    ("/speak", {"model": "vits-1", "text": "salom", "length_scale": "fast"}, None, 400, "must be a number"),
    ("/speak", {"model": "vits-1", "text": "salom", "noise_scale": "-1"}, None, 400, "must be >= 0"),
    ("/speak", {"model": "clone-1", "text": "salom"}, None, 400, "upload one"),
    ("/speak", {"model": "clone-1", "text": "salom"}, {"reference": ("r.wav", b"RIFF nonsense", "audio/wav")}, 400,
     "reference clip is not audio"),
    ("/speak", {"model": "vae-1", "text": "salom"}, None, 400, "takes a VITS or cloning model"),
    ("/speak", {"model": "/etc/passwd", "text": "salom"}, None, 404, "no model"),
    ("/vocode", {"model": "vocoder-1"}, {"audio": ("a.txt", b"hello, I am text", "text/plain")}, 400, "not audio"),
    ("/vocode", {"model": "vocoder-1"}, {"audio": ("a.wav", b"", "audio/wav")}, 400, "empty"),
    ("/vocode", {"model": "vocoder-1"}, {"audio": ("a.wav", wav_file_bytes(4.0), "audio/wav")}, 400, "too long"),
    ("/vocode", {"model": "vocoder-1"}, {"audio": ("a.wav", wav_file_bytes(5.0), "audio/wav")}, 413, "limit"),
    ("/vocode", {"model": "vocoder-1"}, {"audio": ("a.wav", wav_file_bytes(20.0), "audio/wav")}, 413, "limit"),
    ("/vocode", {"model": "vocoder-1"}, None, 400, "no file"),
    ("/reconstruct", {"model": "vae-1"}, {"image": ("x.png", b"GIF89a broken", "image/png")}, 400, "give a png"),
    ("/reconstruct", {"model": "vae-1"}, {"image": ("x.png", png_bytes(80, 80), "image/png")}, 400, "too large"),
    ("/reconstruct", {"model": "vae-1", "tile_size": "3"}, {"image": ("x.png", png_bytes(), "image/png")}, 400,
     "tile_size"),
])
def test_a_bad_request_is_one_line_4xx_and_the_server_keeps_serving(client, path, data, files, status, words):
    r = client.post(path, data=data, files=files)
    assert r.status_code == status, r.text
    message = r.json()["error"]
    assert words in message and "Traceback" not in message and "\n" not in message
    assert client.post("/speak", data={"model": "vits-1", "text": "salom"}).status_code == 200


def test_cancel_ends_a_request_waiting_for_its_model(served):
    """A synthesis on a busy model waits for it (one request at a time per model); cancelling it ends the wait."""
    model = served["vits-1"]
    job = Job()
    result: dict = {}

    def run() -> None:
        try:
            model.speak("salom", job, Limits())
        except Cancelled as e:
            result["error"] = e

    with model.lock:  # another request holds the model
        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive()  # waiting, not running alongside
        job.cancelled.set()
        worker.join(2.0)
    assert not worker.is_alive() and isinstance(result.get("error"), Cancelled)


def test_cancel_endpoint_and_request_ids(client):
    assert client.post("/cancel/nothing-running").json() == {"cancelled": False}
    r = client.post("/speak", data={"model": "vits-1", "text": "salom", "request_id": "../../etc"})
    assert r.status_code == 400 and "request_id" in r.json()["error"]


def test_the_trainer_is_read_from_the_file_and_others_are_refused(tiny_checkpoints, tmp_path):
    assert [file_kind(tiny_checkpoints[k]) for k in ("vits", "clone", "vocoder", "vocoder_ckpt", "vae")] == [
        "vits", "clone", "vocoder", "vocoder", "vae"]
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="no trainer here recognises"):
        file_kind(other)


def test_start_refuses_a_file_it_cannot_serve_in_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.pt"
    bad.write_text("not a checkpoint")
    assert serve_main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(bad) in err and "Traceback" not in err


def test_start_refuses_a_vocoder_whose_f0_extractor_cannot_run_here(tiny_checkpoints, tmp_path, capsys):
    """Vocode extracts f0 with the vocoder's own extractor: rmvpe weights recorded on another machine are one
    line at start, not a 4xx on every upload."""
    import json
    import shutil

    moved = shutil.copytree(tiny_checkpoints["vocoder"], tmp_path / "export")
    info = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**info, "pe": "rmvpe", "pe_ckpt": "/gone/rmvpe.onnx"}))
    assert serve_main([str(moved)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "/gone/rmvpe.onnx" in err and len(err.splitlines()) == 1, err


def test_cancel_stops_a_long_text_between_sentences(served, monkeypatch):
    """A cancel that arrives while a text is spoken ends it after the sentence in progress, not at the end."""
    from tts.vits import synthesize

    job, spoken, real = Job(), [], synthesize.synthesize

    def one_sentence(*args, **kwargs):
        spoken.append(args[2])
        job.cancelled.set()  # the cancel arrives while the first sentence is spoken
        return real(*args, **kwargs)

    monkeypatch.setattr(synthesize, "synthesize", one_sentence)
    text = " ".join(f"Bu {i}-gap." for i in range(1, 30))
    with pytest.raises(Cancelled):
        served["vits-1"].speak(text, job, Limits())
    assert spoken == ["Bu 1-gap."]


def test_each_checkpoint_is_read_from_disk_once(tiny_checkpoints, monkeypatch):
    """Finding which trainer wrote a file and building its model read the same loaded checkpoint; the cloning
    model's own vocoder, served too, is one load shared by both."""
    real = torch.load
    loads: list[str] = []

    def counting(f, *args, **kwargs):
        loads.append(str(f))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    models = load_models([str(tiny_checkpoints[k]) for k in SERVED_ORDER], torch.device("cpu"))
    assert sorted(models) == ["clone-1", "vae-1", "vits-1", "vocoder-1", "vocoder-2"]
    files = [str(tiny_checkpoints[k]) for k in ("vits", "clone", "vocoder_ckpt", "vae")]
    files.append(str(tiny_checkpoints["vocoder"] / "model.ckpt"))
    assert sorted(loads) == sorted(files)
    assert models["clone-1"].own_vocoder[0] is models["vocoder-1"].model  # one vocoder, one lock
    assert models["clone-1"].own_vocoder[1] is models["vocoder-1"].lock


@pytest.mark.parametrize("flags,named", [
    (["--port", "70000"], "--port"), (["--port", "-1"], "--port"), (["--threads", "-1"], "--threads"),
    (["--max_upload_mb", "nan"], "--max_upload_mb"), (["--max_upload_mb", "inf"], "--max_upload_mb"),
    (["--max_upload_mb", "-5"], "--max_upload_mb"), (["--max_audio_seconds", "nan"], "--max_audio_seconds"),
    (["--max_pixels", str(10**12)], "--max_pixels"), (["--max_memory_gb", "0"], "--max_memory_gb"),
    (["--queue", "0"], "--queue"), (["--body_timeout", "nan"], "--body_timeout"),
    (["--host", "no-such-host.invalid"], "--host"), (["--host", "192.0.2.1"], "--host 192.0.2.1"),
])
def test_start_refuses_a_bad_number_or_address_in_one_line(tiny_checkpoints, capsys, flags, named):
    """Before any model loads: one `error:` line naming the flag, exit 2 (common.exit_codes.BAD_INPUT)."""
    free = [] if "--port" in flags else ["--port", "0"]  # never the default 8000, which may be in use
    assert serve_main([*flags, *free, str(tiny_checkpoints["vae"])]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and named in out.err and len(out.err.strip().splitlines()) == 1, out.err
    assert "serving" not in out.out


def test_start_refuses_a_port_in_use_and_says_when_it_is_open_to_the_network(tiny_checkpoints, capsys, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert serve_main(["--port", str(taken.getsockname()[1]), str(tiny_checkpoints["vae"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --host 127.0.0.1 --port") and "another program" in err and len(err.splitlines()) == 1
    bad = tmp_path / "notes.pt"
    bad.write_text("not a checkpoint")
    assert serve_main(["--host", "0.0.0.0", "--port", "0", str(bad)]) == 2  # binds, warns, then the file is refused
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert [line for line in out if "to the network" in line] == [
        "warning: --host 0.0.0.0 opens the server to the network: anyone who can reach this machine can use it "
        "(no --token)"], captured
