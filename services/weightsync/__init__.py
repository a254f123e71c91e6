"""Weight sync: a new version of the policy, from the trainer's ranks into every rollout engine, verified.

Its parts, each importing only those listed before it:
- kernels/: bucket and tensor checksums, and the Triton kernels that compute them where the bytes are;
- transports/: the data planes (gloo, NCCL, CUDA IPC, ucxx) behind one Transport contract, by name;
- transfer/: the library senders and receivers use (plan, pack, manifest and commit, sender, receiver),
  which knows none of its callers;
- service/: the gRPC control service (endpoint registry, layouts, transfer groups, refit outcomes).
"""
