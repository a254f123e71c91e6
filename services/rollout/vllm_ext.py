"""Mixed into vLLM's worker (worker_extension_cls); `self` is the worker. Runs in the engine process."""

from __future__ import annotations

import torch


class WeightLoaderExtension:
    def load_named(self, named: list[tuple[str, torch.Tensor]]) -> None:
        # reload_weights, not model.load_weights: on CPU vLLM packs Linear weights into oneDNN
        # handles after loading, so only a layerwise reload (restore, load, re-pack) works.
        self.model_runner.reload_weights(weights_iterator=named, is_checkpoint_format=True)

    def read_named(self) -> dict[str, torch.Tensor]:
        # Packed (oneDNN) weights show up as empty tensors; only the readable ones are returned.
        return {n: p.detach() for n, p in self.model_runner.model.named_parameters() if p.numel() > 0}
