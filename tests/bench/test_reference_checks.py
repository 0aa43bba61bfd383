"""The reference comparisons' edges (bench/): a wrong --reference_dir is one clear line, and the
effective-init comparison catches a layer whose weights are really N(0, 0.01)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import weight_norm
from torch.nn.utils.parametrizations import weight_norm as param_weight_norm

from bench import learning
from bench.reference_checks import compare_init
from bench.vocoder_reference import import_reference


def test_reference_dir_that_is_not_a_checkout_is_one_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="not an openvpi/SingingVocoders checkout"):
        import_reference(tmp_path)


@pytest.mark.parametrize("argv", [["--trainer", "vits", "--reference_dir", "x"], ["--trainer", "vocoder", "--same_init"]])
def test_reference_flags_need_the_vocoder_and_each_other(argv):
    with pytest.raises(SystemExit) as e:
        learning.main(argv)
    assert e.value.code == 2


def test_compare_init_sees_old_hook_and_parametrized_weights_alike_and_catches_a_wrong_rule():
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(weight_norm(torch.nn.Conv1d(64, 64, 7)))  # old hook API
    ours = torch.nn.Sequential(param_weight_norm(torch.nn.Conv1d(64, 64, 7)))
    res = compare_init(ours, theirs)
    assert res["compared"] == 2 and not res["differs"] and not res["only_ours"] and not res["only_theirs"]
    with torch.no_grad():  # weights really N(0, 0.01): the vocoder's pre-issue-10 init
        v = torch.randn_like(ours[0].parametrizations.weight.original1) * 0.01
        ours[0].parametrizations.weight.original1.copy_(v)
        ours[0].parametrizations.weight.original0.copy_(v.flatten(1).norm(dim=1).view(-1, 1, 1))
    assert [d.split(":")[0] for d in compare_init(ours, theirs)["differs"]] == ["0.weight"]


def test_learning_recipes_keep_the_critics_from_step_0_and_no_energy_term():
    """The demo configs are the bench's base; what the demos add for their minutes of CPU (a late
    critic start, the frame-energy term) must not leak into a comparison with the references."""
    from common.config import load_config
    from tts.vits import demo as vits_demo
    from tts.vits.config import TrainConfig
    from vocoder.config import VocoderConfig
    from vocoder.demo import CONFIG as VOCODER_CONFIG

    vits = load_config(str(vits_demo.CONFIG), TrainConfig, learning.RECIPE["vits"])
    assert vits.discriminator_train_start_steps == 0 and vits.c_energy == 0.0
    voc = load_config(VOCODER_CONFIG, VocoderConfig, learning.RECIPE["vocoder"])
    assert voc.discriminator_train_start_steps == 0 and voc.lab_aux_energyloss == 0.0
