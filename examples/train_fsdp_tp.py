"""Train a tiny Llama with tensor parallelism x FSDP2 on axon devices.

    torchrun --nproc_per_node=4 examples/train_fsdp_tp.py [--steps 20] [--output-dir DIR]

Each process drives one axon device (LOCAL_RANK).  The ranks form a 2-D device
mesh dp x tp: within a tp group the Llama blocks are split Megatron-style
(column-wise q/k/v/gate/up, row-wise o/down, sequence-parallel norms, vocab-
sharded embedding); across the dp groups the parameters are sharded with
fully_shard (FSDP2) and every dp group trains on its slice of the batch.
4 ranks give dp=2 x tp=2; 2 ranks give dp=2 x tp=1 (plain FSDP; --tp 2 for
dp=1 x tp=2); other counts use tp=1 unless --tp says otherwise.

At the end the full state dict is gathered to rank 0's CPU
(torch.distributed.checkpoint.state_dict.get_model_state_dict with
full_state_dict=True, cpu_offload=True) and saved as a standard Transformers
checkpoint (save_pretrained) that loads anywhere, e.g. on the CPU:

    AutoModelForCausalLM.from_pretrained(DIR)

The data are synthetic learnable sequences (arithmetic progressions modulo
the vocabulary), so the loss falls within a few steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: 2 if "
                   "the world size is a multiple of 2 and at least 4, else 1)")
    p.add_argument("--bf16", action="store_true",
                   help="FSDP mixed precision: bf16 parameters, fp32 gradient reduction")
    p.add_argument("--no-sequence-parallel", dest="sp", action="store_false")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--output-dir", default="train_fsdp_tp_out")
    p.add_argument("--metrics", default=None, help="write losses/timings as JSON (rank 0)")
    p.add_argument("--device", default="axon", help="device type (cpu: gloo, for comparison)")
    return p.parse_args()


def mesh_shape(world_size: int, tp: int | None, kv_heads: int) -> tuple[int, int]:
    if tp is None:
        tp = 2 if world_size >= 4 and world_size % 2 == 0 and kv_heads % 2 == 0 else 1
    if world_size % tp or kv_heads % tp:
        raise SystemExit(f"--tp {tp} must divide the world size ({world_size}) and the "
                         f"number of key/value heads ({kv_heads})")
    return world_size // tp, tp


def apply_tensor_parallel(model: LlamaForCausalLM, tp_mesh, sequence_parallel: bool):
    """Megatron-style TP (+ sequence parallelism) of a Transformers Llama.

    With sequence parallelism the residual stream stays a DTensor sharded along the
    sequence (so `residual + block(x)` adds two DTensors and the model sees the
    global sequence length); the attention and MLP inputs are all-gathered.
    """
    if sequence_parallel:
        between, norm = Shard(1), SequenceParallel()
        parallelize_module(model, tp_mesh, {
            # a DTensor output: Transformers derives the positions from its (global) shape
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(),
                                                  output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
    for layer in model.model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
        }
        if sequence_parallel:
            plan.update({
                "input_layernorm": norm,
                "self_attn": PrepareModuleInput(
                    input_kwarg_layouts={"hidden_states": between},
                    desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "self_attn.o_proj": RowwiseParallel(output_layouts=between,
                                                    use_local_output=False),
                "post_attention_layernorm": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(between,),
                                          desired_input_layouts=(Replicate(),)),
                "mlp.down_proj": RowwiseParallel(output_layouts=between, use_local_output=False),
            })
        else:
            plan.update({"self_attn.o_proj": RowwiseParallel(),
                         "mlp.down_proj": RowwiseParallel()})
        parallelize_module(layer, tp_mesh, plan)


def batches(steps: int, batch: int, seq: int, vocab: int, seed: int = 1234):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 4, (batch, 1), generator=g)
        yield (start + stride * torch.arange(seq)) % vocab


def quiet_torch_warnings():
    # Both concern patterns this script does not use: in-place ops on the model's
    # output; and the two-step reduction of the 2-D gradient norm (clip_grad_norm_).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def main():
    args = parse_args()
    quiet_torch_warnings()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cpu":
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        handle = getattr(torch, args.device)
        handle.set_device(local_rank)
        device = torch.device(args.device, local_rank)
        # the device's default backend (axon: ProcessGroupAxon), bound to this rank's device
        dist.init_process_group(device_id=device)
    log = print if rank == 0 else (lambda *a, **k: None)

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=args.vocab,
                         max_position_embeddings=max(128, args.seq), pad_token_id=0,
                         bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    dp, tp = mesh_shape(world_size, args.tp, config.num_key_value_heads)
    if args.batch % dp or (tp > 1 and args.sp and args.seq % tp):
        raise SystemExit(f"the batch ({args.batch}) must divide by dp={dp} and the sequence "
                         f"({args.seq}) by tp={tp}")
    mesh = init_device_mesh(args.device, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    log(f"world size {world_size} ({dist.get_backend_config()}), mesh dp={dp} x tp={tp}, "
        f"sequence parallel {'on' if tp > 1 and args.sp else 'off'}, "
        f"{'bf16 params / fp32 reduce' if args.bf16 else 'fp32'}")

    torch.manual_seed(0)  # the same initial weights on every rank
    model = LlamaForCausalLM(config).to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    if tp > 1:
        apply_tensor_parallel(model, mesh["tp"], args.sp)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if args.bf16 else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    local_numel = sum(p.to_local().numel() for p in model.parameters())
    log(f"{n_params} parameters, {local_numel} on each rank")

    losses, step_times = [], []
    tokens_per_step = args.batch * args.seq
    for step, ids in enumerate(batches(args.steps, args.batch, args.seq, args.vocab)):
        t0 = time.perf_counter()
        ids = ids.chunk(dp)[dp_rank].to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
        global_loss = global_loss.item()  # waits for the step
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        step_times.append(time.perf_counter() - t0)
        losses.append(global_loss)
        log(f"step {step + 1:3d}/{args.steps}  loss {global_loss:.4f}  grad norm "
            f"{grad_norm.item():.3f}  {step_times[-1] * 1e3:7.1f} ms  "
            f"{tokens_per_step / step_times[-1]:8.0f} tokens/s")

    # evaluation on a fixed batch (the test reproduces it from the saved checkpoint)
    eval_ids = next(batches(1, args.batch, args.seq, args.vocab, seed=99))
    model.eval()
    with torch.no_grad():
        part = eval_ids.chunk(dp)[dp_rank].to(device)
        eval_loss = model(input_ids=part, labels=part).loss.detach().clone()
    dist.all_reduce(eval_loss, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
    eval_loss = eval_loss.item()

    # gather the full state dict to rank 0's CPU and save a Transformers checkpoint
    t0 = time.perf_counter()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    if rank == 0:
        cpu_model = LlamaForCausalLM(config)
        cpu_model.load_state_dict(state, strict=True)
        cpu_model.save_pretrained(args.output_dir)
    save_seconds = time.perf_counter() - t0

    steady = step_times[1:] or step_times
    mean_step = sum(steady) / len(steady)
    peak = None
    if args.device != "cpu" and hasattr(getattr(torch, args.device), "max_memory_allocated"):
        peak = getattr(torch, args.device).max_memory_allocated(device)
    log(f"measured: first step {step_times[0] * 1e3:.0f} ms (includes warm-up), then "
        f"{mean_step * 1e3:.1f} ms/step = {tokens_per_step / mean_step:.0f} tokens/s over "
        f"{world_size} ranks; loss {losses[0]:.4f} -> {losses[-1]:.4f}; eval loss "
        f"{eval_loss:.4f}" + (f"; peak memory rank 0 {peak / 2**20:.1f} MiB" if peak else ""))
    log(f"saved Transformers checkpoint to {args.output_dir} ({save_seconds:.2f} s to gather "
        f"and save)")
    if rank == 0 and args.metrics:
        with open(args.metrics, "w") as f:
            json.dump({"world_size": world_size, "dp": dp, "tp": tp, "losses": losses,
                       "step_ms": [t * 1e3 for t in step_times], "eval_loss": eval_loss,
                       "eval_input_ids": eval_ids.tolist(), "peak_memory_bytes": peak,
                       "output_dir": os.path.abspath(args.output_dir)}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
