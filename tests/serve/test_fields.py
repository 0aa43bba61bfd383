"""An API other programs can rely on (serve/fields.py, docs/serve.md "Field names"): /speak reads a form, multipart,
JSON or a GET query string alike; Piper's and coqui's names for a field do what ours do; a field the endpoint does
not read is a 400 naming the closest known one, never a 200 and the same wav; /models says which controls a model
reads, and the answer says the text as it was spoken."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from serve.app import create_app
from serve.fields import RECONSTRUCT, SPEAK, VOCODE, canonical

from .tiny import local_client, wav_file_bytes

SALOM = {"model": "vits-1", "text": "Салом, 5 дунё!", "speaker": "bobur", "length_scale": "1.1"}


@pytest.fixture(scope="module")
def client(served):
    with local_client(create_app(served)) as c:
        yield c


def _wav(r) -> bytes:
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.parametrize("theirs,ours", [("speaker_id", "speaker"), ("noise_w", "noise_scale_w"),
                                         ("noise_w_scale", "noise_scale_w"), ("speaker_wav", "reference")])
def test_piper_and_coqui_names_map_to_ours(theirs, ours):
    assert canonical([(theirs, "1")], SPEAK) == {ours: "1"}


def test_each_body_kind_and_the_coqui_path_give_the_same_wav(client):
    """Form, multipart, JSON, GET /speak?… and coqui's GET /api/tts?… with Piper's speaker_id: one wav."""
    form = _wav(client.post("/speak", data=SALOM))
    multipart = _wav(client.post("/speak", files={k: (None, v) for k, v in SALOM.items()}))
    as_json = _wav(client.post("/speak", json={**SALOM, "length_scale": 1.1}))
    get = _wav(client.get("/speak", params=SALOM))
    coqui = _wav(client.get("/api/tts", params={**{k: v for k, v in SALOM.items() if k != "speaker"}, "speaker_id": "1"}))
    assert form == multipart == as_json == get == coqui
    assert _wav(client.post("/speak", data={**SALOM, "speaker": "anna"})) != form  # the speaker did change it


def test_the_answer_says_what_was_spoken_and_what_was_ignored(client):
    r = client.post("/speak", json={**SALOM, "noise_w": 0})  # Piper's name; the tiny VITS has no stochastic DP
    assert unquote(r.headers["x-spoken-text"]) == "salom, besh dunyo!"
    assert r.headers["x-ignored-fields"] == "noise_scale_w"
    r = client.post("/speak", data={**SALOM, "noise_w_scale": "-1"})
    assert r.status_code == 400 and "noise_scale_w must be >= 0" in r.json()["error"]


def test_models_say_which_controls_each_speech_model_reads(client):
    models = {m["id"]: m for m in client.get("/models").json()["models"]}
    vits, clone = models["vits-1"], models["clone-1"]
    assert vits["controls"] == ["speaker", "noise_scale", "length_scale"]
    assert "deterministic" in vits["unused"]["noise_scale_w"]
    assert clone["controls"] == ["length_scale", "reference", "vocoder"] and "speaker" in clone["unused"]


@pytest.mark.parametrize("path,fields,words", [
    ("/speak", {"lenght_scale": "2"}, "unknown field 'lenght_scale' for /speak (did you mean 'length_scale'?)"),
    ("/speak", {"noise_scale_W": "0"}, "(did you mean 'noise_scale_w'?)"),
    ("/speak", {"language_id": "uz"}, "unknown field 'language_id' for /speak; it reads model, text"),
    ("/speak", {"voice": "x"}, "name the model with model="),
    ("/speak", {"speaker_id": "0", "speaker": "bobur"}, "speaker is given twice with different values"),
    ("/speak", {"noise_w": "0.1", "noise_w_scale": "0.2"}, "noise_scale_w is given twice"),
    ("/speak", {'{"text": "salom"}': ""}, "Content-Type: application/json"),
    ("/vocode", {"autio": "x"}, "unknown field 'autio' for /vocode (did you mean 'audio'?)"),
    ("/reconstruct", {"tile": "64"}, "unknown field 'tile' for /reconstruct (did you mean 'tile_size'?)"),
])
def test_an_unknown_or_doubled_field_is_one_line_naming_the_closest(client, path, fields, words):
    model = {"/speak": "vits-1", "/vocode": "vocoder-1", "/reconstruct": "vae-1"}[path]
    r = client.post(path, data={"model": model, "text": "salom", **fields} if path == "/speak" else
                    {"model": model, **fields})
    assert r.status_code == 400 and words in r.json()["error"] and "\n" not in r.text, r.text


def test_a_field_given_twice_with_one_value_and_the_page_s_own_fields_are_fine():
    assert canonical([("speaker", "1"), ("speaker_id", "1"), ("request_id", "x" * 16)], SPEAK) == {
        "speaker": "1", "request_id": "x" * 16}
    assert set(VOCODE.names) >= {"model", "audio", "request_id"}
    assert set(RECONSTRUCT.names) >= {"model", "image", "tile_size", "request_id"}


@pytest.mark.parametrize("body,ctype,words", [
    (b'{"text": ', "application/json", "not valid JSON"), (b"[1]", "application/json", "not an object"),
    (b'{"text": ["a"]}', "application/json", "give a string or a number"),
    (b"Salom", "text/plain", "send the fields as multipart/form-data"),
])
def test_a_body_it_cannot_read_says_what_to_send(client, body, ctype, words):
    r = client.post("/speak", content=body, headers={"content-type": ctype})
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_coqui_speaker_wav_is_an_upload_never_a_path(client):
    clip = wav_file_bytes(1.5)
    r = client.post("/speak", data={"model": "clone-1", "text": "salom"}, files={"speaker_wav": ("me.wav", clip)})
    assert r.status_code == 200, r.text
    r = client.post("/speak", data={"model": "clone-1", "text": "salom", "speaker_wav": "/etc/passwd"})
    assert r.status_code == 400 and "must be an uploaded file" in r.json()["error"]


def test_the_spoken_text_header_is_cut_to_a_size_proxies_accept():
    from serve.app import SPOKEN_HEADER_CHARS, spoken_header

    assert spoken_header("Salom.") == "Salom."
    long = spoken_header("a" * 5000)
    assert len(long) == SPOKEN_HEADER_CHARS and long.endswith("…")
