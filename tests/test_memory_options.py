"""Memory options from DeepSpeed: the configuration refuses what DeepSpeed cannot do (each
problem with its fix, all at once), a machine that cannot build DeepSpeed's ops is told before
the run starts, DeepSpeed's activation checkpointing really keeps fewer activations, and
what changes the arithmetic (CPU Adam) is part of the run's definition while what only moves
or recomputes the same numbers is not. Training and resuming with each option:
test_trainer_resume.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from spotrain.core.errors import ConfigError
from spotrain.trainer import memory, train
from spotrain.trainer.engine import ConfigChanged, TrainConfig, refuse_unintended_change
from spotrain.trainer.model import GPT, GPTConfig
from spotrain.trainer.preflight import preflight

BASE = {"run": "r", "store": "file:///tmp/x", "data": "d.bin", "work_dir": "w", "steps": 5}


def _problems(**fields: Any) -> str:
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**{**BASE, **fields})
    return str(raised.value)


def test_offload_choices_are_checked_together_with_their_fixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = _problems(zero_stage=2, offload_optimizer="gpu", offload_params="cpu")
    assert "offload_optimizer is 'gpu': use one of none, cpu" in error
    assert "offload_params = 'cpu' needs zero_stage 3" in error and "set zero_stage = 3" in error
    error = _problems(zero_stage=3, offload_optimizer="nvme", offload_params="disk")
    assert 'offload_optimizer = "nvme" is not offered' in error
    assert 'use "cpu"' in error and 'offload_params = "nvme" at zero_stage 3' in error
    assert "offload_params is 'disk': use one of none, cpu, nvme" in error
    # What DeepSpeed offers is accepted.
    TrainConfig(**BASE, zero_stage=3, offload_optimizer="cpu", offload_params="nvme",
                activation_checkpointing=True)  # fmt: skip
    TrainConfig(**BASE, zero_stage=1, offload_optimizer="cpu")
    # Through the trainer's entry point too, named with the file's other problems.
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**BASE, "steps": 0, "zero_stage": 2, "offload_params": "nvme"}))
    assert train.main([str(path)]) == 2
    printed = capsys.readouterr().err
    assert "has 2 problem(s)" in printed and "offload_params = 'nvme' needs zero_stage 3" in printed
    path.write_text(json.dumps({**BASE, "activation_checkpointing": "yes"}))
    assert train.main([str(path)]) == 2
    assert "activation_checkpointing is 'yes': it must be" in capsys.readouterr().err


def test_a_machine_that_cannot_build_deepspeeds_ops_is_told_before_the_run_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    from spotrain.trainer.data import synthetic_corpus, write_token_file

    assert memory.machine_problems(TrainConfig(**BASE)) == []  # nothing to compile
    monkeypatch.setenv("CXX", "no-such-compiler")
    # libaio's presence is this machine's; its absence is what is checked here.
    monkeypatch.setattr(AsyncIOBuilder, "is_compatible", lambda self, verbose=False: False)
    corpus = write_token_file(tmp_path / "corpus", synthetic_corpus(9000))
    config = TrainConfig(**{**BASE, "data": str(corpus), "store": f"file://{tmp_path / 'store'}",
                            "work_dir": str(tmp_path / "work")},
                         zero_stage=3, offload_optimizer="cpu", offload_params="nvme",
                         model=GPTConfig(context=32))  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        preflight(config)
    error = str(raised.value)
    assert "has 2 problem(s)" in error
    assert "offload_optimizer = 'cpu' (CPU Adam) and offload_params = \"nvme\" (async I/O)" in error
    assert "has no no-such-compiler on PATH: install them" in error
    assert "needs libaio: install libaio-dev" in error


def test_the_environments_own_ninja_is_found_off_path(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:  # fmt: skip
    """DeepSpeed requires the ninja package, whose program sits beside the interpreter: a
    training process started by the interpreter's path (PATH without the environment) still
    compiles CPU Adam."""
    import shutil
    import sys

    compiler = shutil.which("c++")
    if compiler is None or not (Path(sys.executable).parent / "ninja").is_file():
        pytest.skip("needs a C++ compiler and ninja beside the interpreter")
    tools = tmp_path / "bin"  # a PATH with the compiler and nothing else
    tools.mkdir()
    (tools / "c++").symlink_to(compiler)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.delenv("CXX", raising=False)
    assert memory.machine_problems(TrainConfig(**BASE, offload_optimizer="cpu")) == []
    assert str(Path(sys.executable).parent) in os.environ["PATH"].split(os.pathsep)


def test_deepspeed_activation_checkpointing_keeps_fewer_activations_for_the_same_gradients(
) -> None:  # fmt: skip
    import deepspeed

    config = GPTConfig(vocab_size=256, context=64, layers=4, heads=4, width=128)
    tokens = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(0))

    def saved_bytes_and_gradients(recompute: Any) -> tuple[int, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = GPT(config, recompute=recompute)
        saved = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            if not isinstance(tensor, torch.nn.Parameter):
                saved += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(tokens, tokens)
        loss.backward()
        return saved, [p.grad.clone() for p in model.parameters()]

    kept, gradients = saved_bytes_and_gradients(None)
    recomputed, same = saved_bytes_and_gradients(deepspeed.checkpointing.checkpoint)
    assert recomputed < kept / 2  # each block keeps only its input for the backward pass
    for expected, got in zip(gradients, same, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_definition_holds_what_changes_the_arithmetic_and_not_what_moves_it() -> None:
    plain = TrainConfig(**BASE, zero_stage=3)
    moved = TrainConfig(**BASE, zero_stage=3, activation_checkpointing=True,
                        offload_params="cpu")  # fmt: skip
    stepped_on_host = TrainConfig(**BASE, zero_stage=3, offload_optimizer="cpu")
    assert plain.config_hash(2) == moved.config_hash(2)
    assert stepped_on_host.config_hash(2) != plain.config_hash(2)
    assert stepped_on_host.definition(2)["offload_optimizer"] == "cpu"
    # Moving the optimizer back to the GPUs at a resume is refused, the change named.
    with pytest.raises(ConfigChanged, match="offload_optimizer: 'cpu' -> 'none'"):
        refuse_unintended_change(plain, stepped_on_host.definition(2), 2, step=6)
    refuse_unintended_change(moved, plain.definition(2), 2, step=6)  # nothing to refuse


def test_deepspeed_is_given_the_stage_and_where_it_offloads(tmp_path: Path) -> None:
    options = TrainConfig(**{**BASE, "work_dir": str(tmp_path)}, zero_stage=3,
                          offload_optimizer="cpu", offload_params="nvme")  # fmt: skip
    folder = tmp_path / "offload" / "offload_param"
    assert memory.zero_section(options) == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "nvme", "nvme_path": str(folder)},
    }
    assert folder.is_dir()
    assert memory.zero_section(TrainConfig(**BASE, zero_stage=2)) == {"stage": 2}
    assert memory.describe(options) == (
        "memory: optimizer state in host memory (CPU Adam), parameters in NVMe files"
    )
    assert memory.describe(TrainConfig(**BASE)) is None
