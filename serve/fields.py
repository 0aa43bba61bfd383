"""What each endpoint reads, under its own names and the names Piper's and coqui's servers use for the same thing.

A program written for Piper (`speaker_id`, `noise_w` / `noise_w_scale`) or coqui's `tts-server` (`speaker_id`,
`speaker_wav`) should get what it asked for here, and a field this server does not read must never be dropped in
silence: a typo such as `lenght_scale` would otherwise give a 200 and the same wav as without it, and the user
would believe the setting did nothing. So every field a request sends is either one of its endpoint's names, an
alias of one (`ALIASES`, mapped to our name), or a 400 naming the closest known name (`canonical`). The table in
docs/serve.md ("Field names") lists the same names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from serve.models import BadRequest


@dataclass(frozen=True)
class FieldSet:
    """The fields one endpoint reads (`names`, ours) and the other projects' names for some of them (`aliases`:
    theirs → ours); `hints`: names that mean different things elsewhere, answered with what to send instead."""

    endpoint: str
    names: tuple[str, ...]
    aliases: dict[str, str] = field(default_factory=dict)
    hints: dict[str, str] = field(default_factory=dict)


SPEAK = FieldSet(
    "/speak",
    ("model", "text", "speaker", "noise_scale", "length_scale", "noise_scale_w", "seed", "reference", "vocoder",
     "request_id"),
    aliases={"speaker_id": "speaker",  # Piper's /synthesize and coqui's /api/tts
             "noise_w": "noise_scale_w", "noise_w_scale": "noise_scale_w",  # Piper (old and piper1-gpl)
             "speaker_wav": "reference"},  # coqui: the clip of the voice to clone (here an upload, never a path)
    # Piper's /synthesize names the voice model `voice`, OpenAI's speech API (coqui's /v1/audio/speech) a speaker.
    hints={"voice": "name the model with model= (an id from GET /models) and the speaker with speaker="},
)
VOCODE = FieldSet("/vocode", ("model", "audio", "request_id"))
RECONSTRUCT = FieldSet("/reconstruct", ("model", "image", "tile_size", "request_id"))


def canonical(items: Iterable[tuple[str, Any]], fields: FieldSet) -> dict[str, Any]:
    """A request's (name, value) pairs → {our name: value}. An empty value counts as not sent (the page and curl
    send empty optional fields). Refused with one line: a name the endpoint does not read (with the closest
    known name), and a field given twice with different values, under one name or an alias."""
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # our name → the name the request used for it
    for name, value in items:
        ours = fields.aliases.get(name, name)
        if ours not in fields.names:
            raise BadRequest(unknown_field(name, fields))
        if isinstance(value, str) and value == "":
            continue
        if ours in out and not same_value(out[ours], value):
            raise BadRequest(f"{ours} is given twice with different values ({given_as[ours]}={short(out[ours])}, "
                             f"{name}={short(value)}): send it once")
        out[ours], given_as[ours] = value, name
    return out


def unknown_field(name: str, fields: FieldSet) -> str:
    """The one line that refuses `name`: the closest name the endpoint knows, or all of them."""
    if name.lstrip().startswith(("{", "[")):
        return ("the body looks like JSON but came as a form: send it with the header "
                "Content-Type: application/json")
    if name in fields.hints:
        return f"unknown field {name!r} for {fields.endpoint}: {fields.hints[name]}"
    known = [*fields.names, *fields.aliases]
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown field {short(name)} for {fields.endpoint} (did you mean {close[0]!r}?)"
    return f"unknown field {short(name)} for {fields.endpoint}; it reads {', '.join(fields.names)}"


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of one field say the same: equal text; two uploads never do."""
    return isinstance(a, str) and isinstance(b, str) and a == b


def short(value: Any) -> str:
    """A value as a message shows it: quoted and at most 40 characters; an upload as 'a file'."""
    return repr(value[:40]) if isinstance(value, str) else "a file"
