"""common.safetensors_io over the `safetensors` package: every dtype the format has (an fp8 FLUX/SD3
all-in-one file whose VAE is bf16 loads through `--init_from`, and only the VAE's tensors are read),
our one-line errors for damaged files, and tensors that are copies, not views of the mapped file."""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import common.safetensors_io as sio
from common.checkpoint import CheckpointError
from common.safetensors_io import SafetensorsError, load_safetensors, safetensors_header, save_safetensors
from vae.config import VAEConfig
from vae.model import build_vae
from vae.pretrained import init_weights
from vae.single_file import ldm_to_ours_key

# FLUX's VAE layout (16 latent channels, no quant convs), two narrow levels; the LDM layout fixes 32 groups
ARCH = {"channels": [32, 32], "z_channels": 16, "layers_per_block": 1, "norm_num_groups": 32, "use_quant_conv": False}
# The diffusion model and text encoder of an fp8 all-in-one FLUX file (ComfyUI layout: the VAE under `vae.`)
OTHERS = {
    "model.diffusion_model.double_blocks.0.img_attn.qkv.weight": torch.float8_e4m3fn,
    "model.diffusion_model.double_blocks.0.img_mlp.0.weight": torch.float8_e5m2,
    "model.diffusion_model.double_blocks.0.img_attn.norm.key_norm.scale": torch.bfloat16,
    "model.diffusion_model.final_layer.linear.weight": torch.float8_e4m3fn,
    "text_encoders.t5xxl.transformer.shared.weight": torch.float8_e4m3fn,
    "text_encoders.t5xxl.scaled_fp8": torch.float8_e4m3fn,
    "text_encoders.clip_l.token_ids": torch.uint16,
    "text_encoders.clip_l.position_ids": torch.uint32,
    "model.diffusion_model.step_count": torch.uint64,
}
# our key part -> latent-diffusion's (the inverse of vae.single_file.LDM_TO_OURS)
OURS_TO_LDM = ((r"\.(down|up)\.(\d+)\.blocks\.", r".\1.\2.block."), (r"\.skip\.", ".nin_shortcut."),
               (r"\.mid\.attn\.proj\.", ".mid.attn_1.proj_out."), (r"\.mid\.attn\.", ".mid.attn_1."))


def _ldm_key(key: str) -> str:
    key = "." + key
    for pattern, repl in OURS_TO_LDM:
        key = re.sub(pattern, repl, key)
    return key[1:]


def _cfg() -> VAEConfig:
    """A run whose model is ARCH (only its layout is checked against the file's)."""
    return VAEConfig(**ARCH)


def _other(dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(4, 8, generator=g).to(dtype)
    return torch.randint(0, 60000, (4, 8), generator=g).to(dtype)  # via int64: arange/randint lack uint16/32/64


def _all_in_one(path) -> tuple[dict, dict]:
    """An fp8 all-in-one FLUX file, written by the `safetensors` package: (our VAE's weights, the others)."""
    torch.manual_seed(0)
    ours = build_vae(ARCH).state_dict()
    vae = {}
    for key, t in ours.items():
        ldm = _ldm_key(key)
        assert ldm_to_ours_key(ldm) == key, key
        if re.fullmatch(r".+\.mid\.attn\.(q|k|v|proj)\.weight", key):
            t = t[:, :, None, None]  # LDM's attention q/k/v/proj_out are 1x1 convs
        vae[f"vae.{ldm}"] = t.to(torch.bfloat16).contiguous()
    others = {k: _other(dtype, i) for i, (k, dtype) in enumerate(OTHERS.items())}
    save_file({**others, **vae}, str(path), metadata={"format": "pt", "modelspec.architecture": "Flux.1-dev"})
    return {k: v.to(torch.bfloat16).float() for k, v in ours.items()}, others


def test_an_fp8_all_in_one_flux_file_gives_its_bf16_vae_through_init_from(tmp_path):
    path = tmp_path / "flux1-dev-fp8.safetensors"
    want, others = _all_in_one(path)
    vae = build_vae(ARCH)
    lines = init_weights({"vae": vae}, _cfg(), path, tmp_path / "run")  # what --init_from FILE runs
    assert "the FLUX.1 autoencoder (" in lines[0] and f"under 'vae.'; {len(OTHERS)} other tensors ignored" in lines[0]
    assert "scaling_factor 0.3611, shift_factor 0.1159" in lines[0] and "assumed" not in lines[0]
    got = vae.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

    header = safetensors_header(path)
    assert header["model.diffusion_model.double_blocks.0.img_attn.qkv.weight"] == {"dtype": "F8_E4M3", "shape": [4, 8]}
    assert {header[k]["dtype"] for k in OTHERS} == {"F8_E4M3", "F8_E5M2", "BF16", "U16", "U32", "U64"}
    assert sio.safetensors_metadata(path)["modelspec.architecture"] == "Flux.1-dev"
    back = load_safetensors(path, [*OTHERS, "not.in.the.file"])  # read explicitly: every dtype, exactly
    assert list(back) == list(OTHERS)
    for k, t in others.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k].view(torch.uint8), t.view(torch.uint8)), k
    again = tmp_path / "again.safetensors"  # and our writer stores them as the package reads them
    save_safetensors(back, again)
    theirs = load_file(str(again))
    assert all(theirs[k].dtype == t.dtype and torch.equal(theirs[k].view(torch.uint8), t.view(torch.uint8))
               for k, t in others.items())


def test_only_the_tensors_asked_for_are_read(tmp_path, monkeypatch):
    """The VAE of a multi-GB all-in-one file is read without the diffusion model's tensors; the key list
    and dtypes come from the header alone."""
    path = tmp_path / "flux1-dev-fp8.safetensors"
    want, _ = _all_in_one(path)
    read: list[str] = []
    real_open = sio.safe_open

    class Spy:  # the file as the package opens it, recording which tensors are read
        def __init__(self, *a, **k):
            self.handle = real_open(*a, **k)

        def __enter__(self):
            self.f = self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(sio, "safe_open", Spy)
    assert len(safetensors_header(path)) == len(want) + len(OTHERS) and not read
    init_weights({"vae": build_vae(ARCH)}, _cfg(), path, tmp_path / "run")
    assert sorted(read) == sorted(k for k in safetensors_header(path) if k.startswith("vae."))  # never the fp8 model


def test_the_tensors_are_copies_not_views_of_the_file(tmp_path):
    path = save_safetensors({"a": torch.ones(4096), "b": torch.full((4096,), 2.0)}, tmp_path / "x.safetensors")
    back = load_safetensors(path, ["b"])
    data = bytearray(path.read_bytes())
    data[-4 * 4096:] = bytes(4 * 4096)  # the file rewritten in place (not replaced): the loaded tensor keeps its values
    with open(path, "r+b") as f:
        f.write(data)
    assert torch.equal(back["b"], torch.full((4096,), 2.0))
    back["b"] += 1  # and is ours to change


def test_tied_and_strided_tensors_are_written(tmp_path):
    w = torch.randn(3, 4)
    tensors = {"w": w, "tied": w, "row": w[1], "col": w[:, 2], "cuda_free": torch.zeros(0, dtype=torch.bfloat16)}
    back = load_safetensors(save_safetensors(tensors, tmp_path / "t.safetensors"))
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    with pytest.raises(SafetensorsError, match=r"^q: dtype torch.complex128 cannot be stored in safetensors$"):
        save_safetensors({"q": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "c.safetensors")
    assert not (tmp_path / "c.safetensors").exists()


def _header_file(path, header: dict, body: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def test_damaged_files_are_one_line_naming_the_file(tmp_path):
    good = save_safetensors({"a": torch.randn(8, 8), "b": torch.randn(3)}, tmp_path / "good.safetensors")
    data = good.read_bytes()
    cases = {"short": (data[:5], "5 bytes, too short to be a safetensors file"),
             "empty": (b"", "0 bytes, too short to be a safetensors file"),
             "in_header": (data[:40], "does not fit the file (40 bytes); truncated?"),
             "huge_header": (struct.pack("<Q", 10**9) + data[8:], "header length 1000000000 does not fit the file"),
             "cut": (data[:-10], "do not match"),
             "not_json": (struct.pack("<Q", 8) + b"{{{{{{{{", "unreadable header")}
    for name, (raw, says) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(raw)
        for read in (safetensors_header, load_safetensors):
            with pytest.raises(SafetensorsError) as info:
                read(path)
            msg = str(info.value)
            assert msg.startswith(f"{path}: ") and says in msg and "\n" not in msg, (name, msg)
    odd = tmp_path / "odd.safetensors"
    _header_file(odd, {"x": {"dtype": "F3", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    with pytest.raises(SafetensorsError, match=r"odd.safetensors: a tensor has unsupported dtype 'F3'$"):
        load_safetensors(odd)
    wrong = tmp_path / "wrong.safetensors"
    _header_file(wrong, {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4)
    with pytest.raises(SafetensorsError, match="wrong.safetensors: the tensors' offsets do not match"):
        safetensors_header(wrong)
    with pytest.raises(FileNotFoundError) as missing:
        load_safetensors(tmp_path / "missing.safetensors")
    assert missing.value.filename == str(tmp_path / "missing.safetensors")
    with pytest.raises(IsADirectoryError):
        safetensors_header(tmp_path)


def test_a_damaged_all_in_one_file_is_one_line_for_init_from(tmp_path):
    path = tmp_path / "flux1-dev-fp8.safetensors"
    _all_in_one(path)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"--init_from .*cut.safetensors: .*do not match.*download it again"):
        init_weights({"vae": build_vae(ARCH)}, _cfg(), cut, tmp_path / "run")
