"""The HTTP API and the page: a small Starlette (ASGI) app over the models of `serve.models`.

    GET  /                 the page (serve/static/index.html): Speak, Vocode, Reconstruct, Compare
    GET  /models           the loaded models (id, kind, label, speakers, scales) and the upload limits
    POST /speak            model, text, [speaker, noise_scale, length_scale, noise_scale_w, seed, reference (file,
                           cloning), vocoder (a vocoder's id, cloning)] → audio/wav (the text as spoken in
                           X-Spoken-Text, its hop comb, `speech.buzz`, in X-Hop-Comb-dB); Piper's and coqui's
                           names too (serve/fields.py)
    GET  /speak?text=…     the same from the query string (as Piper's and coqui's servers); /api/tts: coqui's path
    POST /vocode           form: model, audio (file) → JSON: wav + recording (base64), spectrograms (PNG,
                           base64), metrics
    POST /reconstruct      form: model, image (file), [tile_size] → image/png (PSNR in X-PSNR-dB)
    POST /cancel/{id}      cancels the request sent with form field request_id=<id> → {"cancelled": true|false}

Fields come as a form, multipart, a JSON object or a query string; a field the endpoint does not read is a 400
naming the closest it does. Every request passes `serve.guard.Guard` first (the host it names, its origin, a
POST's X-Requested-By header, the token). Timings come back in headers (X-Real-Time-Factor, X-Audio-Seconds, X-Elapsed-Seconds) or JSON
fields. A bad request is a 4xx with {"error": one line}: the message of the `common.errors.UserError` that
refused it, as the code that found the problem worded it; nothing the user sends is ever shown back as a
traceback. Inference runs in the thread pool, one request at a time per model (`serve.models.locked`), so the
server keeps answering while a model works; at most `Limits.queue_per_model` requests wait for or run on one
model (more: 503 with Retry-After), and the page and /models never wait for a model or a thread. A request is
cancelled by /cancel with its id (a random one only its client knows), by the client going away, or by the
server stopping (`app.state.cancel_all`, which serve/__main__.py calls on SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import re
import secrets
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive

from common.errors import UserError
from serve.fields import RECONSTRUCT, SPEAK, VOCODE, FieldSet, canonical
from serve.guard import Access, Guard
from serve.models import SPEECH_CONTROLS, BadRequest, Cancelled, Job, Limits, Served

STATIC = Path(__file__).resolve().parent / "static"
# An id only its client knows is what lets that client, and no one else, cancel the request: long enough not to
# be guessed (the page sends 128 random bits).
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
RETRY_AFTER_S = 5  # what a 503 (the model's queue is full) asks the client to wait
MAX_SEED = 2**63 - 1  # torch.manual_seed's range
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
SPOKEN_HEADER_CHARS = 1000  # X-Spoken-Text is cut here: percent-encoded, 5000 characters would be a tens-of-KB header


def spoken_header(text: str, limit: int = SPOKEN_HEADER_CHARS) -> str:
    """The spoken text for X-Spoken-Text, cut to `limit` characters with "…" (proxies refuse huge headers)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
log = logging.getLogger("serve")


def create_app(models: dict[str, Served], limits: Limits | None = None, access: Access | None = None) -> Starlette:
    """The app over already loaded `models` ({id: Served}); tests build it on tiny ones. `access`: who may use it
    (default: this machine's loopback names, no token)."""
    limits = limits or Limits()
    jobs: dict[str, Job] = {}  # request id → its cancel flag, while it waits or runs
    queued: Counter[str] = Counter()  # model id → requests waiting for it or running on it
    page = (STATIC / "index.html").read_bytes()  # served from memory: never waits for a thread

    def pick(form, kinds: tuple[str, ...], field: str = "model") -> Served:
        wanted = str(form.get(field) or "")
        if not wanted:
            choices = [m for m in models.values() if m.kind in kinds]
            if len(choices) == 1:
                return choices[0]
            raise BadRequest(f"name the model ({field}=): one of {', '.join(m.id for m in choices) or '(none loaded)'}")
        if wanted not in models:
            raise BadRequest(f"no model {wanted!r}; the loaded ones are {', '.join(models)}", 404)
        return models[wanted]

    async def read_fields(request: Request, fields: FieldSet) -> dict:
        """The request's fields under our names (`serve.fields.canonical`): its query string and, for a POST, its
        body: multipart/form-data, application/x-www-form-urlencoded or application/json (an object of strings
        and numbers), so that curl's -F and -d, a browser's FormData and a Piper-style JSON client all work."""
        items = list(request.query_params.multi_items())
        if request.method == "POST":
            items += await read_body(request)
        return canonical(items, fields)

    async def read_body(request: Request) -> list[tuple[str, object]]:
        size = request.headers.get("content-length", "")
        if not size.isdigit():
            raise BadRequest("send the request with a Content-Length (a file upload of known size)", 411)
        if int(size) > limits.max_upload_bytes + 64 * 1024:  # the form's own fields and boundaries besides the file
            raise BadRequest(f"the upload is {int(size) / 2**20:.1f} MB, more than the limit of "
                             f"{limits.max_upload_bytes / 2**20:g} MB (--max_upload_mb)", 413)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        request = Request(request.scope, stall_limited(request.receive, limits.body_timeout_s))
        if kind == "application/json":
            return json_fields(await request.body())
        if kind not in FORM_TYPES:
            if int(size) == 0:  # fields in the query string alone
                return []
            raise BadRequest(f"the request body is {kind or 'of no Content-Type'}: send the fields as "
                             "multipart/form-data, application/x-www-form-urlencoded or application/json")
        try:
            return (await request.form(max_files=2, max_fields=20)).multi_items()
        except BadRequest:
            raise
        except Exception as e:  # noqa: BLE001 - a malformed body is the sender's error, said in one line
            raise BadRequest(f"the request body is not a readable form ({type(e).__name__}): send multipart/form-data "
                             "or application/x-www-form-urlencoded") from None

    async def file_bytes(form, name: str, required: bool = True) -> bytes | None:
        item = form.get(name)
        if isinstance(item, str):  # coqui's speaker_wav is a path on its server; here no request names a file
            raise BadRequest(f"{name} must be an uploaded file (curl -F {name}=@clip.wav), not text: the server "
                             "never reads a path a request names")
        if not isinstance(item, UploadFile):
            if required:
                raise BadRequest(f"no file in the request: attach it as the form field {name!r}")
            return None
        data = await item.read()
        if len(data) > limits.max_upload_bytes:
            raise BadRequest(f"the upload is {len(data) / 2**20:.1f} MB, more than the limit of "
                             f"{limits.max_upload_bytes / 2**20:g} MB", 413)
        return data

    def number(form, name: str, kind: type = float):
        value = form.get(name)
        if value is None or str(value).strip() == "":
            return None
        try:
            number = kind(str(value))
        except ValueError:
            raise BadRequest(f"{name} must be a number, not {str(value)[:40]!r}") from None
        if not math.isfinite(number):
            raise BadRequest(f"{name} must be a finite number, not {number}")
        return number

    async def run(request: Request, form, served: Served, work: Callable[[Job], dict]) -> dict:
        """`work(job)` in the thread pool, cancelled by /cancel/<request_id>, by the client leaving or by the server
        stopping; refused with 503 when `served` already has `limits.queue_per_model` requests."""
        rid = str(form.get("request_id") or secrets.token_urlsafe(16))
        if not REQUEST_ID.match(rid):
            raise BadRequest("request_id must be 16 to 64 letters, digits, '-' or '_': a random id only you know "
                             "(it is what cancels the request)")
        if rid in jobs:
            raise BadRequest("a request with this request_id is already running: give each request a new random id", 409)
        if queued[served.id] >= limits.queue_per_model:
            raise BadRequest(f"{served.id} already has {queued[served.id]} requests waiting or running (the server's "
                             f"--queue): try again in a few seconds", 503, {"Retry-After": str(RETRY_AFTER_S)})
        job = jobs[rid] = Job()
        queued[served.id] += 1

        async def watch() -> None:
            while not job.cancelled.is_set():
                if await request.is_disconnected():
                    job.cancelled.set()
                    return
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        try:
            result = await run_in_threadpool(work, job)
            job.check()  # cancelled after the work's last check: /cancel said it was, so its answer is not sent
            return result
        finally:
            watcher.cancel()
            jobs.pop(rid, None)
            queued[served.id] -= 1

    def guarded(handler):
        """One line for every failure: a 4xx for what the user sent, a 500 (logged here) for our own."""
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except UserError as e:  # what the user sent, in the words the code that found it raised
                return JSONResponse({"error": str(e)}, status_code=getattr(e, "status", 400),
                                    headers=getattr(e, "headers", None))
            except Cancelled:
                return JSONResponse({"error": "cancelled"}, status_code=409)
            except Exception as e:  # noqa: BLE001 - the server keeps serving; the log has the traceback
                log.exception("request failed")
                return JSONResponse({"error": f"the server failed on this request ({type(e).__name__}); "
                                              "its log has the details"}, status_code=500)
        return endpoint

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def list_models(request: Request) -> Response:
        return JSONResponse({"models": [m.public() for m in models.values()],
                             "limits": {"max_upload_mb": limits.max_upload_bytes / 2**20,
                                        "max_audio_seconds": limits.max_audio_seconds,
                                        "max_pixels": limits.max_pixels, "max_text_chars": limits.max_text_chars,
                                        "max_memory_gb": limits.memory_bytes / 2**30,
                                        "queue_per_model": limits.queue_per_model}})

    async def speak(request: Request) -> Response:
        """POST, or GET with the fields in the query string (as Piper's and coqui's servers answer): a wav, with
        the text as spoken (normalised, percent-encoded UTF-8) in X-Spoken-Text and the fields sent that this
        model does not read in X-Ignored-Fields."""
        form = await read_fields(request, SPEAK)
        served = pick(form, ("vits", "clone"))
        reference = await file_bytes(form, "reference", required=False)
        vocoder = pick(form, ("vocoder",), "vocoder") if form.get("vocoder") else None
        if vocoder is not None and vocoder.kind != "vocoder":
            raise BadRequest(f"vocoder={vocoder.id} is a {vocoder.kind} model, not a vocoder")
        scales = {k: number(form, k) for k in ("noise_scale", "length_scale", "noise_scale_w")}
        seed = number(form, "seed", int) or 0
        if not 0 <= seed <= MAX_SEED:
            raise BadRequest(f"seed must be a whole number from 0 to {MAX_SEED}, not {str(seed)[:40]}")
        res = await run(request, form, served, lambda job: served.speak(str(form.get("text") or ""), job, limits,
                                                                form.get("speaker"), scales, seed, reference, vocoder))
        ignored = [k for k in SPEECH_CONTROLS if k in form and k not in served.info.get("controls", ())]
        return Response(res["wav"], media_type="audio/wav", headers={
            "X-Real-Time-Factor": f"{res['rtf']:.4f}", "X-Audio-Seconds": f"{res['seconds']:.3f}",
            "X-Elapsed-Seconds": f"{res['elapsed']:.3f}", "X-Sentences": str(res["sentences"]),
            "X-Spoken-Text": quote(spoken_header(res["spoken"]), safe=" ,.!?;:'-"), "X-Ignored-Fields": ",".join(ignored),
            "X-Hop-Comb-dB": "" if res["metrics"]["hop_comb_db"] is None else f"{res['metrics']['hop_comb_db']:.2f}",
            "Content-Disposition": f'attachment; filename="{served.id}.wav"'})

    async def post_vocode(request: Request) -> Response:
        form = await read_fields(request, VOCODE)
        served = pick(form, ("vocoder",))
        data = await file_bytes(form, "audio")
        res = await run(request, form, served, lambda job: served.vocode(data, job, limits))
        b64 = {k: base64.b64encode(res[k]).decode("ascii") for k in ("wav", "original", "png")}
        return JSONResponse({"model": served.id, "wav": b64["wav"], "original": b64["original"],
                             "spectrograms_png": b64["png"], "metrics": res["metrics"], "rtf": res["rtf"],
                             "seconds": res["seconds"], "elapsed": res["elapsed"], "sample_rate": res["sample_rate"]})

    async def post_reconstruct(request: Request) -> Response:
        form = await read_fields(request, RECONSTRUCT)
        served = pick(form, ("vae",))
        data = await file_bytes(form, "image")
        tile = number(form, "tile_size", int)
        tile = 512 if tile is None else tile
        if tile != 0 and not 64 <= tile <= 4096:
            raise BadRequest(f"tile_size must be 0 (never tile) or 64..4096 px, not {tile}")
        res = await run(request, form, served, lambda job: served.reconstruct(data, job, limits, tile))
        return Response(res["png"], media_type="image/png", headers={
            "X-PSNR-dB": f"{res['psnr']:.3f}", "X-Tiled": "yes" if res["tiled"] else "no",
            "X-Tile-Size": str(res["tile_size"]),
            "X-Image-Size": f"{res['width']}x{res['height']}", "X-Elapsed-Seconds": f"{res['elapsed']:.3f}"})

    async def post_cancel(request: Request) -> Response:
        """True when the request was waiting or running: it ends at its next sentence or tile, and answers 409."""
        job = jobs.get(request.path_params["request_id"])
        if job is not None:
            job.cancelled.set()
        return JSONResponse({"cancelled": job is not None})

    def cancel_all() -> int:
        """Cancel every request waiting or running (the server is stopping); how many there were."""
        for job in list(jobs.values()):
            job.cancelled.set()
        return len(jobs)

    routes = [Route("/", guarded(index)), Route("/models", guarded(list_models)),
              Route("/speak", guarded(speak), methods=["GET", "POST"]),
              Route("/api/tts", guarded(speak), methods=["GET", "POST"]),  # coqui's tts-server path
              Route("/vocode", guarded(post_vocode), methods=["POST"]),
              Route("/reconstruct", guarded(post_reconstruct), methods=["POST"]),
              Route("/cancel/{request_id}", guarded(post_cancel), methods=["POST"])]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, access=access or Access())])
    app.state.jobs, app.state.cancel_all = jobs, cancel_all
    return app


def json_fields(body: bytes) -> list[tuple[str, str]]:
    """A JSON body → (name, value) pairs as a form would give them: numbers as text, null as not sent."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the request body is not valid JSON ({str(e)[:80]}): send an object such as "
                         '{"text": "Salom!", "speaker": "anna"}') from None
    if not isinstance(data, dict):
        raise BadRequest(f"the JSON body is {type(data).__name__ if data is not None else 'null'}, not an object: "
                         'send {"text": "Salom!", ...}')
    items = []
    for name, value in data.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise BadRequest(f"the JSON field {name[:40]!r} is {json.dumps(value)[:40]}: give a string or a number")
        items.append((name, "" if value is None else str(value)))
    return items


def stall_limited(receive: Receive, seconds: float) -> Receive:
    """`receive` that gives up when the request body stops arriving for `seconds` (408, and the connection is
    closed): a client that sends headers and then stalls must not hold a request open for ever."""
    done = False

    async def timed() -> Message:
        nonlocal done
        if done:  # the body is in: what follows is the client leaving, which may take as long as the request
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), seconds)
        except TimeoutError:
            raise BadRequest(f"the request body stalled: nothing arrived for {seconds:g} s (the server's "
                             "--body_timeout); send it again", 408, {"Connection": "close"}) from None
        done = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return timed
