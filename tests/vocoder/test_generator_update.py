"""The G update's critic call (real half without grad, fake half with grad) gives the generator the
same gradients as the former single call on cat([real, fake]), for every critic kind including the
spectral-norm MSD sub-critic."""

import torch

from vocoder.losses import feature_matching_loss, generator_adv_loss
from vocoder.train import VocoderTrainer, _head, _split

from .conftest import tiny_config

QUIET = dict(device="cpu", log=lambda *a, **k: None)


def _g_grads(tr: VocoderTrainer, d_real: dict, d_fake: dict, b: int) -> list[torch.Tensor]:
    adv, _ = generator_adv_loss(d_fake)
    fm, _ = feature_matching_loss(d_real, _head(d_fake, b))
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

    d_real, d_fake = _split(tr._d_plain(torch.cat([real, fake])), b)  # the former call
    old = _g_grads(tr, d_real, d_fake, b)
    u_after_old = {k: v.clone() for k, v in tr.discriminator.state_dict().items()}

    tr.discriminator.load_state_dict(spectral_state)
    d_real, d_fake = tr.critics_for_generator(real, fake)
    new = _g_grads(tr, d_real, d_fake, b)

    assert sum(g is not None for g in new) > 10
    for go, gn in zip(old, new):
        assert (go is None) == (gn is None)
        if go is not None:
            torch.testing.assert_close(gn, go, rtol=1e-4, atol=1e-5 * go.abs().max().item() + 1e-9)
    # one spectral-norm power iteration per G update, as the single call did
    for k, v in tr.discriminator.state_dict().items():
        torch.testing.assert_close(v, u_after_old[k], rtol=1e-5, atol=1e-6)
