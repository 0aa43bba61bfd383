"""common.precision: the one `precision` key (every spelling a config may use is read once, at
load), `Precision` (autocast, GradScaler, backend flags, the report) on the CPU."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch import nn

from common.config import ConfigError, explicit_keys, load_config
from common.guards import NonFiniteGuard
from common.precision import Precision, normalize_precision, precision_name
from common.training import step_optimizer
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig
from vae.config import VAEConfig
from vocoder.config import VocoderConfig

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_precision_aliases_and_cpu_report():
    assert normalize_precision("fp16") == "16-mixed" and normalize_precision("bf16") == "bf16-mixed"
    assert precision_name("16") == "16-mixed" and precision_name("AUTO") == "auto"  # auto: decided at start
    with pytest.raises(ValueError, match="unknown precision"):
        normalize_precision("fp8")
    p = Precision("16-mixed", "cpu", tf32=True, cudnn_benchmark=True)
    report = "\n".join(p.report())
    assert p.scaler.is_enabled() and "tf32" in report and "cudnn_benchmark" in report and "not applied" in report
    assert not Precision("bf16-mixed", "cpu").scaler.is_enabled()


def test_autocast_bf16_runs_linear_in_bf16_and_no_autocast_is_fp32():
    p = Precision("bf16-mixed", "cpu")
    lin = nn.Linear(4, 4)
    with p.autocast():
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
        with p.no_autocast():
            assert lin(torch.randn(2, 4)).dtype == torch.float32


def test_fp16_grad_scaler_skips_injected_inf_on_cpu():
    torch.manual_seed(0)
    p = Precision("16-mixed", "cpu")
    model = nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = [t.clone() for t in model.parameters()]
    with p.autocast():
        loss = model(torch.randn(8, 4)).float().pow(2).mean() * torch.tensor(float("inf"))
    scale_before = p.scaler.get_scale()
    norm, stepped = step_optimizer(loss, opt, model.parameters(), scaler=p.scaler, guard=NonFiniteGuard())
    p.scaler.update()
    assert not stepped and not torch.isfinite(norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.state == {} or all(len(s) == 0 for s in opt.state.values())  # Adam moments untouched
    assert p.scaler.get_scale() < scale_before  # the scaler backed off
    with p.autocast():
        loss = model(torch.randn(8, 4)).float().pow(2).mean()
    _, stepped = step_optimizer(loss, opt, model.parameters(), scaler=p.scaler)
    p.scaler.update()
    assert stepped and not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_auto_is_bf16_on_a_bf16_gpu_else_fp32():
    """`--precision auto` as tts/train_main.py's pick_precision had it: no fp16 (loss scaling) and
    no CPU bf16 unless asked for."""
    assert normalize_precision("auto", CPU) == "32-true"
    with mock.patch("torch.cuda.is_bf16_supported", return_value=True):
        assert normalize_precision("auto", CUDA) == "bf16-mixed"
    with mock.patch("torch.cuda.is_bf16_supported", return_value=False):
        assert normalize_precision("auto", CUDA) == "32-true"
    assert Precision("auto", "cpu").precision == "32-true"


@pytest.mark.parametrize("schema, typed, expected", [
    (TrainConfig, [], "bf16-mixed"), (TrainConfig, ["mixed_precision=false"], "32-true"),
    (TrainConfig, ["mixed_precision=true", "amp_dtype=fp16"], "16-mixed"),
    (TrainConfig, ["amp_dtype=fp16"], "16-mixed"),  # the dtype alone: the default is mixed
    (TrainConfig, ["amp_dtype=fp16", "mixed_precision=true"], "16-mixed"),  # the command line is one layer
    (TrainConfig, ["precision=fp16"], "16-mixed"),  # a value alias
    (VAEConfig, [], "32-true"), (VAEConfig, ["mixed_precision=true"], "16-mixed"),
    (VAEConfig, ["mixed_precision=yes", "use_bf16=true"], "bf16-mixed"),
    (VAEConfig, ["use_bf16=true"], "32-true"),  # the dtype alone leaves fp32 alone
    (VocoderConfig, ["pl_trainer_precision=16"], "16-mixed"), (CloneConfig, ["precision=bf16"], "bf16-mixed"),
])


def test_every_spelling_is_the_one_precision_field(schema, typed, expected):
    """VITS' `mixed_precision` + `amp_dtype`, the VAE's `--mixed_precision` (+ `--use_bf16`), the vocoder's
    `pl_trainer_precision`: read once at load into the one `precision` field, recorded as typed."""
    cfg = load_config(None, schema, typed)
    precision = cfg.train.precision if schema is CloneConfig else cfg.precision
    assert precision == expected
    assert not typed or set(explicit_keys(cfg)) == {"train.precision" if schema is CloneConfig else "precision"}
    p = Precision(precision, "cpu")
    assert p.precision == expected and p.scaler.is_enabled() == (expected == "16-mixed")


def test_a_switch_combines_with_the_layer_below(tmp_path):
    """A YAML layer's `mixed_precision: true` keeps the dtype its base chose; one spelling per layer."""
    (tmp_path / "base.yaml").write_text("mixed_precision: true\nuse_bf16: true\n")
    (tmp_path / "child.yaml").write_text("base_config: base.yaml\nmixed_precision: true\n")
    assert load_config(tmp_path / "child.yaml", VAEConfig).precision == "bf16-mixed"
    assert load_config(tmp_path / "child.yaml", VAEConfig, ["mixed_precision=false"]).precision == "32-true"
    (tmp_path / "both.yaml").write_text("mixed_precision: true\nprecision: bf16-mixed\n")
    with pytest.raises(ConfigError, match="keep one spelling"):
        load_config(tmp_path / "both.yaml", VAEConfig)
    with pytest.raises(ConfigError, match="keep one spelling"):
        load_config(None, TrainConfig, ["precision=32-true", "amp_dtype=fp16"])
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        load_config(None, VocoderConfig, ["precision=fp8"])


def test_compile_where_it_cannot_work_trains_eager_and_says_so(monkeypatch):
    """Windows has no Triton and usually no C++ compiler: a config or preset that asks for torch.compile
    must still train (eager), with one line saying why, not crash at the first step."""
    import shutil

    from common import precision as prec
    from common.precision import Precision, compile_unavailable

    monkeypatch.setattr(shutil, "which", lambda _name: None)
    why = compile_unavailable(torch.device("cpu"))
    assert why.startswith("no C++ compiler on PATH")
    p = Precision("32-true", "cpu", compile=True)
    assert p.compile is False and "torch.compile on the model" not in " ".join(p.applied)
    assert any(line.startswith("not applied: torch.compile requested but no C++ compiler") for line in p.report())
    model = torch.nn.Linear(2, 2)
    assert p.prepare_model(model) is model  # eager: not an OptimizedModule
    monkeypatch.setattr(prec.importlib.util, "find_spec", lambda name: None)
    assert compile_unavailable(torch.device("cuda")).startswith("Triton is not installed")
    monkeypatch.undo()
    if compile_unavailable(torch.device("cpu")) is None:  # this machine has a compiler: compile is kept
        assert Precision("32-true", "cpu", compile=True).compile is True


def test_cuda_graphs_are_compiles_reduce_overhead_mode_and_refused_where_they_change_nothing(monkeypatch):
    """`cuda_graphs`: torch.compile(mode="reduce-overhead") on CUDA, each step marked for the graph trees, and a
    warning once the graphs are recorded if torch.compile ran any graph without them; without compile, or off
    CUDA, one line naming the key. (The graphs themselves: tests/cuda/test_cuda_training.py on a GPU.)"""
    import warnings

    from torch._dynamo.utils import counters

    from common import precision as prec
    from common.precision import CUDA_GRAPHS_RECORDED_AFTER, Precision

    with pytest.raises(ConfigError, match="cuda_graphs: true needs compile: true"):
        Precision("32-true", "cpu", cuda_graphs=True)
    with pytest.raises(ConfigError, match="cuda_graphs: CUDA graphs need a CUDA device and this run is on cpu"):
        Precision("32-true", "cpu", compile=True, cuda_graphs=True)
    assert Precision("32-true", "cpu", compile=True).cuda_graphs is False

    # on CUDA (flags only: nothing here touches a device), torch.compile and the step mark recorded
    monkeypatch.setattr(prec, "compile_unavailable", lambda device: None)
    modes, marks = [], []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    saved = torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    try:
        p = Precision("32-true", "cuda", compile=True, cuda_graphs=True)
        q = Precision("32-true", "cuda", compile=True)
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved
    assert p.cuda_graphs and "applied: CUDA graphs (torch.compile mode reduce-overhead)" in p.report()
    p.prepare_model(torch.nn.Linear(2, 2))
    q.prepare_model(torch.nn.Linear(2, 2))
    assert modes == ["reduce-overhead", None]
    q.step_begin()
    assert marks == []  # compile alone marks nothing
    monkeypatch.setitem(counters["inductor"], "cudagraph_skips", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(CUDA_GRAPHS_RECORDED_AFTER + 3):
            p.step_begin()
    assert len(marks) == CUDA_GRAPHS_RECORDED_AFTER + 3
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and said[0].startswith("cuda_graphs: torch.compile ran 2 compiled graph(s)")
