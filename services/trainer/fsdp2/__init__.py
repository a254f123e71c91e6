"""The FSDP2 trainer backend (CPU or GPU): `backend.FSDP2Backend` over an HF model sharded with fully_shard,
built by `build.build`. The packed-row attention both backends use is `services/trainer/attention.py`."""
