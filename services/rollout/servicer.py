"""Rollout gRPC edge: info and versioned in-place weight loads, only of versions the run's trainer signed and
never back to an older one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from protos.grpo.v1 import rollout_pb2, rollout_pb2_grpc, weights_pb2
from services.common.grpcio import PreconditionError, servicer_edge
from services.weightsync.kernels import checksum as cs
from services.weightsync.transfer.receiver import Receiver

from .engine import Engine

log = logging.getLogger(__name__)


class _Load:
    """A verified version waiting to be applied, by whichever thread holds the engine first."""

    def __init__(self, apply: Callable[[], object]):
        self.apply, self.done, self.result, self.error = apply, threading.Event(), None, None

    def run(self) -> None:
        try:
            self.result = self.apply()
        except BaseException as e:  # handed back to the RPC's thread, which raises it
            self.error = e
        finally:
            self.done.set()


class EngineState:
    """The engine plus what every thread of the worker reads: the applied version and a lock."""

    def __init__(self, engine: Engine, worker_id: str, engine_name: str, inflight: bool = False):
        self.engine, self.worker_id, self.engine_name = engine, worker_id, engine_name
        self.lock = threading.Lock()
        self.weights_lock = threading.Lock()
        """Held while a refit reads the engine's weights back outside `lock` (generation runs on meanwhile); whoever
        frees them (sleep) takes it first, and `lock` only after it."""
        self.inflight = inflight
        """Load a refit between the decode steps of a running generation (asynchronous GRPO) instead of after it."""
        self._waiting: list[_Load] = []
        self._waiting_lock = threading.Lock()
        self.pause_s = 0.0
        """Seconds generation stood still for in-flight loads (heartbeats carry it: async/rollout_pause_s)."""
        self.policy_version = 0
        self.wanted_version = 0
        """The newest version the run is known to be at (registration, claimed work): above policy_version, the
        worker is behind (it joined, or was left out of a refit while it did not answer) and takes no work."""
        self.num_groups_done = 0
        self.idle_s = 0.0
        """Seconds the worker waited for work that did not come (heartbeats carry it: async/rollout_idle_s)."""

    @property
    def behind(self) -> bool:
        return self.policy_version < self.wanted_version

    def apply(self, load: Callable[[], object]) -> object:
        """Run `load` with the engine to itself: at once where no generation runs; where one does, between two of
        its decode steps (inflight: the generating thread runs it in between_steps) or after it. Returns its
        result, or raises its error."""
        waiting = _Load(load)
        with self._waiting_lock:
            self._waiting.append(waiting)
        while not waiting.done.wait(0.001):
            if not self.lock.acquire(timeout=0.01):
                continue
            try:
                if self._take(waiting):
                    waiting.run()
            finally:
                self.lock.release()
        if waiting.error is not None:
            raise waiting.error
        return waiting.result

    def _take(self, waiting: _Load) -> bool:
        """Whether `waiting` is still to run, and now this thread's to run."""
        with self._waiting_lock:
            if waiting not in self._waiting:
                return False
            self._waiting.remove(waiting)
            return True

    def between_steps(self) -> int:
        """The engine's hook between decode steps (the generating thread holds the lock): a verified version
        waiting is loaded now, generation paused meanwhile. Returns the version the next tokens are sampled by."""
        if self._waiting:
            start = time.perf_counter()
            with self._waiting_lock:
                ready, self._waiting = self._waiting, []
            for waiting in ready:
                waiting.run()
            self.pause_s += time.perf_counter() - start
        return self.policy_version


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, state: EngineState):
        self.state = state
        self.receiver = Receiver()

    @servicer_edge
    def Info(self, request, context):
        s = self.state
        return rollout_pb2.InfoReply(
            worker_id=s.worker_id,
            engine=s.engine_name,
            policy_version=s.policy_version,
            num_groups_done=s.num_groups_done,
        )

    @servicer_edge
    def LoadWeights(self, request, context):
        m = request.manifest
        if not m.tensors or not m.buckets:
            raise ValueError("manifest has no tensors")
        if request.group.world_size < 2 or not 0 < request.group.rank < request.group.world_size:
            raise ValueError(f"bad transfer group rank {request.group.rank} of {request.group.world_size}")
        _refuse_older(m.policy_version, self.state.policy_version)
        start = time.perf_counter()
        # Everything arrives and is verified against the sender's signed checksums before the engine is
        # touched (Receiver.receive): a failed or forged transfer leaves the previous version fully in service.
        with self.receiver.receive(m, request.group, request.source, request.refit_id) as (named, received):
            received_at = time.perf_counter()

            def load() -> tuple[float, float, dict[str, torch.Tensor]]:
                locked_at = time.perf_counter()  # generation holds the engine until a step or a call ends
                # Again with the engine held: a joiner's pull and a refit may arrive together. The version held
                # already (a retried refit, or one repeated for a joining worker, in which a collective transport
                # needs every member) was received and verified, and is not loaded again.
                _refuse_older(m.policy_version, self.state.policy_version)
                if m.policy_version > self.state.policy_version:
                    self.state.engine.load_weights(named)
                    self.state.policy_version = m.policy_version
                return locked_at, time.perf_counter(), self.state.engine.read_weights()

            # The read-back's checksums run after the engine is let go: a load between decode steps pauses
            # generation for the copy only (with them, the copy was a third to a half of the pause: bench/README.md,
            # "Asynchronous steps on one GPU"). Nothing writes the weights before this reply but the next refit,
            # which waits for it; the weights lock keeps them from being freed (sleep) meanwhile.
            with self.state.weights_lock:
                locked_at, loaded_at, held = self.state.apply(load)
                readback = read_back(held, list(m.tensors), m.checksum_algo)
        end = time.perf_counter()
        log.info(
            "version %d applied in %.3fs: received and verified %.3fs, waited for the engine %.3fs, "
            "loaded %.3fs, read back %d tensors %.3fs (after the engine was let go)",
            m.policy_version, end - start, received_at - start, locked_at - received_at,
            loaded_at - locked_at, len(readback), end - loaded_at,
        )  # fmt: skip
        return rollout_pb2.LoadWeightsReply(
            policy_version=m.policy_version,
            received_checksum=received,
            readback_checksums=readback,
            apply_s=end - start,
        )


def _refuse_older(policy_version: int, held_version: int) -> None:
    """An older version than the engine holds is never applied: replayed, it would roll the policy back."""
    if policy_version < held_version:
        raise PreconditionError(f"version {policy_version} is older than version {held_version}, the one held here")


# Tensors up to this size are read back and checksummed on every refit (norms, biases, a small model
# whole). Larger ones are covered by the bucket checksums of what arrived.
READBACK_MAX_NUMEL = 2**22


def read_back(held: dict[str, torch.Tensor], specs: list[weights_pb2.TensorSpec], algo: str) -> dict[str, str]:
    """Checksums of the engine's tensors under the manifest's names, where the engine exposes them, in the
    family of the manifest's bucket checksums (checksum.tensor_digests).

    vLLM pads the vocabulary dimension of embeddings and lm_head; the padding rows are cut off. A tensor
    the engine holds in another dtype than it arrived in cannot be compared: that is logged, since it
    means a weightsync.cast_dtype other than the engine's.
    """
    named, other_dtype = [], set()
    for s in specs:
        t = held.get(s.name)
        if t is None or t.numel() > READBACK_MAX_NUMEL:
            continue
        shape = tuple(s.shape)
        if tuple(t.shape) != shape and t.shape[1:] == shape[1:] and t.shape[0] >= shape[0]:
            t = t[: shape[0]]
        if tuple(t.shape) != shape:
            continue
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype == s.dtype:
            named.append((s.name, t))
        else:
            other_dtype.add((s.dtype, dtype))
    if other_dtype:
        log.warning(
            "%s arrived for weights held as %s: those are cast on load and not read back; leave "
            "weightsync.cast_dtype empty (the engine's dtype) or set it to the engine's",
            *map(sorted, zip(*other_dtype)),
        )
    return cs.tensor_digests(named, algo)
