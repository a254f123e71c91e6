"""The FSDP2 trainer backend (CPU or GPU): `backend.FSDP2Backend` over an HF model sharded with fully_shard,
built by `build.build`; `attention` gives HF models the packed-row attention it needs."""
