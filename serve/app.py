"""The HTTP API and the page: a small Starlette (ASGI) app over the models of `serve.models`.

    GET  /                 the page (serve/static/index.html): Speak, Vocode, Reconstruct, Compare
    GET  /models           the loaded models (id, kind, label, speakers, scales) and the upload limits
    POST /speak            form: model, text, [speaker, noise_scale, length_scale, noise_scale_w, seed,
                           reference (file, cloning), vocoder (a vocoder's id, cloning)] → audio/wav
    POST /vocode           form: model, audio (file) → JSON: wav + recording (base64), spectrograms (PNG,
                           base64), metrics
    POST /reconstruct      form: model, image (file), [tile_size] → image/png (PSNR in X-PSNR-dB)
    POST /cancel/{id}      cancels the request sent with form field request_id=<id>

Timings come back in headers (X-Real-Time-Factor, X-Audio-Seconds, X-Elapsed-Seconds) or JSON fields. A bad
request is a 4xx with {"error": one line}: the message of the `common.errors.UserError` that refused it, as the
code that found the problem worded it; nothing the user sends is ever shown back as a traceback. Inference
runs in the thread pool, one request at a time per model (`serve.models.locked`), so the server keeps answering
while a model works, and a request is cancelled by /cancel or by the client going away.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from common.errors import UserError
from serve.models import BadRequest, Cancelled, Job, Limits, Served

STATIC = Path(__file__).resolve().parent / "static"
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
log = logging.getLogger("serve")


def create_app(models: dict[str, Served], limits: Limits | None = None) -> Starlette:
    """The app over already loaded `models` ({id: Served}); tests build it on tiny ones."""
    limits = limits or Limits()
    jobs: dict[str, Job] = {}

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

    async def read_form(request: Request):
        size = request.headers.get("content-length", "")
        if not size.isdigit():
            raise BadRequest("send the request with a Content-Length (a file upload of known size)", 411)
        if int(size) > limits.max_upload_bytes + 64 * 1024:  # the form's own fields and boundaries besides the file
            raise BadRequest(f"the upload is {int(size) / 2**20:.1f} MB, more than the limit of "
                             f"{limits.max_upload_bytes / 2**20:g} MB (--max_upload_mb)", 413)
        try:
            return await request.form(max_files=2, max_fields=20)
        except Exception as e:  # noqa: BLE001 - a malformed body is the sender's error, said in one line
            raise BadRequest(f"the request body is not a readable form ({type(e).__name__}): send multipart/form-data "
                             "or application/x-www-form-urlencoded") from None

    async def file_bytes(form, name: str, required: bool = True) -> bytes | None:
        item = form.get(name)
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
            return kind(str(value))
        except ValueError:
            raise BadRequest(f"{name} must be a number, not {str(value)[:40]!r}") from None

    async def run(request: Request, form, work: Callable[[Job], dict]) -> dict:
        """`work(job)` in the thread pool, cancelled by /cancel/<request_id> or by the client leaving."""
        rid = str(form.get("request_id") or uuid.uuid4().hex)
        if not REQUEST_ID.match(rid):
            raise BadRequest("request_id may hold only letters, digits, '-' and '_' (at most 64)")
        job = jobs[rid] = Job()

        async def watch() -> None:
            while not job.cancelled.is_set():
                if await request.is_disconnected():
                    job.cancelled.set()
                    return
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        try:
            return await run_in_threadpool(work, job)
        finally:
            watcher.cancel()
            jobs.pop(rid, None)

    def guarded(handler):
        """One line for every failure: a 4xx for what the user sent, a 500 (logged here) for our own."""
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except UserError as e:  # what the user sent, in the words the code that found it raised
                return JSONResponse({"error": str(e)}, status_code=getattr(e, "status", 400))
            except Cancelled:
                return JSONResponse({"error": "cancelled"}, status_code=409)
            except Exception as e:  # noqa: BLE001 - the server keeps serving; the log has the traceback
                log.exception("request failed")
                return JSONResponse({"error": f"the server failed on this request ({type(e).__name__}); "
                                              "its log has the details"}, status_code=500)
        return endpoint

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def list_models(request: Request) -> Response:
        return JSONResponse({"models": [m.public() for m in models.values()],
                             "limits": {"max_upload_mb": limits.max_upload_bytes / 2**20,
                                        "max_audio_seconds": limits.max_audio_seconds,
                                        "max_pixels": limits.max_pixels, "max_text_chars": limits.max_text_chars}})

    async def post_speak(request: Request) -> Response:
        form = await read_form(request)
        served = pick(form, ("vits", "clone"))
        reference = await file_bytes(form, "reference", required=False)
        vocoder = pick(form, ("vocoder",), "vocoder") if form.get("vocoder") else None
        if vocoder is not None and vocoder.kind != "vocoder":
            raise BadRequest(f"vocoder={vocoder.id} is a {vocoder.kind} model, not a vocoder")
        scales = {k: number(form, k) for k in ("noise_scale", "length_scale", "noise_scale_w")}
        seed = number(form, "seed", int) or 0
        res = await run(request, form, lambda job: served.speak(str(form.get("text") or ""), job, limits,
                                                                form.get("speaker"), scales, seed, reference, vocoder))
        return Response(res["wav"], media_type="audio/wav", headers={
            "X-Real-Time-Factor": f"{res['rtf']:.4f}", "X-Audio-Seconds": f"{res['seconds']:.3f}",
            "X-Elapsed-Seconds": f"{res['elapsed']:.3f}", "X-Sentences": str(res["sentences"]),
            "Content-Disposition": f'attachment; filename="{served.id}.wav"'})

    async def post_vocode(request: Request) -> Response:
        form = await read_form(request)
        served = pick(form, ("vocoder",))
        data = await file_bytes(form, "audio")
        res = await run(request, form, lambda job: served.vocode(data, job, limits))
        b64 = {k: base64.b64encode(res[k]).decode("ascii") for k in ("wav", "original", "png")}
        return JSONResponse({"model": served.id, "wav": b64["wav"], "original": b64["original"],
                             "spectrograms_png": b64["png"], "metrics": res["metrics"], "rtf": res["rtf"],
                             "seconds": res["seconds"], "elapsed": res["elapsed"], "sample_rate": res["sample_rate"]})

    async def post_reconstruct(request: Request) -> Response:
        form = await read_form(request)
        served = pick(form, ("vae",))
        data = await file_bytes(form, "image")
        tile = number(form, "tile_size", int)
        tile = 512 if tile is None else tile
        if tile != 0 and not 64 <= tile <= 4096:
            raise BadRequest(f"tile_size must be 0 (never tile) or 64..4096 px, not {tile}")
        res = await run(request, form, lambda job: served.reconstruct(data, job, limits, tile))
        return Response(res["png"], media_type="image/png", headers={
            "X-PSNR-dB": f"{res['psnr']:.3f}", "X-Tiled": "yes" if res["tiled"] else "no",
            "X-Image-Size": f"{res['width']}x{res['height']}", "X-Elapsed-Seconds": f"{res['elapsed']:.3f}"})

    async def post_cancel(request: Request) -> Response:
        job = jobs.get(request.path_params["request_id"])
        if job is not None:
            job.cancelled.set()
        return JSONResponse({"cancelled": job is not None})

    routes = [Route("/", guarded(index)), Route("/models", guarded(list_models)),
              Route("/speak", guarded(post_speak), methods=["POST"]),
              Route("/vocode", guarded(post_vocode), methods=["POST"]),
              Route("/reconstruct", guarded(post_reconstruct), methods=["POST"]),
              Route("/cancel/{request_id}", guarded(post_cancel), methods=["POST"])]
    return Starlette(routes=routes)
