"""Bring your own model: a Hugging Face Llama trained with DeepSpeed ZeRO, made preemptible
by spotrain's Checkpointer. The lines marked `# spotrain` are all it adds to the loop.

    .venv/bin/spotrain-torchrun --nproc-per-node 2 examples/train_llama.py --run-name llama-demo \\
        --store file:///tmp/llama-store --work-dir /tmp/llama-work --steps 40

Stop it (Ctrl-C, SIGTERM, a spot interruption notice with --spot-notices) and start it again:
it publishes a checkpoint before it exits and continues from it with the same losses.

On the fleet it is a run's entry point (`runs/<env>/<run>.toml`):

    [entry_point]
    script = "examples/train_llama.py"
    args = ["--steps", "200"]

and needs none of the run's coordinates: `spotrain train` starts it on every machine with the
run, store, catalog, key, work disk and metadata service in the environment (SPOTRAIN_RUN,
SPOTRAIN_STORE, ...), where the Checkpointer finds whatever it is not given.

The model is built from a configuration (random weights, nothing downloaded); each step's batch
is drawn from the step number, so a resumed run sees the batches it would have seen.
"""

from __future__ import annotations

import argparse
import json

import deepspeed
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from spotrain.trainer.checkpointer import Checkpointer
from spotrain.trainer.process import init_distributed

VOCAB, CONTEXT, BATCH = 256, 64, 4


def batch_for(step: int, rank: int) -> torch.Tensor:
    """Counting sequences from random starts (a pattern the model can learn), drawn from the
    step and rank alone."""
    generator = torch.Generator().manual_seed(step * 1_000 + rank)
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    return (starts + torch.arange(CONTEXT)) % VOCAB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Each left out: the Checkpointer reads it from the environment (on the fleet, set).
    parser.add_argument("--run-name", help="the run: key of its checkpoints")
    parser.add_argument("--store", help="s3://BUCKET or file:///PATH")
    parser.add_argument("--work-dir", help="fast local disk")
    parser.add_argument("--catalog-table")
    parser.add_argument("--kms-key-id")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--keep-last", type=int, help="collect older checkpoints (2 or more)")
    parser.add_argument(
        "--spot-notices", help="metadata service to watch, e.g. http://169.254.169.254"
    )
    args = parser.parse_args()

    init_distributed()  # deepspeed.init_distributed, with gloo and no compiled op on CPUs
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
            attn_implementation="sdpa",
        )
    )  # fmt: skip
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        config={"train_micro_batch_size_per_gpu": BATCH, "zero_optimization": {"stage": 2},
                "bf16": {"enabled": torch.cuda.is_available()}, "steps_per_print": 10**9},
    )  # fmt: skip
    checkpointer = Checkpointer(  # spotrain
        run=args.run_name, store=args.store, work_dir=args.work_dir, every=args.checkpoint_every,
        catalog_table=args.catalog_table, kms_key_id=args.kms_key_id,
        spot_notice_endpoint=args.spot_notices, keep_last=args.keep_last,
    )  # fmt: skip
    start = checkpointer.restore(engine)  # spotrain
    for step in range(start, args.steps):
        tokens = batch_for(step, dist.get_rank()).to(engine.device)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
        if dist.get_rank() == 0:
            print(json.dumps({"step": step + 1, "loss": loss.item()}), flush=True)
        # spotrain (the loss is optional: a checkpoint records it, `run status` shows it)
        if checkpointer.after_step(step + 1, last=step + 1 == args.steps, loss=loss.item()):
            break
    checkpointer.close()  # spotrain
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
