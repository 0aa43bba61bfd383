"""rFID: the Fréchet Inception Distance between the held-out images and their reconstructions.

PSNR, SSIM and LPIPS compare each image with its own reconstruction; rFID compares the two *sets* in the
feature space of the Inception network FID is defined on (Heusel et al. 2017): blur, lost texture or a
colour cast shift the whole distribution, which per-image figures average away. Lower is better; 0 = the
same statistics. The network is pytorch-fid's port of TensorFlow's FID Inception (2048-d pool features,
inputs bilinearly resized to 299 × 299), so the numbers are on pytorch-fid's scale. With the few hundred
held-out images of a run it is biased upwards (FID needs tens of thousands for the published scale):
compare runs on the same held-out set, not with papers.

Weights are never downloaded: `rfid_weights` names the file (`pt_inception-2015-12-05-6726825d.pth`,
https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth),
"" takes it from the torch hub cache (`~/.cache/torch/hub/checkpoints/`, where pytorch-fid puts it), and
"off" skips rFID. Without the package or the file, one line says rFID is off and validation goes on.
The file is data (`common.model_files`): a state dict (`.pth`/`.pt` read weights-only, or `.safetensors`),
never code; fp16 / bf16 / fp64 weights are converted to fp32. A file that cannot be used (pickled code, a
TorchScript module, NaN or infinite weights, another network's tensors) is the same one "rFID off" line naming
it — or, where the run ranks best.pt by rFID (`--best_by rfid`, `required`), one error line and exit 2 at
start, since the run could rank nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torch import nn

from common.model_files import ModelFileError, float32_weights, load_weights

WEIGHTS_NAME = "pt_inception-2015-12-05-6726825d.pth"
INSTALL_HINT = "pip install pytorch-fid==0.3.0"


def hub_weights() -> Path | None:
    """pytorch-fid's weights in the torch hub cache, when a download put them there."""
    path = Path(torch.hub.get_dir()) / "checkpoints" / WEIGHTS_NAME
    return path if path.is_file() else None


def fid_inception() -> nn.Module:
    """pytorch-fid's `fid_inception_v3` without its download: the network whose state dict the weights file
    holds (torchvision's Inception v3, 1008 classes, with pytorch-fid's FID blocks), default-initialised."""
    import pytorch_fid.inception as pfi

    net = pfi._inception_v3(num_classes=1008, aux_logits=False, weights=None)
    net.Mixed_5b = pfi.FIDInceptionA(192, pool_features=32)
    net.Mixed_5c = pfi.FIDInceptionA(256, pool_features=64)
    net.Mixed_5d = pfi.FIDInceptionA(288, pool_features=64)
    net.Mixed_6b = pfi.FIDInceptionC(768, channels_7x7=128)
    net.Mixed_6c = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6d = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6e = pfi.FIDInceptionC(768, channels_7x7=192)
    net.Mixed_7b = pfi.FIDInceptionE_1(1280)
    net.Mixed_7c = pfi.FIDInceptionE_2(2048)
    return net


def build_inception(state_dict: dict | None = None, seed: int = 0) -> nn.Module:
    """pytorch-fid's `InceptionV3` (the pool block: [B, 3, H, W] in [0, 1] → [B, 2048, 1, 1]) with `state_dict`
    (the FID weights), or random weights drawn from `seed` (He init; tests), in eval mode. The global RNG is untouched."""
    import pytorch_fid.inception as pfi

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if state_dict is None:
            inception = fid_inception()
            for m in inception.modules():  # He init: activations keep their scale through the 90 layers
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        else:
            with torch.device("meta"):  # built empty, filled by the weights: no init, no draw
                inception = fid_inception()
            inception.load_state_dict(state_dict, strict=True, assign=True)
        with mock.patch.object(pfi, "fid_inception_v3", lambda: inception):
            net = pfi.InceptionV3([pfi.InceptionV3.BLOCK_INDEX_BY_DIM[2048]], resize_input=True,
                                  normalize_input=True, use_fid_inception=True)
    return net.eval()


class InceptionFeatures:
    """Images in [-1, 1] ([B, 3, H, W], any size) → float64 Inception pool features [B, 2048], in fp32."""

    def __init__(self, net: nn.Module, device: str | torch.device = "cpu", source: str = "") -> None:
        self.net, self.device, self.source = net.to(device).eval(), torch.device(device), source

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> np.ndarray:
        x = ((images.float().clamp(-1, 1) + 1) / 2).to(self.device)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        with torch.autocast(self.device.type, enabled=False):
            feats = self.net(x)[0]
        return feats.flatten(1).double().cpu().numpy()


def load_inception(weights: str = "", device: str | torch.device = "cpu",
                   say: Callable[[str], None] = print, required: bool = False) -> InceptionFeatures | None:
    """The FID Inception with the weights of `weights` ("" = the torch hub cache's file), or None after one
    line saying why rFID is off ("off": nothing said). `required` (best.pt ranked by rfid): a file that cannot be
    used raises ModelFileError (one line naming it, exit 2) instead, since the run could rank nothing."""
    if weights == "off":
        return None

    def off(why: str) -> None:
        if required:
            raise ModelFileError(f"{why}; best_by rfid needs it")
        say(f"rFID off: {why}")

    path = Path(weights).expanduser() if weights else hub_weights()
    if path is None or not path.exists():
        where = f"{weights} is not a file" if weights else f"no {WEIGHTS_NAME} in {Path(torch.hub.get_dir()) / 'checkpoints'}"
        return off(f"{where} (rfid_weights: give the FID Inception weights file; nothing is downloaded)")
    what = "rFID weights (rfid_weights)"
    try:  # the file first: an unusable one is said whether or not the package is there
        state = float32_weights(load_weights(path, what), path, what)
    except ModelFileError as exc:
        return off(str(exc))
    try:
        import pytorch_fid.inception  # noqa: F401
    except ImportError:
        return off(f"pytorch-fid is not installed ({INSTALL_HINT})")
    try:
        return InceptionFeatures(build_inception(state), device, str(path))
    except Exception as exc:  # noqa: BLE001 (another network's tensors: the same answer, rFID is off)
        return off(f"{path} is not pytorch-fid's Inception weights ({type(exc).__name__}: "
                   f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")


def frechet_distance(feats_a: np.ndarray, feats_b: np.ndarray) -> float:
    """FID between two feature sets [N, D] (N ≥ 2 each): |μa − μb|² + tr Σa + tr Σb − 2 tr √(Σa Σb).

    The last trace is the nuclear norm of Ac Bcᵀ / √((Na − 1)(Nb − 1)) for the centred features Ac, Bc (the
    eigenvalues of Σa Σb are the squared singular values of that matrix): exact, real, and an N × N problem
    instead of pytorch-fid's D × D `sqrtm`, which is slow and unstable for the rank-deficient covariances
    of a few hundred images. NaN with fewer than 2 images in a set."""
    a, b = np.asarray(feats_a, np.float64), np.asarray(feats_b, np.float64)
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    mu_a, mu_b = a.mean(0), b.mean(0)
    ac, bc = a - mu_a, b - mu_b
    na, nb = len(a) - 1, len(b) - 1
    cross = np.linalg.svd(ac @ bc.T, compute_uv=False).sum() / np.sqrt(na * nb)
    value = float(((mu_a - mu_b) ** 2).sum() + (ac * ac).sum() / na + (bc * bc).sum() / nb - 2.0 * cross)
    return max(value, 0.0)
