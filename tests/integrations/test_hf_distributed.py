"""Transformers' and Accelerate's own distributed paths on 2 axon ranks (torchrun-style env).

Each test spawns the ranks once (tests/dist_util.run_ranks pins rank r to axon:r
and sets RANK/WORLD_SIZE/LOCAL_RANK like torchrun) and groups its checks in that
run; nothing calls init_process_group by hand: the libraries do, with the backend
``torch_axon/integrations/hf_distributed.py`` makes them find for axon.

Tolerances: a tensor-parallel forward computes the same float32 sums split over
two ranks and added by an all-reduce, so logits agree with one device's to
rtol=atol=1e-4 (float32 accumulation tolerance) and greedy tokens must be
identical (the test checks that the reference's top-1/top-2 logit margin is far
above that tolerance, so equality is a fair demand).  Training (SGD, a few
steps) sums gradients in another order (DDP averages per-rank gradients, TP
splits the matmuls): losses and weights agree with one device's to rtol=1e-5,
atol=1e-5 and are bit-identical across ranks.
"""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from dist_util import run_ranks, ship, unship  # noqa: E402

WORLD = 2
VOCAB, PAD = 128, 0
LOGIT_TOL = dict(rtol=1e-4, atol=1e-4)
TRAIN_TOL = dict(rtol=1e-5, atol=1e-5)
PROMPTS = [[1, 5, 9, 14, 3, 77, 21, 4], [PAD, PAD, PAD, 1, 7, 7, 90, 33]]  # second row left-padded
NEW_TOKENS = 10


def llama_config(**kw):
    from transformers import LlamaConfig

    # Heads (4, kv 2), MLP width and vocabulary divide by the TP degree 2.
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       pad_token_id=PAD, bos_token_id=1, eos_token_id=2, **kw)


def save_tokenizer(path):
    """A word-level tokenizer over tokens "t1".."t127" (TRL's trainers load one from the checkpoint)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD} | {f"t{i}": i for i in range(1, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="t1",
                            eos_token="t2").save_pretrained(path)


def prompts(device):
    ids = torch.tensor(PROMPTS, device=device)
    return ids, (ids != PAD).long()


def generate_and_logits(model, device):
    """Greedy tokens, the forward logits of the prompts, and the smallest top-1/top-2
    logit margin over the generated steps."""
    ids, mask = prompts(device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=PAD, return_dict_in_generate=True, output_logits=True)
    top2 = torch.stack(out.logits).topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).min().item()
    return out.sequences.cpu(), logits.cpu(), margin


# ---------------------------------------------------------------- the patches in one process


def test_backend_tables_name_axon(monkeypatch):
    """The patched tables answer torch's registered backend for axon and upstream's otherwise."""
    import torch.distributed as dist
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.distributed.utils import get_distributed_backend

    assert dist.Backend.default_device_backend_map.get("axon") == "axon"
    assert get_distributed_backend("axon") == "axon"
    assert get_distributed_backend("cuda") == "nccl" and get_distributed_backend("cpu") == "gloo"
    with pytest.raises(ValueError, match="No distributed backend"):
        get_distributed_backend("no_such_device")
    namespace = HfArgumentParser(TrainingArguments).parse_args(["--output_dir", "x", "--ddp_backend", "axon"])
    assert namespace.ddp_backend == "axon"  # the command line's choices include it

    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = object.__new__(PartialState)  # _prepare_backend only reads the environment
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert state._prepare_backend() == (None, DistributedType.NO)  # one process: unchanged
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert state._prepare_backend() == ("axon", DistributedType.MULTI_GPU)
    assert state._prepare_backend(backend="gloo") == ("gloo", DistributedType.MULTI_GPU)
    assert state._prepare_backend(cpu=True) == ("gloo", DistributedType.MULTI_CPU)  # upstream's


# ---------------------------------------------------------------- tensor parallel


def _tp_rank(rank, world_size, path, how):
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    assert not dist.is_initialized()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # tp_plan= is deprecated for distributed_config=
        if how == "tp_plan":
            model = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.float32)
        else:
            from transformers.distributed import DistributedConfig

            model = AutoModelForCausalLM.from_pretrained(
                path, distributed_config=DistributedConfig(tp_size=world_size), dtype=torch.float32)
    model.eval()
    # Transformers initialised the process group with the backend registered for axon.
    assert dist.is_initialized() and dist.get_world_size() == world_size
    sharded = {name: p for name, p in model.named_parameters() if isinstance(p, DTensor)}
    q = model.model.layers[0].self_attn.q_proj.weight
    info = dict(
        backend=dist.get_backend(),
        device=str(model.device),
        current=torch.axon.current_device(),
        tp_size=model.tp_size,
        mesh_device=q.device_mesh.device_type,
        n_sharded=len(sharded),
        q_local=(tuple(q.to_local().shape), str(q.to_local().device)),
        local_devices={str(p.to_local().device) for p in sharded.values()},
    )
    tokens, logits, _ = generate_and_logits(model, model.device)
    return ship((info, tokens, logits))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random tiny Llama saved with save_pretrained (tp loading reads a checkpoint),
    and its greedy tokens and logits on one device (axon:0)."""
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    model.save_pretrained(path)
    save_tokenizer(path)
    tokens, logits, margin = generate_and_logits(model.to("axon"), "axon")
    # The reference's greedy choices are not near-ties: equal tokens are a fair demand.
    assert margin > 10 * LOGIT_TOL["atol"], margin
    return str(path), tokens, logits


@pytest.mark.parametrize("how", ["tp_plan", "distributed_config"])
def test_tp_generate_matches_one_device(tiny_llama, how):
    """from_pretrained(tp_plan="auto") / DistributedConfig(tp_size=2) under torchrun on axon."""
    path, ref_tokens, ref_logits = tiny_llama
    results = unship(run_ranks(_tp_rank, WORLD, path, how))
    for rank, (info, tokens, logits) in enumerate(results):
        assert info["backend"] == "axon"
        assert info["device"] == f"axon:{rank}" and info["current"] == rank
        assert info["tp_size"] == WORLD and info["mesh_device"] == "axon"
        assert info["n_sharded"] > 0 and info["local_devices"] == {f"axon:{rank}"}
        assert info["q_local"] == ((64 // WORLD, 64), f"axon:{rank}")  # colwise: half the heads
        torch.testing.assert_close(logits, ref_logits, **LOGIT_TOL)
        assert torch.equal(tokens, ref_tokens), (rank, tokens, ref_tokens)


# ---------------------------------------------------------------- Accelerate


def _accelerate_rank(rank, world_size):
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    acc = Accelerator()
    dev = acc.device
    out = dict(
        device=str(dev), current=torch.axon.current_device(),
        distributed_type=acc.distributed_type, is_multi_gpu=acc.distributed_type == DistributedType.MULTI_GPU,
        multi_device=acc.multi_device, state_backend=acc.state.backend, pg_backend=dist.get_backend(),
        num_processes=acc.num_processes, process_index=acc.process_index,
        local_process_index=acc.local_process_index,
    )
    acc.wait_for_everyone()
    x = torch.tensor([rank, rank + 10.0], device=dev)
    gathered = acc.gather(x)
    out["gather"] = (gathered.cpu().tolist(), str(gathered.device))
    out["reduce_sum"] = acc.reduce(x, reduction="sum").cpu().tolist()
    out["reduce_mean"] = acc.reduce(x.clone(), reduction="mean").cpu().tolist()
    out["gather_ragged"] = acc.pad_across_processes(torch.arange(rank + 1.0, device=dev)).cpu().tolist()
    from accelerate.utils import gather_object

    out["gather_object"] = gather_object([f"rank{rank}"])

    # prepare(): a DDP-wrapped model whose gradients are the average of the ranks'.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    out["ddp"] = type(model).__name__
    data = torch.arange(8.0).reshape(2, 4) + 8 * rank
    loss = model(data.to(dev)).square().mean()
    acc.backward(loss)
    out["grad"] = model.module.weight.grad.cpu()
    out["grad_device"] = str(model.module.weight.grad.device)
    out["data"] = data
    return ship(out)


def test_accelerator_under_torchrun():
    results = unship(run_ranks(_accelerate_rank, WORLD))
    for rank, r in enumerate(results):
        assert r["device"] == f"axon:{rank}" and r["current"] == rank
        assert r["is_multi_gpu"] and r["multi_device"], r["distributed_type"]
        assert r["state_backend"] == "axon" and r["pg_backend"] == "axon"
        assert (r["num_processes"], r["process_index"], r["local_process_index"]) == (WORLD, rank, rank)
        assert r["gather"] == ([0.0, 10.0, 1.0, 11.0], f"axon:{rank}")
        assert r["reduce_sum"] == [1.0, 21.0]
        assert r["reduce_mean"] == [0.5, 10.5]
        assert r["gather_ragged"] == ([0.0, 1.0] if rank == 1 else [0.0, 0.0])
        assert r["gather_object"] == ["rank0", "rank1"]
        assert r["ddp"] == "DistributedDataParallel" and r["grad_device"] == f"axon:{rank}"
    # Expected gradient: the mean over ranks of each rank's own gradient.
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3)
    grads = []
    for r in results:
        ref.zero_grad()
        ref(r["data"]).square().mean().backward()
        grads.append(ref.weight.grad.clone())
    expected = torch.stack(grads).mean(0)
    for r in results:
        torch.testing.assert_close(r["grad"], expected, **TRAIN_TOL)
    assert torch.equal(results[0]["grad"], results[1]["grad"])


# ---------------------------------------------------------------- Trainer

SEQ, N_SEQ, STEPS, PER_DEVICE = 16, 16, 4, 2


def train_dataset() -> list[dict]:
    """Counting sequences from random starts (as tests/integrations/test_trainer.py)."""
    starts = torch.randint(0, VOCAB - 3, (N_SEQ, 1), generator=torch.Generator().manual_seed(1))
    ids = (starts + torch.arange(SEQ)) % (VOCAB - 3) + 3
    return [{"input_ids": row, "labels": row} for row in ids]


def train(model, output_dir, per_device_batch, **kw):
    """STEPS steps of the Trainer; returns the trainer, the logged losses and the full weights."""
    from torch.distributed.tensor import DTensor
    from transformers import Trainer, TrainingArguments, default_data_collator

    # "sequential": step k of one device with batch 4 sees the samples that DDP ranks 0 and
    # 1 see with batch 2 (Accelerate shards each global batch across the data-parallel
    # ranks), and that both TP ranks see with batch 4.  SGD: Adam divides by the root of
    # the squared gradients, which turns the rounding differences of tiny gradients
    # (summed in another order across ranks) into learning-rate-sized weight changes.
    args = TrainingArguments(**dict(dict(
        output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=per_device_batch,
        optim="sgd", learning_rate=0.5, logging_steps=1, save_strategy="no", report_to="none", seed=0,
        disable_tqdm=True, train_sampling_strategy="sequential"), **kw))
    trainer = Trainer(model=model, args=args, train_dataset=train_dataset(),
                      data_collator=default_data_collator)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    weights = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
               for k, v in trainer.model.state_dict().items()}
    return trainer, losses, weights


def _trainer_rank(rank, world_size, path, output_dir):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig
    from transformers.training_args import ParallelMode

    def summary(trainer, losses, weights):
        from torch.distributed.tensor import DTensor

        args = trainer.args
        params = list(trainer.model.parameters())
        return dict(device=str(args.device), parallel_mode=args.parallel_mode == ParallelMode.DISTRIBUTED,
                    world_size=args.world_size, process_index=args.process_index, n_gpu=args.n_gpu,
                    wrapped=type(trainer.model_wrapped).__name__,
                    sharded=sum(isinstance(p, DTensor) for p in params),
                    param_devices={str(getattr(p, "_local_tensor", p).device) for p in params},
                    losses=losses, weights=weights)

    # Data parallel: Trainer -> Accelerate initialises the process group and wraps in DDP.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ddp = summary(*train(model, f"{output_dir}/ddp", PER_DEVICE))
    ddp["backend"] = dist.get_backend()
    # Tensor parallel (the TRL recipe): the model is sharded while it loads; the Trainer
    # adds no wrapper and gives both TP ranks the same batches.
    model = AutoModelForCausalLM.from_pretrained(
        path, distributed_config=DistributedConfig(tp_size=world_size), dtype=torch.float32)
    tp = summary(*train(model, f"{output_dir}/tp", PER_DEVICE * world_size))
    tp["tp_size"] = model.tp_size
    # FSDP2 applied while loading (DistributedConfig(fsdp_size=2)): data parallel again.
    model = AutoModelForCausalLM.from_pretrained(
        path, distributed_config=DistributedConfig(fsdp_size=world_size), dtype=torch.float32)
    fsdp = summary(*train(model, f"{output_dir}/fsdp", PER_DEVICE))
    result = dict(ddp=ddp, tp=tp, fsdp=fsdp)
    if importlib.util.find_spec("trl") is not None:
        result["sft"] = sft_tp(path, f"{output_dir}/sft", world_size)
    return ship(result)


def sft_tp(path, output_dir, world_size):
    """The reference training recipe: TRL's SFTTrainer, DistributedConfig in model_init_kwargs."""
    from datasets import Dataset
    from transformers.distributed import DistributedConfig
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_list([{"input_ids": r["input_ids"].tolist()} for r in train_dataset()])
    config = SFTConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, report_to="none",
                       save_strategy="no", logging_steps=1, disable_tqdm=True,
                       model_init_kwargs=dict(distributed_config=DistributedConfig(tp_size=world_size),
                                              dtype=torch.float32))
    trainer = SFTTrainer(model=path, args=config, train_dataset=data)
    trainer.train()
    return dict(device=str(trainer.args.device), tp_size=trainer.model.tp_size,
                wrapped=type(trainer.model_wrapped).__name__,
                losses=[e["loss"] for e in trainer.state.log_history if "loss" in e])


def test_trainer_under_torchrun(tiny_llama, tmp_path):
    """Trainer on 2 ranks: data parallel (DDP), tensor parallel and FSDP2 (DistributedConfig),
    against the same STEPS steps on one device with the global batch; and TRL's SFTTrainer
    with a TP DistributedConfig."""
    from accelerate.state import AcceleratorState
    from transformers import AutoModelForCausalLM

    path = tiny_llama[0]
    results = unship(run_ranks(_trainer_rank, WORLD, path, str(tmp_path)))
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        single, single_losses, single_weights = train(model, tmp_path / "one", PER_DEVICE * WORLD)
        assert single.args.device.type == "axon"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert len(single_losses) == STEPS and single_losses[-1] < single_losses[0]  # it trained
    for kind, wrapper in (("ddp", "DistributedDataParallel"), ("tp", "LlamaForCausalLM"),
                          ("fsdp", "FSDPLlamaForCausalLM")):
        runs = [r[kind] for r in results]
        for rank, r in enumerate(runs):
            about = (kind, rank, {k: v for k, v in r.items() if k != "weights"})
            assert r["device"] == f"axon:{rank}" and r["param_devices"] == {f"axon:{rank}"}, about
            assert r["parallel_mode"] and r["world_size"] == WORLD and r["process_index"] == rank, about
            assert r["n_gpu"] == 1 and r["wrapped"] == wrapper, about
            assert (r["sharded"] > 0) == (kind != "ddp"), about
            torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(single_losses), **TRAIN_TOL,
                                       msg=lambda m: f"{kind} rank {rank} losses: {m}")
            for name, w in r["weights"].items():
                torch.testing.assert_close(w, single_weights[name], **TRAIN_TOL,
                                           msg=lambda m: f"{kind} {name}: {m}")
        assert runs[0]["losses"] == runs[1]["losses"], kind
        for name, w in runs[0]["weights"].items():
            assert torch.equal(w, runs[1]["weights"][name]), (kind, name)
    assert results[0]["ddp"]["backend"] == "axon"
    assert results[0]["tp"]["tp_size"] == WORLD
    if "sft" in results[0]:  # TRL: the model is TP-sharded while it loads, no wrapper
        sft = [r["sft"] for r in results]
        for rank, r in enumerate(sft):
            assert r["device"] == f"axon:{rank}" and r["tp_size"] == WORLD, r
            assert r["wrapped"] == "LlamaForCausalLM", r
            assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"]), r
        assert sft[0]["losses"] == sft[1]["losses"]
