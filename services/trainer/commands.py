"""The trainer's commands: what every rank runs, identically, for each RPC that rank 0 receives."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from google.protobuf.message import Message

from protos.grpo.v1 import trainer_pb2
from services.common.config import WeightsyncSection
from services.weightsync.transfer.plan import torch_dtype
from services.weightsync.transfer.ranks import GroupRanks
from services.weightsync.transfer.sender import Sender
from services.weightsync.transports import choose, kind

from .engine import Engine
from .packing import Seq


class Op(enum.IntEnum):
    SHUTDOWN = 0
    PING = 1
    """Keeps idle followers' pending broadcast inside the process group's timeout."""
    TRAIN = 2
    LOGPROBS = 3
    SAVE = 4
    PUBLISH = 5
    LOAD = 6


def to_seqs(sequences: Iterable[trainer_pb2.Sequence]) -> list[Seq]:
    return [Seq(list(s.prompt_ids), list(s.response_ids), list(s.loss_mask)) for s in sequences]


class Executor:
    """Decodes a command's request bytes and runs it on this rank's engine; replies matter on rank 0 only."""

    def __init__(self, engine: Engine, weightsync: WeightsyncSection):
        self.engine, self.weightsync = engine, weightsync
        # Kept across refits: each holds its transfer groups and buffers.
        self._lone_sender, self._all_ranks = Sender(), Sender(ranks=GroupRanks())
        self._handlers: dict[Op, tuple[type[Message], Callable[[Message], Message | None]]] = {
            Op.TRAIN: (trainer_pb2.TrainRequest, self.train),
            Op.LOGPROBS: (trainer_pb2.LogprobsRequest, self.logprobs),
            Op.SAVE: (trainer_pb2.SaveRequest, self.save),
            Op.PUBLISH: (trainer_pb2.PublishWeightsRequest, self.publish),
            Op.LOAD: (trainer_pb2.LoadRequest, self.load),
        }

    def run(self, op: Op, payload: bytes) -> Message | None:
        request_type, handler = self._handlers[op]
        return handler(request_type.FromString(payload))

    def train(self, request: trainer_pb2.TrainRequest) -> trainer_pb2.TrainReply:
        seqs = request.sequences
        metrics = self.engine.train(
            to_seqs(seqs),
            [s.advantage for s in seqs],
            [list(s.rollout_logprobs) for s in seqs],
            temperature=request.temperature or 1.0,
            max_tokens=request.max_tokens,
        )
        return trainer_pb2.TrainReply(policy_version=self.engine.policy_version, metrics=metrics)

    def logprobs(self, request: trainer_pb2.LogprobsRequest) -> trainer_pb2.LogprobsReply:
        values = self.engine.logprobs(to_seqs(request.sequences), request.temperature or 1.0)
        return trainer_pb2.LogprobsReply(
            policy_version=self.engine.policy_version,
            logprobs=[trainer_pb2.TokenLogprobs(values=v.tolist()) for v in values],
        )

    def save(self, request: trainer_pb2.SaveRequest) -> trainer_pb2.SaveReply:
        checksums = self.engine.save(Path(request.path), train_state=not request.weights_only)
        return trainer_pb2.SaveReply(path=request.path, policy_version=self.engine.policy_version, checksums=checksums)

    def load(self, request: trainer_pb2.LoadRequest) -> trainer_pb2.LoadReply:
        return trainer_pb2.LoadReply(policy_version=self.engine.load(Path(request.path)))

    def publish(self, request: trainer_pb2.PublishWeightsRequest) -> trainer_pb2.PublishWeightsReply | None:
        ws, engine = self.weightsync, self.engine
        transport = kind(choose(ws.transport))
        # A GPU transport packs from GPU tensors: gathering to the host first would cross PCIe twice.
        on_device = engine.device.type == "cuda" and transport.device_type == "cuda"
        dtype = torch_dtype(ws.cast_dtype) if ws.cast_dtype else None
        address, timeout_s = f"{ws.host}:{ws.grpc_port}", request.timeout_s or ws.timeout_s
        bucket_bytes = ws.bucket_bytes_for(transport.device_type)
        start = time.perf_counter()
        if ws.all_ranks_send and engine.world > 1 and engine.shares_weights and transport.max_senders > 1:
            plan = self._all_ranks.plan(engine.hf_layout(dtype), address, bucket_bytes, timeout_s)
            if plan is None:  # rank 0 raised: the weightsync service could not be asked
                return None
            # Cast as the engines want it (their registered dtype by default) inside the gather: an fp32
            # all-gather would move twice the bytes of a bf16 one.
            wire = dtype or (torch_dtype(plan.cast_dtype) if plan.cast_dtype else None)
            named = engine.gather_share(plan.owners(), on_device, wire)
            gather_s = time.perf_counter() - start
            result = self._all_ranks.send(list(named.items()), plan, engine.policy_version, address, timeout_s)
        else:
            sd = engine.full_state_dict(on_device, dtype)
            gather_s = time.perf_counter() - start
            if engine.rank != 0:
                return None
            result = self._lone_sender.publish(
                list(sd.items()), engine.policy_version, address, bucket_bytes, timeout_s
            )
        if result is None:  # ranks other than 0
            return None
        return trainer_pb2.PublishWeightsReply(
            policy_version=result.policy_version,
            payload_bytes=result.payload_bytes,
            publish_s=result.publish_s,
            checksum=result.checksum,
            num_endpoints=result.num_endpoints,
            received_checksums=result.received_checksums,
            num_readback_verified=result.num_readback_verified,
            gather_s=gather_s,
            apply_s=result.apply_s,
        )
