"""Only the user's own pages and programs may use the server (serve/guard.py, docs/serve.md "Security"): a Host
it was not started under is refused (DNS rebinding), so is a POST another site sent (CSRF) or one without the
X-Requested-By header, /models names no file path, a request is cancelled only with the random id its client
gave it, and with --token every request but the page needs the token."""

from __future__ import annotations

import secrets
import threading
import time

import pytest
from starlette.testclient import TestClient

from serve.app import create_app
from serve.guard import Access
from serve.models import Limits

from .tiny import local_client


@pytest.fixture(scope="module")
def app(served):
    return create_app(served, Limits(max_text_chars=400))


@pytest.fixture(scope="module")
def client(app):
    with local_client(app) as c:
        yield c


@pytest.mark.parametrize("host,status", [
    ("127.0.0.1:8000", 200), ("localhost", 200), ("LocalHost:1234", 200), ("[::1]:8000", 200), ("[::1]", 200),
    ("evil.example", 421), ("evil.example:8000", 421), ("127.0.0.1.evil.example", 421), ("evil@127.0.0.1", 421),
    ("127.0.0.1:port", 421), ("", 421)])
def test_only_the_host_names_of_this_server_are_answered(client, host, status):
    """A page whose name is re-pointed at 127.0.0.1 (DNS rebinding) sends its own name as Host: 421, one line."""
    r = client.get("/models", headers={"host": host})
    assert r.status_code == status, r.text
    if status != 200:
        assert "does not answer to the host name" in r.json()["error"] and "\n" not in r.json()["error"]


def test_names_given_at_start_are_answered_too(served):
    access = Access.for_bind("0.0.0.0", ("mybox.lan",))
    with local_client(create_app(served, access=access)) as c:
        assert c.get("/models", headers={"host": "mybox.lan:8000"}).status_code == 200
        assert c.get("/models", headers={"host": "0.0.0.0:8000"}).status_code == 421  # a wildcard is not a name
    assert "192.168.1.5" in Access.for_bind("192.168.1.5").hosts


@pytest.mark.parametrize("headers,status,words", [
    ({"sec-fetch-site": "cross-site"}, 403, "another site"),
    ({"sec-fetch-site": "same-site", "origin": "http://localhost:3000"}, 403, "another site"),
    ({"origin": "http://evil.example"}, 403, "only this server's own page"),
    ({"origin": "http://127.0.0.1:9999"}, 403, "only this server's own page"),
    ({"origin": "null"}, 403, "only this server's own page"),
    ({"x-requested-by": ""}, 403, "add the header X-Requested-By"),
    ({"origin": "http://127.0.0.1:8000", "sec-fetch-site": "same-origin"}, 200, ""),
])
def test_a_post_another_site_could_send_is_refused(client, headers, status, words):
    r = client.post(f"/cancel/{secrets.token_hex(16)}", headers=headers)
    assert r.status_code == status, r.text
    assert words in r.text and "\n" not in r.text


def test_a_plain_form_post_without_the_header_never_runs(app):
    """What a cross-site <form> can send (no custom header) is refused before any model runs, and the browser's
    CORS preflight for a custom header gets no Access-Control-Allow-Origin."""
    with TestClient(app, base_url="http://127.0.0.1:8000") as bare:
        r = bare.post("/speak", data={"model": "vits-1", "text": "salom"})
        assert r.status_code == 403 and "X-Requested-By" in r.json()["error"]
        pre = bare.options("/speak", headers={"origin": "http://evil.example", "access-control-request-method": "POST",
                                              "access-control-request-headers": "x-requested-by"})
        assert pre.status_code >= 400 and "access-control-allow-origin" not in pre.headers


def test_models_names_no_file_path(client, tiny_checkpoints):
    text = client.get("/models").text
    root = str(tiny_checkpoints["vae"].parent)
    assert root not in text and '"/' not in text
    models = {m["id"]: m for m in client.get("/models").json()["models"]}
    folder = tiny_checkpoints["vits"].parent.name
    assert models["vits-1"]["label"] == f"{folder}/vits.pt" and models["clone-1"]["own_vocoder"] == f"{folder}/vocoder_export"


def test_only_the_client_that_knows_the_id_cancels_and_cancel_tells_the_truth(client, app, served):
    """Ids are random secrets of their client: a short one is refused, a duplicate in flight is 409, a wrong id
    cancels nothing; the right one cancels the request, which then answers 409."""
    assert client.post("/speak", data={"model": "vits-1", "text": "salom", "request_id": "job7"}).status_code == 400
    rid, answer = secrets.token_hex(16), {}
    lock = served["vits-1"].lock
    with lock:  # another request holds the model: this one waits
        worker = threading.Thread(target=lambda: answer.update(r=client.post(
            "/speak", data={"model": "vits-1", "text": "salom", "request_id": rid})))
        worker.start()
        deadline = time.monotonic() + 5
        while rid not in app.state.jobs:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        again = client.post("/speak", data={"model": "vits-1", "text": "salom", "request_id": rid})
        assert again.status_code == 409 and "already running" in again.json()["error"]
        assert client.post(f"/cancel/{secrets.token_hex(16)}").json() == {"cancelled": False}
        assert client.post(f"/cancel/{rid}").json() == {"cancelled": True}
        worker.join(5)
    assert answer["r"].status_code == 409 and answer["r"].json()["error"] == "cancelled"
    assert client.post(f"/cancel/{rid}").json() == {"cancelled": False}  # it is over


def test_with_a_token_every_request_but_the_page_needs_it(served):
    with local_client(create_app(served, access=Access(token="s3cret-token"))) as c:
        assert c.get("/").status_code == 200  # the page holds no secret; it reads the token from its address
        r = c.get("/models")
        assert r.status_code == 401 and "token" in r.json()["error"] and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/models", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.post(f"/cancel/{secrets.token_hex(16)}").status_code == 401
        ok = {"authorization": "Bearer s3cret-token"}
        assert c.get("/models", headers=ok).status_code == 200
        assert c.post(f"/cancel/{secrets.token_hex(16)}", headers=ok).json() == {"cancelled": False}


@pytest.mark.parametrize("path,headers,status", [
    ("/speak?text=salom&model=vits-1", {}, 200),  # curl, or any program: no header needed for a GET
    ("/speak?text=salom&model=vits-1", {"sec-fetch-site": "same-origin"}, 200),  # this server's own page
    ("/speak?text=salom&model=vits-1", {"sec-fetch-site": "none"}, 200),  # typed into the address bar
    ("/speak?text=salom&model=vits-1", {"sec-fetch-site": "cross-site"}, 403),  # <img src=…> on another site
    ("/api/tts?text=salom&model=vits-1", {"sec-fetch-site": "same-site"}, 403),
    ("/speak?text=salom&model=vits-1", {"origin": "http://evil.example"}, 403),  # a cross-origin fetch
    ("/models", {"sec-fetch-site": "cross-site"}, 403),
    ("/", {"sec-fetch-site": "cross-site"}, 200),  # a link from another site to the page itself
])
def test_a_get_that_does_work_is_refused_from_another_site(app, path, headers, status):
    """GET /speak makes audio, so another site's page must not make the browser send it; programs still can."""
    with TestClient(app, base_url="http://127.0.0.1:8000") as bare:  # no X-Requested-By
        r = bare.get(path, headers=headers)
    assert r.status_code == status, r.text
    if status == 403:
        assert "another site" in r.text or "only this server's own page" in r.text
