"""The one streaming shape both TTS models read long text with (`tts.vits.synthesize.stream`,
`tts.clone.infer.stream`, over `tts.text.sentences.speak_sentences`): sentences in, one audio chunk per spoken
sentence out, the pause between sentences inside the next chunk, a cancel asked between sentences. On the serve
tests' tiny random models (tests/serve/tiny.py): a second to build, no training."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

from tests.serve.tiny import make_tiny_checkpoints, wav_file_bytes
from tts.text.sentences import NothingToSay, SpokenSentence, plan, speak_sentences

TEXT = "Bir ikki uch. Tort besh.\n\n*** \n\nOlti yetti."  # three sentences to say, one with nothing to say


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"vits": stream(...) with the tiny VITS bound, "clone": the same with the tiny cloning model}."""
    from tts.clone import infer as clone
    from tts.clone.data import load_reference
    from tts.vits import synthesize as vits

    root = tmp_path_factory.mktemp("stream")
    paths = make_tiny_checkpoints(root)
    gen, cfg, _ = vits.load_generator(paths["vits"])
    model, ccfg = clone.load_clone_model(paths["clone"])
    voc = clone.load_matching_vocoder(ccfg.vocoder.path, ccfg.audio)
    (root / "ref.wav").write_bytes(wav_file_bytes(1.5))
    ref = load_reference(root / "ref.wav", ccfg.audio, ccfg.data)
    return {"vits": (lambda sentences, **kw: vits.stream(gen, cfg, sentences, **kw), cfg.audio.sample_rate),
            "clone": (lambda sentences, **kw: clone.stream(model, sentences, ref, voc, **kw), voc.sample_rate)}


def test_both_models_stream_with_the_same_shape():
    """The same name, the same parameters after each model's own: a caller switches models, not code."""
    from tts.clone.infer import stream as clone_stream
    from tts.vits.synthesize import stream as vits_stream

    shared = ["sentences", "sentence_pause", "paragraph_pause", "cancelled"]
    for fn in (vits_stream, clone_stream):
        names = list(inspect.signature(fn).parameters)
        assert [n for n in names if n in shared] == shared, fn.__module__
        assert inspect.signature(fn).return_annotation == "Iterator[SpokenSentence]", fn.__module__


@pytest.mark.parametrize("kind", ["vits", "clone"])
def test_one_chunk_per_spoken_sentence_with_the_pause_before_it(models, kind):
    stream, sr = models[kind]
    sentences = plan(TEXT)
    assert [after for _, after in sentences] == ["sentence", "paragraph", "paragraph", "end"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chunks = list(stream(sentences, sentence_pause=0.25, paragraph_pause=0.5))
    assert all(isinstance(c, SpokenSentence) and c.audio.dtype == np.float32 for c in chunks)
    assert [c.index for c in chunks] == [0, 1, 3]  # "***" has nothing to say: skipped
    pauses = [0, round(0.25 * sr), round(0.5 * sr)]  # none before the first; the paragraph pause after "Tort besh."
    for chunk, pause in zip(chunks, pauses):
        assert len(chunk.audio) == pause + round(chunk.seconds * sr) and chunk.seconds > 0
        assert not chunk.audio[:pause].any()


@pytest.mark.parametrize("kind", ["vits", "clone"])
def test_a_cancel_stops_the_stream_after_the_current_sentence(models, kind):
    stream, _ = models[kind]
    asked: list[int] = []

    def cancelled() -> bool:  # asked before each sentence; the cancel arrives while the first is spoken
        asked.append(1)
        return len(asked) > 1

    chunks = list(stream(plan("Bir. Ikki. Uch. Tort."), cancelled=cancelled))
    assert [c.text for c in chunks] == ["Bir."] and len(asked) == 2


@pytest.mark.filterwarnings("ignore:dropped unknown characters")
@pytest.mark.parametrize("kind", ["vits", "clone"])
def test_nothing_to_say_is_a_user_error(models, kind):
    stream, _ = models[kind]
    with pytest.raises(NothingToSay, match="nothing to say: the text is empty"):
        list(stream(plan("   ")))
    with pytest.raises(NothingToSay, match="nothing to say in '🎉 👍' after normalisation"):
        list(stream(plan("🎉 👍")))


def test_the_loop_is_lazy_and_cancelled_before_the_first_sentence_says_nothing():
    """A stream cancelled before it starts ends quietly (the caller knows it cancelled), not with NothingToSay."""
    said: list[str] = []

    def speak(sentence: str) -> np.ndarray:
        said.append(sentence)
        return np.ones(10, np.float32)

    gen = speak_sentences(plan("Bir. Ikki."), speak, 100, 0.1, 0.2)
    assert said == []  # nothing runs until the first chunk is asked for
    assert next(gen).text == "Bir." and said == ["Bir."]
    assert list(speak_sentences(plan("Bir. Ikki."), speak, 100, 0.1, 0.2, cancelled=lambda: True)) == []
