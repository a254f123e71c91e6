"""Run under torchrun with 2 ranks on gloo (no GPU needed, megatron-core needed): a Megatron GPTModel split
over the two ranks (TP=2, or PP=2) and loaded from an HF checkpoint gives the checkpoint back through
full_state_dict (TP shards gathered, stages collected), and with TP the two ranks' refit shares
(gather_share) cover it exactly. Prints one JSON line.

    torchrun --nproc-per-node 2 tests/gpu/megatron_share_check.py WORKDIR tied|untied tp|pp
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel
    from safetensors.torch import load_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.trainer.megatron import model as mm
    from services.trainer.megatron.backend import MegatronBackend
    from services.weightsync.transfer.plan import ReceiverLayout, bucket_senders, make_plan

    folder, tied, split = Path(sys.argv[1]), sys.argv[2] == "tied", sys.argv[3]
    tp, pp = (2, 1) if split == "tp" else (1, 2)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ps.initialize_model_parallel(tp, pp)
    if rank == 0:
        torch.manual_seed(0)
        cfg = Qwen2Config(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=256, tie_word_embeddings=tied, max_position_embeddings=128,
        )  # fmt: skip
        Qwen2ForCausalLM(cfg).save_pretrained(folder)
    dist.barrier()
    shape = mm.read_shape(folder)
    config = mm.transformer_config(shape, tp, pp, False, "off", 2)
    config.use_cpu_initialization = True  # megatron-core builds on CPU; only forward needs CUDA
    model = GPTModel(
        config=config, transformer_layer_spec=mm.layer_spec(), vocab_size=shape.vocab_size, max_sequence_length=128,
        share_embeddings_and_output_weights=tied, position_embedding_type="none",
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
    )  # fmt: skip
    lay = mm.layout(config, shape)
    mm.load_hf(model, folder, lay)
    # The weights-out half of the backend, without DDP and the optimizer (which need CUDA).
    engine = MegatronBackend.__new__(MegatronBackend)
    engine.model, engine.shape, engine.layout = types.SimpleNamespace(module=model), shape, lay
    engine.tp_group, engine.dp_rank = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_rank()
    engine.rank, engine.world = rank, dist.get_world_size()

    layouts = [None, None]
    dist.all_gather_object(layouts, engine.hf_layout(torch.bfloat16))  # one stage's each with PP
    layout = tuple(sorted(set(layouts[0]) | set(layouts[1])))
    full = engine.full_state_dict()
    plan = make_plan(layout, ReceiverLayout(), 4096)
    senders = bucket_senders(plan.bucket_nbytes, 2)
    owners = {src: senders[slot.bucket] for slot in plan.slots for src in slot.sources}
    shares = [None, None]
    dist.all_gather_object(shares, engine.gather_share(owners, False, torch.bfloat16) if engine.shares_weights else {})
    if rank == 0:
        disk = load_file(folder / "model.safetensors")
        union = {k: v for share in shares for k, v in share.items()}
        source = {k: disk.get(k, disk["model.embed_tokens.weight"]) for k in full}  # tied lm_head
        print(json.dumps({
            "full_keys": sorted(full),
            "disk_keys": sorted(disk),
            "full_equals_disk": all(torch.equal(full[k], source[k]) for k in full),
            "layout_shapes_match": all(tuple(full[n].shape) == s for n, _, s in layout),
            "layout_dtypes": sorted({d for _, d, _ in layout}),
            "shares_weights": engine.shares_weights,
            "share_sizes": [len(s) for s in shares],
            "union_equals_full_bf16": union.keys() == full.keys()
            and all(torch.equal(union[k], full[k].to(torch.bfloat16)) for k in full),
        }), flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
