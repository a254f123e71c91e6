"""Trainer gRPC servicer (rank 0): validates each request, then has every rank run it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import grpc
from google.protobuf.message import Message

from protos.grpo.v1 import trainer_pb2, trainer_pb2_grpc
from services.common.grpcio import NotTrusted, PreconditionError, servicer_edge
from services.weightsync.transfer.outcome import RefitError

from .checkpoint import TRAIN_STATE, confine, staging_dir
from .commands import Op
from .driver import Driver
from .manifest import verify_manifest


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(
        self,
        driver: Driver,
        vocab_size: int,
        max_tokens_per_microbatch: int,
        minibatches: int = 1,
        checkpoint_roots: Sequence[Path] = (),
    ):
        self.driver = driver
        self.vocab_size, self.max_tokens_per_microbatch = vocab_size, max_tokens_per_microbatch
        self.minibatches = minibatches
        self.checkpoint_roots = tuple(checkpoint_roots)
        """Resolved folders that Save and Load paths must lie inside (checkpoint.confine)."""

    @servicer_edge
    def Train(self, request, context):
        self._check_sequences(request.sequences, for_training=True)
        if len(request.sequences) < self.minibatches:
            raise ValueError(f"{len(request.sequences)} sequences cannot make trainer.minibatches={self.minibatches}")
        return self.driver.call(Op.TRAIN, request)

    @servicer_edge
    def ComputeLogprobs(self, request, context):
        self._check_sequences(request.sequences, for_training=False)
        return self.driver.call(Op.LOGPROBS, request)

    @servicer_edge
    def Save(self, request, context):
        if not request.path:
            raise ValueError("path is required")
        path = confine(request.path, self.checkpoint_roots)
        confine(str(staging_dir(path)), self.checkpoint_roots)  # a planted staging symlink would lead out
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ValueError(f"{path} exists and is not an empty folder; checkpoints are never overwritten")
        # Every rank gets the resolved path: the one checked, whatever the links under it become meanwhile.
        return self.driver.call(Op.SAVE, _with_path(request, path))

    @servicer_edge
    def Load(self, request, context):
        if not request.path:
            raise ValueError("path is required")
        path = confine(request.path, self.checkpoint_roots)
        folder = path / TRAIN_STATE  # complete if present: save() publishes by a rename
        if not folder.is_dir() or not any(folder.iterdir()):
            raise ValueError(f"{request.path} holds no training state ({folder} is missing); save without weights_only")
        # Before any rank's torch opens a file of it: DCP unpickles .metadata, so a planted one would run code.
        verify_manifest(path, complete=(TRAIN_STATE,))
        return self.driver.call(Op.LOAD, _with_path(request, path))

    @servicer_edge
    def PublishWeights(self, request, context):
        if request.timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0 (0 = the configured default), got {request.timeout_s}")
        try:
            return self.driver.call(Op.PUBLISH, request)
        except (RefitError, grpc.RpcError) as e:
            if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise NotTrusted(
                    "weightsync refused this trainer's run secret: it belongs to "
                    f"another run, or one of the two has run.locked=false ({_describe(e)})"
                ) from e
            # The trainer itself is fine and keeps serving; the caller decides whether to retry the refit.
            raise PreconditionError(f"weights of this version were not published: {_describe(e)}") from e

    def _check_sequences(self, sequences: Sequence[trainer_pb2.Sequence], for_training: bool) -> None:
        """Reject here, before any rank starts: a bad request found mid-collective would hang the others."""
        if not sequences:
            raise ValueError("sequences must not be empty")
        for i, s in enumerate(sequences):
            if not s.prompt_ids or not s.response_ids:
                raise ValueError(f"sequence {i}: prompt_ids and response_ids must both be non-empty")
            num_tokens = len(s.prompt_ids) + len(s.response_ids)
            if num_tokens > self.max_tokens_per_microbatch:
                raise ValueError(
                    f"sequence {i}: {num_tokens} tokens exceed trainer.max_tokens_per_microbatch="
                    f"{self.max_tokens_per_microbatch}"
                )
            bad = [t for t in (*s.prompt_ids, *s.response_ids) if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"sequence {i}: token id {bad[0]} outside [0, {self.vocab_size})")
            if for_training:
                _check_training_fields(i, s)


def _check_training_fields(i: int, s: trainer_pb2.Sequence) -> None:
    if len(s.rollout_logprobs) != len(s.response_ids):
        raise ValueError(
            f"sequence {i}: {len(s.rollout_logprobs)} rollout_logprobs for {len(s.response_ids)} response tokens"
        )
    if s.loss_mask and len(s.loss_mask) != len(s.response_ids):
        raise ValueError(f"sequence {i}: {len(s.loss_mask)} loss_mask values for {len(s.response_ids)} response tokens")
    if s.loss_mask and not any(s.loss_mask):
        raise ValueError(f"sequence {i}: loss_mask marks no token as the policy's: nothing to train on")
    if not math.isfinite(s.advantage):
        raise ValueError(f"sequence {i}: advantage must be finite, got {s.advantage}")


def _with_path(request: Message, path: Path) -> Message:
    checked = type(request)()
    checked.CopyFrom(request)
    checked.path = str(path)
    return checked


def _describe(e: Exception) -> str:
    if isinstance(e, grpc.RpcError):
        return f"{e.code().name}: {e.details()}"
    return str(e)
