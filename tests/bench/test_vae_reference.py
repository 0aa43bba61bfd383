"""The latent-diffusion comparison's own logic (bench/vae_reference.py): one config mapped onto their
loss, Lightning's optimizer toggling, clear errors. With LDM_REFERENCE_DIR (and TAMING_REFERENCE_DIR)
pointing at checkouts, one step of each loop is also checked against the other; skipped otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bench import learning
from bench.vae_reference import (
    REFERENCE_RECIPE,
    import_reference,
    lightning_step,
    reference_loss_params,
)
from common.config import load_config
from vae.config import VAEConfig

DEMO = Path(__file__).resolve().parents[2] / "vae" / "configs" / "demo.yaml"


def recipe(*extra: str) -> VAEConfig:
    return load_config(DEMO, VAEConfig, [*learning.RECIPE["vae"], *REFERENCE_RECIPE, *extra])


def test_a_folder_that_is_not_a_checkout_is_one_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="not a CompVis/latent-diffusion checkout"):
        import_reference(tmp_path)
    for f in ("ldm/models/autoencoder.py", "ldm/modules/losses/contperceptual.py",
              "ldm/modules/distributions/distributions.py", "ldm/modules/diffusionmodules/model.py", "ldm/util.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    with pytest.raises(SystemExit, match="taming-transformers not found .*src/taming-transformers"):
        import_reference(tmp_path)


@pytest.mark.parametrize("argv", [["--trainer", "vocoder", "--taming_dir", "x", "--reference_dir", "y"],
                                  ["--trainer", "vae", "--taming_dir", "x"],
                                  ["--trainer", "vae", "--reference_dir", "x", "--same_init"]])
def test_reference_flags_fit_together(argv):
    with pytest.raises(SystemExit) as e:
        learning.main(argv)
    assert e.value.code == 2


def test_one_config_maps_onto_their_loss_and_the_gan_is_off_on_both_sides_without_our_critic():
    off = reference_loss_params(recipe(), steps=600)  # the demo: disc_weight 0, no critic on our side
    assert off["disc_start"] == 601 and off["disc_weight"] == 0.0  # their adopt_weight is 0 at every step
    assert off["kl_weight"] == 1e-6 and off["perceptual_weight"] == 0.0 and off["logvar_init"] == 0.0
    on = reference_loss_params(recipe("disc_weight=0.5", "disc_start=300"), steps=600)
    assert on["disc_start"] == 300 and on["disc_weight"] == 0.5 and on["disc_num_layers"] == 3
    assert on["disc_loss"] == "hinge" and on["disc_factor"] == 1.0


@pytest.mark.parametrize("override, reason", [("perceptual_weight=1.0", "perceptual_weight must be 0"),
                                              ("adam_beta1=0.9", "fixed in their configure_optimizers"),
                                              ("learn_logvar=true", "never trains"),
                                              ("rec_loss=l2", "rec_loss must be l1")])
def test_what_their_loop_cannot_express_is_refused(override, reason):
    with pytest.raises(SystemExit, match=reason):
        reference_loss_params(recipe(override), steps=10)


class TwoOptimizerModel(torch.nn.Module):
    """A LightningModule-shaped toy: records which parameters were trainable in each training_step."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
        self._bench_step = 0
        self.seen = []

    def training_step(self, batch, batch_idx, optimizer_idx):
        self.seen.append((optimizer_idx, self.a.weight.requires_grad, self.b.weight.requires_grad))
        return self.b(self.a(batch)).square().mean()


def test_lightning_step_freezes_the_other_optimizers_parameters_and_restores_them():
    torch.manual_seed(0)
    m = TwoOptimizerModel()
    opts = [torch.optim.Adam(m.a.parameters(), lr=0.1), torch.optim.Adam(m.b.parameters(), lr=0.1)]
    a0, b0 = m.a.weight.detach().clone(), m.b.weight.detach().clone()
    losses = lightning_step(m, opts, torch.randn(4, 3), 0)
    assert m.seen == [(0, True, False), (1, False, True)]
    assert all(p.requires_grad for p in m.parameters()) and all(p.grad is None for p in m.parameters())
    assert len(losses) == 2 and m._bench_step == 1
    assert not torch.equal(m.a.weight, a0) and not torch.equal(m.b.weight, b0)


LDM = os.environ.get("LDM_REFERENCE_DIR", "")
TAMING = os.environ.get("TAMING_REFERENCE_DIR", "") or None


@pytest.mark.skipif(not (LDM and (Path(LDM) / "ldm" / "models" / "autoencoder.py").is_file()),
                    reason="set LDM_REFERENCE_DIR (and TAMING_REFERENCE_DIR) to CompVis checkouts")
def test_their_first_step_is_our_objective_times_the_pixels_per_image():
    from bench.vae_reference import ReferenceTrainer, same_output_check
    from vae.step import VAEStep

    cfg = recipe("disc_weight=0.5", "disc_start=0")  # the GAN from the first step: the whole objective
    torch.manual_seed(cfg.seed)
    ours = VAEStep(cfg, torch.device("cpu"), total_steps=2)
    theirs = ReferenceTrainer(import_reference(LDM, TAMING), ours, steps=2)
    x = torch.rand(2, 3, cfg.image_size, cfg.image_size) * 2 - 1
    assert same_output_check(ours, theirs, x, 7).endswith("= 0")
    torch.manual_seed(7)
    logs = ours.train_step([x], 0)  # train_step returns its logs (common.loop)
    torch.manual_seed(7)
    their_ae_loss, _ = lightning_step(theirs.model, theirs.optimizers, {"image": x.permute(0, 2, 3, 1)}, 0)
    assert their_ae_loss == pytest.approx(float(logs["total"]) * x[0].numel(), rel=1e-4)
