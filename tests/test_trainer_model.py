"""The model and its data: attention is causal and equals the textbook formula, a fresh model
predicts uniformly, it learns the synthetic corpus, and the sampler replays exactly."""

from __future__ import annotations

import argparse
import itertools
import math
import os
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from spotrain.trainer.data import (
    DataError,
    Sampler,
    TokenFile,
    synthetic_corpus,
    write_token_file,
)
from spotrain.trainer.model import GPT, CausalSelfAttention, GPTConfig

TINY = GPTConfig(vocab_size=256, context=32, layers=2, heads=2, width=64)


def test_sdpa_attention_matches_explicit_masked_softmax() -> None:
    torch.manual_seed(0)
    attention = CausalSelfAttention(TINY).double()
    x = torch.randn(3, 16, TINY.width, dtype=torch.float64)
    q, k, v = attention.qkv(x).split(TINY.width, dim=2)
    heads = lambda t: t.view(3, 16, TINY.heads, -1).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(16, 16).triu(1).bool(), float("-inf"))
    expected = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(3, 16, TINY.width)
    torch.testing.assert_close(attention(x), attention.out(expected))


def test_future_tokens_do_not_change_earlier_predictions() -> None:
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    tokens = torch.randint(0, 256, (1, 20))
    changed = tokens.clone()
    changed[0, 15:] = (changed[0, 15:] + 1) % 256
    torch.testing.assert_close(model(tokens)[0, :15], model(changed)[0, :15])
    assert not torch.allclose(model(tokens)[0, 15:], model(changed)[0, 15:])


def test_fresh_model_predicts_close_to_uniform() -> None:
    torch.manual_seed(0)
    model = GPT(TINY)
    tokens, targets = torch.randint(0, 256, (2, 4, 32))
    assert abs(model(tokens, targets).item() - math.log(256)) < 0.1


def test_too_long_a_sequence_is_refused_with_the_limit() -> None:
    with pytest.raises(ValueError, match="longer than context 32"):
        GPT(TINY)(torch.zeros(1, 33, dtype=torch.long))


@pytest.fixture
def corpus(tmp_path: Path) -> TokenFile:
    return TokenFile(write_token_file(tmp_path / "corpus", synthetic_corpus(200_000)))


def test_model_learns_the_synthetic_corpus(corpus: TokenFile) -> None:
    torch.manual_seed(0)
    model = GPT(TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sampler = Sampler(corpus, context=32, micro_batch=16, seed=1)
    losses = []
    for step in range(60):
        x, y = sampler.batch(step)
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:5]) / 5


def test_sampler_replays_the_same_batches_in_any_order(corpus: TokenFile) -> None:
    sampler = Sampler(corpus, context=32, micro_batch=4, seed=7)
    forward = [sampler.batch(i)[0] for i in range(5)]
    backward = [sampler.batch(i)[0] for i in reversed(range(5))][::-1]
    for a, b in zip(forward, backward, strict=True):
        assert torch.equal(a, b)
    x, y = sampler.batch(3)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert not torch.equal(sampler.batch(3, 0, 2)[0], sampler.batch(3, 1, 2)[0])


def test_ranks_split_one_global_batch_whatever_the_world_size(corpus: TokenFile) -> None:
    one_rank = Sampler(corpus, context=32, micro_batch=8, seed=7).batch(5)[0]
    two_ranks = Sampler(corpus, context=32, micro_batch=4, seed=7)
    halves = [two_ranks.batch(5, rank, 2)[0] for rank in (0, 1)]
    assert torch.equal(torch.cat(halves), one_rank)


def test_corpus_is_reproducible_text() -> None:
    text = synthetic_corpus(5_000, seed=3)
    assert text == synthetic_corpus(5_000, seed=3) and len(text) == 5_000
    first = text.decode().splitlines()[0]
    words, digits = first.split(" (")
    a, rest = digits.rstrip(").").split("+")
    b, total = rest.split("=")
    assert int(a) + int(b) == int(total) and " plus " in words


def test_token_file_that_does_not_match_its_description_is_refused(tmp_path: Path) -> None:
    path = write_token_file(tmp_path / "c", b"abc" * 100)
    path.write_bytes(b"abc")
    with pytest.raises(DataError, match="its description says 300"):
        TokenFile(path)


def test_bad_training_configuration_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from spotrain.trainer import train

    path = tmp_path / "bad.json"
    bad = {"run": "r", "store": "file:///tmp/x", "data": "d.bin", "work_dir": "w", "steps": 0}
    path.write_text(json.dumps({**bad, "zero_stage": 4, "learning_rate": -1.0}))
    assert train.main([str(path)]) == 2
    error = capsys.readouterr().err
    assert f"training configuration {path} has 3 problem(s)" in error
    for fragment in ("train at least 1 step", "stages are 1, 2, 3", "positive rate"):
        assert fragment in error
    path.write_text(json.dumps({"run": "r", "stepz": 3}))
    assert train.main([str(path)]) == 2
    assert "unknown field 'stepz': use one of" in capsys.readouterr().err
    # Fields missing do not hide the values given that are wrong: each required field has a
    # stand-in that passes its own checks.
    import dataclasses

    from spotrain.trainer.engine import TrainConfig

    required = {
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert set(train._STAND_INS) == required
    path.write_text(json.dumps({"run": "r", "steps": -5, "micro_batch": 0}))
    assert train.main([str(path)]) == 2
    error = capsys.readouterr().err
    assert "has 5 problem(s)" in error, error
    for fragment in ("store is missing", "data is missing", "work_dir is missing",
                     "steps is -5", "micro_batch is 0"):  # fmt: skip
        assert fragment in error, error


def test_overrides_and_wrong_types_are_reported_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from spotrain.trainer import train

    path = tmp_path / "run.json"
    good = {"run": "r", "store": "file:///tmp/x", "data": "d.bin", "work_dir": "w", "steps": 5}
    path.write_text(json.dumps(good))
    config = train.load_config(path, ["steps=9", "model.width=128", "kms_key_id=alias/k"])
    assert (config.steps, config.model.width, config.kms_key_id) == (9, 128, "alias/k")
    assert train.main([str(path), "--set", "steps=many", "--set", "model.layers=1.5",
                       "--set", "nonsense"]) == 2  # fmt: skip
    error = capsys.readouterr().err
    assert "has 3 problem(s)" in error
    assert "steps is 'many': it must be an integer" in error
    assert "model.layers is 1.5: it must be an integer" in error
    assert "--set 'nonsense': write FIELD=VALUE" in error


def test_spotrain_train_refuses_a_bad_configuration_before_starting_torchrun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotrain import cli

    path = tmp_path / "run.json"
    path.write_text('{"run": "r"}')
    assert cli.main(["train", str(path), "--nproc-per-node", "2"]) == 2
    error = capsys.readouterr()
    assert "store is missing" in error.err and "training r" not in error.out


def test_spotrain_train_builds_a_multi_node_launch_and_needs_a_rendezvous() -> None:
    from spotrain import cli
    from spotrain.cli import train as train_command
    from spotrain.core.errors import SpotrainError

    args = cli.parser().parse_args(
        ["train", "run.json", "--nproc-per-node", "8", "--nnodes", "2:4", "--set", "steps=3"]
    )
    with pytest.raises(SpotrainError, match="needs --rdzv-endpoint HOST:PORT"):
        train_command.torchrun_command(args)
    args.rdzv_endpoint = "10.0.0.5:29400"
    command = train_command.torchrun_command(args)
    joined = " ".join(command)
    assert "--nnodes 2:4 --rdzv-backend c10d --rdzv-endpoint 10.0.0.5:29400" in joined
    assert f"--shutdown-timeout {train_command.DEFAULT_SHUTDOWN_TIMEOUT_S}" in joined
    assert command[-4:] == ["spotrain.trainer.train", "run.json", "--set", "steps=3"]
    assert command[1:3] == ["-m", "spotrain.trainer.launch"]  # torchrun, repaired
    assert "is_host" not in joined  # torch decides from the endpoint's address
    args.rdzv_host = True
    assert "last_call_timeout=30,is_host=true" in " ".join(train_command.torchrun_command(args))
    args.rdzv_host = False
    assert "last_call_timeout=30,is_host=false" in " ".join(train_command.torchrun_command(args))


def test_launch_gives_the_ranks_the_shutdown_timeout_on_a_membership_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.13 stops the ranks with its fixed 30 s when a machine joins; the repaired
    launcher waits --shutdown-timeout, and where machines may join does not share the agent's
    store (which strands a machine that joins a running group)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from spotrain.trainer import launch

    monkeypatch.setattr(LocalElasticAgent, "_stop_workers", LocalElasticAgent._stop_workers)
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    launch._repair_torchrun(standalone=True)  # one machine: torch's shared store is kept
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ
    launch._repair_torchrun(standalone=False)
    asked: list[int] = []

    class Agent:
        _shutdown_timeout = 90

        def _shutdown(self, timeout: int) -> None:
            asked.append(timeout)

    LocalElasticAgent._stop_workers(Agent(), worker_group=None)  # type: ignore[arg-type]
    assert asked == [90]
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_an_older_torchrun_without_shutdown_timeout_still_waits_that_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU images carry older PyTorch (2.11 on the benchmark's H100) whose torchrun refuses
    `--shutdown-timeout`: the launcher takes it off the command line and makes it the least
    time any stop waits for the ranks' emergency checkpoint."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import PContext

    from spotrain.trainer import launch

    argv = ["launch", "--nproc-per-node", "1", "--shutdown-timeout", "90", "--standalone"]
    assert launch._older_torchrun(list(argv)) == argv  # this torchrun knows the flag

    newer = run.get_args_parser

    def older() -> argparse.ArgumentParser:
        parser = newer()
        parser._actions = [
            a for a in parser._actions if "--shutdown-timeout" not in a.option_strings
        ]
        return parser

    waited: list[int] = []
    monkeypatch.setattr(run, "get_args_parser", older)
    monkeypatch.setattr(
        PContext, "close", lambda self, death_sig=None, timeout=30: waited.append(timeout)
    )
    assert launch._older_torchrun(list(argv)) == [
        "launch", "--nproc-per-node", "1", "--standalone"]  # fmt: skip
    PContext.close(object(), None)  # type: ignore[arg-type]
    PContext.close(object(), None, timeout=300)  # type: ignore[arg-type]
    assert waited == [90, 300]


def test_learning_rate_warms_up_then_decays_to_a_tenth_and_holds() -> None:
    from spotrain.trainer.engine import TrainConfig, lr_factor

    config = TrainConfig(run="r", store="file:///x", data="d", steps=100, work_dir="w",
                         warmup_steps=4, decay_steps=10)  # fmt: skip
    factors = [lr_factor(config, step) for step in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    decaying = factors[4:15]
    assert decaying[0] == 1.0 and all(a > b for a, b in itertools.pairwise(decaying))
    assert factors[14:] == [pytest.approx(0.1)] * 6
    constant = TrainConfig(run="r", store="file:///x", data="d", steps=100, work_dir="w")
    assert {lr_factor(constant, step) for step in range(50)} == {1.0}


def test_sigint_and_sigterm_only_raise_the_stop_flag() -> None:
    import os
    import signal

    from spotrain.trainer.preemption import PreemptionFlag

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C stops as carefully as a reclaim
            flag = PreemptionFlag().install()
            os.kill(os.getpid(), sig)
            assert flag.reason == sig.name and flag.seconds_since_request() is not None
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
