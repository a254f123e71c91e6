"""The Megatron-core trainer backend (GPU only): same Engine surface and gRPC API as the FSDP2 backend.

`hf_config`, `mapping` and `rope` are pure (torch only) so the CPU machine tests them; the other modules import
megatron.core, which needs CUDA for forward and Python >= 3.12.
"""
