"""The weightsync gRPC service: the control plane of refits, and the rendezvous store of their groups."""
