"""common/ is model-agnostic: no trainer's name appears in its code (docs/DESIGN "common/ contracts").

What a trainer needs from common/ it passes in (its preset table, its name for the checkpoint it writes);
where common/ needs every trainer (`make check`, naming the trainer that wrote a checkpoint) it reads what
each trainer declares (`common.trainers`), never a name of its own. This test reads every common/*.py as
Python tokens — identifiers, strings (docstrings included) and comments — and fails on a trainer's name
in any of them (case-insensitive, inside longer words too, as `grep -i` finds it). The one exception is the
tensor method `.clone()`, which is torch's, not the cloning trainer's.

SKIPPED lists files that still name a trainer and could not be reworded in the change that added this test,
each with why; a listed file that no longer names one fails `test_skip_list_is_not_stale`, so the list only
shrinks.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMON = ROOT / "common"
TRAINER_NAMES = re.compile(r"vocoder|vits|clon(?:e|ing)|vae|tts", re.IGNORECASE)
TEXT_TOKENS = {tokenize.NAME, tokenize.STRING, tokenize.COMMENT} | (
    {tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set())

# file -> why it is skipped for now (another change owned the file when this test was added; its hits are
# comments and docstrings only). Reword the hits, then remove the entry.
SKIPPED: dict[str, str] = {}


def trainer_names(source: str) -> list[tuple[int, str]]:
    """(line, token text) of every identifier, string or comment that names a trainer."""
    hits, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in TEXT_TOKENS and TRAINER_NAMES.search(tok.string):
            method = tok.type == tokenize.NAME and tok.string == "clone" and previous is not None \
                and previous.type == tokenize.OP and previous.string == "."
            if not method:  # `tensor.clone()` is torch's
                hits.append((tok.start[0], tok.string.strip().splitlines()[0][:100]))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            previous = tok
    return hits


def common_files() -> list[Path]:
    return sorted(COMMON.glob("*.py"))


@pytest.mark.parametrize("path", [p for p in common_files() if p.name not in SKIPPED], ids=lambda p: p.name)
def test_common_names_no_trainer(path):
    hits = trainer_names(path.read_text(encoding="utf-8"))
    assert not hits, (f"common/{path.name} names a trainer (common/ is model-agnostic: take what a trainer must "
                      f"give as an argument, or read what trainers declare through common.trainers): {hits}")


def test_skip_list_is_not_stale():
    names = {p.name for p in common_files()}
    assert set(SKIPPED) <= names, f"no such file in common/: {sorted(set(SKIPPED) - names)}"
    clean = [name for name in SKIPPED if not trainer_names((COMMON / name).read_text(encoding="utf-8"))]
    assert not clean, f"these no longer name a trainer: remove them from SKIPPED so the test covers them: {clean}"


def test_the_check_finds_a_name_and_spares_tensor_clone():
    source = ('"""Doc for the VAE."""\n'
              'SCRIPT = "vocoder/train.py"  # a comment on tts\n'
              'def f(x, voice_cloning=1):\n'
              '    y = x.detach().clone()\n'
              '    return f"{x}SingingVocoders"\n')
    found = [text for _, text in trainer_names(source)]
    assert len(found) == 5 and "voice_cloning" in found and not any(t == "clone" for t in found), found
