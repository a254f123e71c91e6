"""The Megatron-core trainer backend (GPU only): `backend.MegatronBackend` under the same batch driver and gRPC API
as the FSDP2 backend, built by `build.build`.

`hf_config`, `mapping` and `rope` are pure (torch only) so the CPU machine tests them; the other modules import
megatron.core, which needs CUDA for forward and Python >= 3.12.
"""
