"""The G update's critic call (real half without grad, fake half with grad) gives the generator the
same gradients as the former single call on cat([real, fake]), for every critic kind including the
spectral-norm MSD sub-critic."""

import pytest
import torch

from vocoder.discriminators import head_outputs, split_outputs
from vocoder.losses import feature_matching_loss, generator_adv_loss
from vocoder.train import VocoderTrainer

from .conftest import tiny_config

QUIET = dict(device="cpu", log=lambda *a, **k: None)


def _g_grads(tr: VocoderTrainer, d_real: dict, d_fake: dict, b: int) -> list[torch.Tensor]:
    adv, _ = generator_adv_loss(d_fake)
    fm, _ = feature_matching_loss(d_real, head_outputs(d_fake, b))
    params = [p for p in tr.generator.parameters() if p.requires_grad]
    return torch.autograd.grad(adv + fm, params, allow_unused=True, retain_graph=True)


def test_split_critic_call_gives_the_concatenated_calls_grads(tiny_data, tmp_path):
    tr = VocoderTrainer(tiny_config("model_args.discriminators=[mpd,msd,mrd,fast_mpd]"), tiny_data, tmp_path,
                        **QUIET)
    tr.sampler.set_epoch(0)
    batch = next(iter(tr.loader))
    real, b = batch["audio"], batch["audio"].shape[0]
    fake = tr.generator(batch["mel"], batch["f0"])
    tr._set_d_grad(False)
    spectral_state = {k: v.clone() for k, v in tr.discriminator.state_dict().items()}  # power-iteration u, v

    d_real, d_fake = split_outputs(tr._critics_no_ddp(torch.cat([real, fake])), b)  # the former call
    old = _g_grads(tr, d_real, d_fake, b)
    u_after_old = {k: v.clone() for k, v in tr.discriminator.state_dict().items()}

    tr.discriminator.load_state_dict(spectral_state)
    d_real, d_fake = tr._critic_outputs(real, fake)
    new = _g_grads(tr, d_real, d_fake, b)

    assert sum(g is not None for g in new) > 10
    for go, gn in zip(old, new):
        assert (go is None) == (gn is None)
        if go is not None:
            torch.testing.assert_close(gn, go, rtol=1e-4, atol=1e-5 * go.abs().max().item() + 1e-9)
    # one spectral-norm power iteration per G update, as the single call did
    for k, v in tr.discriminator.state_dict().items():
        torch.testing.assert_close(v, u_after_old[k], rtol=1e-5, atol=1e-6)


def test_generator_only_warmup_leaves_the_critics_untouched_until_their_start(tiny_data, tmp_path):
    """discriminator_train_start_steps=2: steps 0-1 update the generator from the reconstruction
    losses alone (no critic update, no adversarial term logged); step 2 updates the critics."""
    tr = VocoderTrainer(tiny_config("discriminator_train_start_steps=2"), tiny_data, tmp_path, **QUIET)
    tr.sampler.set_epoch(0)
    batch = next(iter(tr.loader))
    d0 = [p.detach().clone() for p in tr.discriminator.parameters()]
    g0 = [p.detach().clone() for p in tr.generator.parameters()]
    for step in range(2):
        tr.step = step
        logs = tr.train_step(batch)
        assert "loss_d" not in logs and "loss_mel" in logs
    assert all(torch.equal(a, b) for a, b in zip(d0, tr.discriminator.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(g0, tr.generator.parameters()))
    tr.step = 2
    logs = tr.train_step(batch)
    assert "loss_d" in logs
    assert not all(torch.equal(a, b) for a, b in zip(d0, tr.discriminator.parameters()))


def test_negative_discriminator_start_is_refused():
    with pytest.raises(ValueError, match="discriminator_train_start_steps"):
        tiny_config("discriminator_train_start_steps=-1")


def test_energy_loss_weight_adds_its_term_to_the_generator_loss(tiny_data, tmp_path):
    """lab_aux_energyloss 0 (the default, as the references) adds nothing; > 0 logs and adds the
    weighted frame-energy L1."""
    def first_logs(*sets: str) -> dict:
        torch.manual_seed(0)
        tr = VocoderTrainer(tiny_config("discriminator_train_start_steps=5", *sets), tiny_data,
                            tmp_path / str(len(sets)), **QUIET)
        tr.sampler.set_epoch(0)
        return tr.train_step(next(iter(tr.loader)))

    plain, weighted = first_logs("lab_aux_energyloss=0"), first_logs("lab_aux_energyloss=4.0", "use_stftloss=true")
    assert "loss_energy" not in plain
    assert float(weighted["loss_energy"]) > 0
    torch.testing.assert_close(weighted["loss_g"], weighted["loss_mel"] + weighted["loss_energy"]
                               + weighted.get("loss_stft", torch.zeros(())))
