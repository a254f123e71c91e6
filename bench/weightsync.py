"""Refit benchmark: trainer GPU0 -> rollout GPU1 over NCCL, CUDA IPC on one GPU, the naive way and
checkpoint-engine, each against the link measured in the same run; `--cpu`: gloo and ucxx against a
raw socket. Self-contained: two processes rendezvous on localhost, no service, no gRPC.

    python bench/weightsync.py                 # GPU (2 GPUs): writes bench/results/weightsync/weightsync.json
    python bench/weightsync.py --cpu           # CPU: writes bench/results/weightsync/weightsync_cpu.json
    python bench/weightsync.py --smoke         # seconds on CPU: checks that the script runs
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import socket
import sys
import time
import traceback
import types
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import stamp  # noqa: E402 - bench/ is this script's own folder

from services.rollout.vllm_ext import copy_into  # noqa: E402
from services.weightsync.kernels import checksum as cs  # noqa: E402
from services.weightsync.transfer.arrival import receive_buckets, view_buckets  # noqa: E402
from services.weightsync.transfer.pack import new_ring, pack_into, packed_buckets, slot_view, unpack  # noqa: E402
from services.weightsync.transfer.plan import ReceiverLayout, make_plan  # noqa: E402
from services.weightsync.transfer.timing import Marks  # noqa: E402
from services.weightsync.transports import kind  # noqa: E402
from services.weightsync.transports.base import Transfer, Transport  # noqa: E402

# (hidden, layers, heads, kv_heads, intermediate, vocab, tied embeddings, qkv bias)
SHAPES = {
    "qwen2-0.5b": (896, 24, 14, 2, 4864, 151936, True, True),
    "qwen2-1.5b": (1536, 28, 12, 2, 8960, 151936, True, True),
    "llama-8b": (4096, 32, 32, 8, 14336, 128256, False, False),
    "smoke": (64, 2, 4, 2, 128, 512, True, True),
}
GB = 1e9


def state_shapes(name: str) -> list[tuple[str, tuple[int, ...]]]:
    hidden, layers, heads, kv, inter, vocab, tied, bias = SHAPES[name]
    head_dim, out = hidden // heads, [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}"
        for part, rows in (("q", heads * head_dim), ("k", kv * head_dim), ("v", kv * head_dim)):
            out.append((f"{p}.self_attn.{part}_proj.weight", (rows, hidden)))
            if bias:
                out.append((f"{p}.self_attn.{part}_proj.bias", (rows,)))
        out += [(f"{p}.self_attn.o_proj.weight", (hidden, heads * head_dim))]
        out += [(f"{p}.mlp.{m}_proj.weight", (inter, hidden)) for m in ("gate", "up")]
        out += [(f"{p}.mlp.down_proj.weight", (hidden, inter))]
        out += [(f"{p}.{n}.weight", (hidden,)) for n in ("input_layernorm", "post_attention_layernorm")]
    out.append(("model.norm.weight", (hidden,)))
    if not tied:
        out.append(("lm_head.weight", (vocab, hidden)))
    return out


def random_state(name: str, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator(device).manual_seed(0)
    return [(n, torch.randn(s, generator=g, device=device, dtype=torch.bfloat16)) for n, s in state_shapes(name)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _group(store_port: int, prefix: str, rank: int, backend: str, timeout_s: float) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        store_host="127.0.0.1", store_port=store_port, prefix=prefix, world_size=2, rank=rank,
        backend=backend, timeout_s=timeout_s,
    )  # fmt: skip


class Channel:
    """A transport and one phase's group, as the services hand them to a sender and a receiver."""

    def __init__(self, transport: Transport, group, source):
        self.transport, self.group, self.source = transport, group, source
        self.device = transport.device()

    def at(self, tag: str) -> Transfer:
        return Transfer(self.group, self.source, tag)

    def receive(self, index: int, out: torch.Tensor, tag: str) -> None:
        self.transport.receive(self.at(tag), index, out)


class Peer:
    """One of the two benchmark processes: a store for small messages and a barrier-able group."""

    def __init__(self, rank: int, store_port: int, backend: str, timeout_s: float = 300.0):
        self.rank, self.store_port, self.backend, self.timeout_s = rank, store_port, backend, timeout_s
        self.store = dist.TCPStore("127.0.0.1", store_port, 2, is_master=rank == 0, timeout=_td(timeout_s))
        self.device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        self.phase = 0
        self.refits = 0  # both processes run the same refits in the same order: a tag needs no exchange
        # The sender's shared ring and listener outlive a phase, as in a trainer process; a collective's
        # group is the phase's own (a fresh transport, its communicators freed with it).
        self.kept: dict[str, Transport] = {}

    def transport(self, backend: str | None = None, source=None) -> Channel:
        self.phase += 1
        backend = backend or self.backend
        group = _group(self.store_port, f"p{self.phase}", self.rank, backend, self.timeout_s)
        return Channel(self.transport_of(backend), group, source)

    def transport_of(self, backend: str) -> Transport:
        if kind(backend).max_senders > 1:
            return kind(backend)()
        if backend not in self.kept:
            self.kept[backend] = kind(backend)()
        return self.kept[backend]

    def barrier(self, name: str) -> None:
        self.store.add(f"barrier/{name}", 1)
        self.store.wait([f"barrier/{name}/go"] if self.rank else [], _td(self.timeout_s))
        if self.rank == 0:
            while self.store.add(f"barrier/{name}", 0) < 2:
                time.sleep(0.0005)
            self.store.set(f"barrier/{name}/go", b"1")


def _td(s: float):
    import datetime

    return datetime.timedelta(seconds=s)


def timed(peer: Peer, name: str, fn) -> float:
    """Seconds from a common start to both sides done (the slower side counts)."""
    _sync(peer.device)
    peer.barrier(name)
    start = time.perf_counter()
    fn()
    _sync(peer.device)
    elapsed = time.perf_counter() - start
    peer.store.set(f"time/{name}/{peer.rank}", str(elapsed))
    peer.store.wait([f"time/{name}/{1 - peer.rank}"], _td(peer.timeout_s))
    return max(elapsed, float(peer.store.get(f"time/{name}/{1 - peer.rank}")))


def best(peer: Peer, name: str, fn, reps: int) -> float:
    return min(timed(peer, f"{name}/{r}", fn) for r in range(reps))


def link(peer: Peer, nbytes: int, reps: int) -> float:
    """GB/s of one large broadcast rank 0 -> rank 1: the physical floor every path is held against."""
    t = peer.transport()
    buf = torch.ones(nbytes, dtype=torch.uint8, device=peer.device)
    t.receive(0, buf, "warmup")
    return nbytes / best(peer, f"link{nbytes}", lambda: t.receive(0, buf, "link"), reps) / GB


def naive(peer: Peer, shape: str, reps: int) -> float:
    """One broadcast per tensor, the way TRL/OpenRLHF did it: seconds."""
    t = peer.transport()
    named = random_state(shape, peer.device) if peer.rank == 0 else None
    tensors = [t_ for _, t_ in named] if named else [torch.empty(s, dtype=torch.bfloat16, device=peer.device)
                                                     for _, s in state_shapes(shape)]  # fmt: skip
    return best(peer, f"naive/{shape}", lambda: [t.receive(0, x, "naive") for x in tensors], reps)


def ours(peer: Peer, shape: str, bucket_bytes: int, num_buffers: int, reps: int, backend=None, apply=True) -> float:
    """A refit as the services do it, in seconds: plan once, pack into a ring while sending, checksum both
    sides, receive the whole version, verify it against the sender's checksums (the commit), then copy
    it into the engine's tensors the way an engine's load_weights gets it (views of the received buckets).
    apply=False stops after the verification (what an engine that adopted the buffers would pay)."""
    backend = backend or peer.backend
    plan, lookup, ring, t, engine = _refit_setup(peer, shape, bucket_bytes, num_buffers, backend)
    algo = cs.algo_for(t.device)
    ring = ring or (new_ring(plan, t.device, num_buffers) if peer.rank == 0 else None)

    def once() -> None:
        # Counted on each side, not sent: a "tag" key re-set per refit let the receiver read the previous
        # refit's tag (its keys all set) and return while the sender waited for it until the deadline.
        peer.refits += 1
        tag = f"{shape[:12]}-{peer.phase}-{peer.refits}"
        transfer = t.at(tag)
        if peer.rank == 0:
            sums: list = []
            buckets = packed_buckets(plan, lookup, ring, sums)
            t.transport.send(transfer, buckets, plan.bucket_nbytes, (0,) * plan.num_buckets)
            peer.store.set(f"commit/{tag}", json.dumps(cs.digests(sums)))
            t.transport.end(transfer, failed=False)  # in place: until the receiver released the ring
            return
        sizes = list(plan.bucket_nbytes)
        if t.transport.in_place:  # verified where the bytes lie, then one copy into the engine
            buckets, sums = view_buckets(t.transport, transfer, sizes, Marks())
        else:
            buckets, sums = receive_buckets(t.transport, transfer, sizes, algo)
        # Blocks until the sender committed; set on every repetition, so every one is verified.
        assert sums == json.loads(peer.store.get(f"commit/{tag}")), "received buckets differ from the sent ones"
        if apply:
            copy_into(engine, unpack(buckets, plan))  # as the engines' load_weights does
        t.transport.release(transfer)

    seconds = best(peer, f"ours/{backend}/{shape}/{bucket_bytes}/{apply}", once, reps)
    if apply:
        _check_engine(engine, shape, t.device)
    return seconds


def _refit_setup(peer: Peer, shape: str, bucket_bytes: int, num_buffers: int, backend: str):
    """Both sides of a refit: the plan, the trainer's tensors (rank 0), the sender's shared ring if the
    transport has one, the transport, and the engine's tensors (rank 1)."""
    layout = tuple((n, "bfloat16", s) for n, s in state_shapes(shape))
    plan = make_plan(layout, ReceiverLayout(), bucket_bytes)
    lookup = dict(random_state(shape, peer.device)) if peer.rank == 0 else {}
    source, ring = _source(peer, backend, plan, num_buffers)
    t = peer.transport(backend, source)
    engine = {} if peer.rank == 0 else {s.name: torch.empty(s.shape, dtype=torch.bfloat16, device=t.device)
                                         for s in plan.slots}  # fmt: skip
    return plan, lookup, ring, t, engine


def _check_engine(engine: dict[str, torch.Tensor], shape: str, device: torch.device) -> None:
    """The receiver's engine holds what the trainer sent (the same seeded draw); nothing to check on the sender."""
    if engine:
        assert all(torch.equal(engine[n], x) for n, x in random_state(shape, device)), "engine tensors differ"


def ipc_unverified(peer: Peer, shape: str, bucket_bytes: int, num_buffers: int, reps: int) -> float:
    """The peers' CUDA IPC refit (NeMo-RL, verl), seconds: the sender packs each bucket into the shared ring
    and the engine copies its tensors straight out of it. Two copies, no checksum, no staging: a tensor
    is in the engine before anyone could know the version arrived whole. The baseline for what our
    verification costs, not a path of ours."""
    plan, lookup, ring, t, engine = _refit_setup(peer, shape, bucket_bytes, num_buffers, "cuda_ipc")
    ipc = t.transport

    def once() -> None:
        peer.refits += 1
        tag = f"{shape[:12]}-{peer.phase}-{peer.refits}"
        transfer = t.at(tag)
        if peer.rank == 0:

            def packed():
                for i in range(plan.num_buckets):
                    buf = ring[i][: plan.bucket_nbytes[i]]
                    pack_into(buf, plan, i, lookup)
                    yield i, buf

            ipc.send(transfer, packed(), plan.bucket_nbytes, (0,) * plan.num_buckets)
            ipc.end(transfer, failed=False)
            return
        for i in range(plan.num_buckets):
            src = ipc.view(transfer, i, plan.bucket_nbytes[i])
            for s in plan.by_bucket[i]:
                engine[s.name].copy_(slot_view(src, s))
        ipc.release(transfer)

    seconds = best(peer, f"unverified/{shape}/{bucket_bytes}", once, reps)
    _check_engine(engine, shape, t.device)
    return seconds


def copy_floor(peer: Peer, nbytes: int, reps: int) -> float:
    """Seconds of one plain device copy of nbytes on the receiver's GPU: the HBM floor of CUDA IPC."""
    if peer.rank == 0:
        return best(peer, f"copy{nbytes}", lambda: None, reps)
    bufs = torch.ones(2, nbytes, dtype=torch.uint8, device=peer.device)
    seconds = best(peer, f"copy{nbytes}", lambda: bufs[1].copy_(bufs[0]), reps)
    bufs = None  # the IPC paths that follow need the memory
    torch.cuda.empty_cache()
    return seconds


def _source(peer: Peer, backend: str, plan, num_buffers: int):
    # Keys per phase: a key left by the previous shape would hand the receiver stale handles.
    key = f"{backend}/{peer.phase}"
    if backend == "cuda_ipc":
        from services.weightsync.transports.cuda_ipc import IpcBuffer

        if peer.rank == 0:
            size = _ring_size(plan, num_buffers, backend)
            ring, offer = peer.transport_of(backend).offer(max(plan.bucket_nbytes), size, "")
            peer.store.set(key, json.dumps([_b64(b) for b in offer.ipc_buffers]))
            return types.SimpleNamespace(ipc_buffers=offer.ipc_buffers), ring
        shared = [IpcBuffer(**_unb64(d)) for d in json.loads(peer.store.get(key))]
        return types.SimpleNamespace(ipc_buffers=shared), None
    if backend == "ucxx":
        if peer.rank == 0:
            _, offer = peer.transport_of(backend).offer(
                max(plan.bucket_nbytes), _ring_size(plan, num_buffers, backend), "127.0.0.1"
            )
            peer.store.set(key, offer.ucxx_address)
        return types.SimpleNamespace(ucxx_address=peer.store.get(key).decode()), None
    return None, None


def _ring_size(plan, num_buffers: int, backend: str) -> int:
    """In place (cuda_ipc) the ring holds the whole version, as in the services."""
    return plan.num_buckets if kind(backend).in_place else min(num_buffers, plan.num_buckets)


def _b64(b) -> dict:
    return {f: base64.b64encode(v).decode() if isinstance(v, bytes) else v for f, v in dataclasses.asdict(b).items()}


def _unb64(d: dict) -> dict:
    binary = ("handle", "ref_counter_handle", "event_handle")
    return {f: base64.b64decode(v) if f in binary else v for f, v in d.items()}


def checkpoint_engine(rank: int, shape: str, store_port: int) -> float:
    """MoonshotAI checkpoint-engine's broadcast update (pinned host -> GPU0 -> NCCL -> IPC): seconds."""
    import threading

    sys.modules.setdefault("checkpoint_engine.api", types.ModuleType("checkpoint_engine.api"))  # FastAPI-only
    sys.modules["checkpoint_engine.api"].request_inference_to_update = None
    import zmq
    from checkpoint_engine.ps import ParameterServer
    from checkpoint_engine.worker import update_weights_from_ipc

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port + 7))
    ps = ParameterServer(auto_pg=True)
    named = dict(random_state(shape, torch.device("cuda", 0))) if rank == 0 else {}
    ps.register_checkpoint("bench", named_tensors={n: t.cpu() for n, t in named.items()})
    del named
    ps.gather_metas("bench")
    got: dict = {}

    def req(socket_paths: list[tuple[str, str]]) -> None:
        handle = dict(socket_paths)[ps._device_uuid]

        def run(weights):
            got.update((n, t.clone()) for n, t in weights)

        thread = threading.Thread(
            target=update_weights_from_ipc, args=(zmq.Context(), handle, rank), kwargs={"run": run}
        )
        thread.start()

    start = time.perf_counter()
    ps.update("bench", req)
    torch.cuda.synchronize()
    return time.perf_counter() - start


class Results(dict):
    """One process's measurements, each also written to the shared dict the moment it is recorded, so
    what finished comes back when the parent kills a process that hangs."""

    def __init__(self, rank: int, shared):
        super().__init__(_rank=rank)
        self.shared = shared

    def __setitem__(self, key: str, value) -> None:
        super().__setitem__(key, value)
        self.shared[f"{key}@{self['_rank']}"] = value


def _record(results: Results, key: str, fn) -> None:
    """Run one measurement; a failure is recorded as its error and the run goes on."""
    print(f"[rank {results['_rank']}] {key} ...", flush=True)
    try:
        results[key] = fn()
        print(f"[rank {results['_rank']}] {key} = {results[key]}", flush=True)
    except Exception as e:
        results[key] = {"error": f"{type(e).__name__}: {e}"}
        traceback.print_exc()


def gpu_worker(rank: int, port: int, args, shared) -> None:
    torch.cuda.set_device(0 if args.ipc_only else rank)
    peer, res = Peer(rank, port, "nccl", args.transfer_timeout_s), Results(rank, shared)
    for shape in [] if args.ipc_only else args.shapes:  # NCCL needs a GPU per process
        if "link_GBps" not in res:
            _record(res, "link_GBps", lambda: link(peer, args.link_bytes, args.reps))
        _record(res, f"naive_s/{shape}", partial(naive, peer, shape, args.reps))
        for bucket in args.bucket_bytes:
            _record(res, f"nccl_s/{shape}/{bucket}", partial(ours, peer, shape, bucket, args.num_buffers, args.reps))
    torch.cuda.set_device(0)  # CUDA IPC: sender and receiver processes on one GPU
    peer.device = torch.device("cuda", 0)
    for shape in args.shapes:
        _record(res, f"copy_s/{shape}", partial(copy_floor, peer, payload_bytes(shape), args.reps))
        for bucket in args.bucket_bytes:
            ipc = partial(ours, peer, shape, bucket, args.num_buffers, args.reps, "cuda_ipc")
            _record(res, f"ipc_s/{shape}/{bucket}", ipc)
            _record(res, f"ipc_receive_s/{shape}/{bucket}", partial(ipc, apply=False))
            unverified = partial(ipc_unverified, peer, shape, bucket, args.num_buffers, args.reps)
            _record(res, f"ipc_unverified_s/{shape}/{bucket}", unverified)


def ckpt_worker(rank: int, port: int, args, shared) -> None:
    torch.cuda.set_device(rank)
    res = Results(rank, shared)
    _record(res, f"ckpt_engine_s/{args.shapes[-1]}", lambda: checkpoint_engine(rank, args.shapes[-1], port))


def cpu_worker(rank: int, port: int, args, shared) -> None:
    os.environ.update(UCX_NET_DEVICES="lo", UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
    peer, res = Peer(rank, port, "gloo", args.transfer_timeout_s), Results(rank, shared)
    _record(res, "socket_GBps", lambda: raw_socket(peer, args.link_bytes, args.reps))
    _record(res, "link_GBps", lambda: link(peer, args.link_bytes, args.reps))
    for shape in args.shapes:
        bucket = args.bucket_bytes[0]
        _record(res, f"naive_s/{shape}", partial(naive, peer, shape, args.reps))
        _record(res, f"gloo_s/{shape}", partial(ours, peer, shape, bucket, args.num_buffers, args.reps))
        if not args.smoke:
            _record(res, f"ucxx_s/{shape}", partial(ours, peer, shape, bucket, args.num_buffers, args.reps, "ucxx"))


def raw_socket(peer: Peer, nbytes: int, reps: int) -> float:
    """GB/s of one TCP stream on loopback, rank 0 -> rank 1: the floor of every CPU path."""
    buf = bytearray(nbytes)
    if peer.rank == 1:
        srv = socket.create_server(("127.0.0.1", 0))
        peer.store.set("sock", str(srv.getsockname()[1]))
        conn, _ = srv.accept()
        view = memoryview(buf)

        def recv_all() -> None:
            got = 0
            while got < nbytes:
                got += conn.recv_into(view[got:], nbytes - got)
    else:
        conn = socket.create_connection(("127.0.0.1", int(peer.store.get("sock"))))

        def recv_all() -> None:
            conn.sendall(buf)

    seconds = best(peer, "socket", recv_all, reps)
    conn.close()
    return nbytes / seconds / GB


def payload_bytes(shape: str) -> int:
    return sum(2 * _numel(s) for _, s in state_shapes(shape))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def run(worker, args, timeout_s: float) -> dict:
    """Two processes on a fresh port; whatever they recorded comes back even if one hangs or dies."""
    port = _free_port()
    with mp.Manager() as manager:
        shared = manager.dict()
        ctx = mp.start_processes(worker, args=(port, args, shared), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=max(1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                shared["timeout"] = f"{worker.__name__} still running after {timeout_s:.0f}s: killed"
                break
        out = dict(shared)
    rank0 = {k.removesuffix("@0"): v for k, v in out.items() if not k.endswith("@1") and not k.startswith("_rank")}
    # The receiver's errors name what it waited for: kept beside the sender's view of the same step.
    rank1_errors = {f"rank1/{k.removesuffix('@1')}": v for k, v in out.items() if k.endswith("@1") and _error(v)}
    return {**rank0, **rank1_errors}


def _error(v) -> bool:
    return isinstance(v, dict) and "error" in v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _num(v):
    return v if isinstance(v, (int, float)) else None


def summarize(raw: dict, args, command: str) -> dict:
    out = {"raw": raw, "notes": [], **stamp(), "command": command, "shapes": {}}
    out["link_GBps"] = _num(raw.get("link_GBps"))
    big = args.shapes[-1]
    for shape in args.shapes:
        n = payload_bytes(shape)
        row = {"bytes": n}
        for key, value in raw.items():
            path, _, rest = key.partition("/")
            if rest.split("/")[0] == shape and _num(value):
                row[path + rest.removeprefix(shape)] = value
                row[(path + rest.removeprefix(shape)).replace("_s", "_GBps", 1)] = n / value / GB
        out["shapes"][shape] = row
    row = out["shapes"][big]
    nccl = [v for k, v in row.items() if k.startswith("nccl_GBps")]
    out["nccl_8b_GBps"] = max(nccl) if nccl else None
    out["nccl_8b_frac_of_link"] = out["nccl_8b_GBps"] / out["link_GBps"] if nccl and out["link_GBps"] else None
    out.update(_ipc_headline(row))
    out["naive_8b_GBps"] = row.get("naive_GBps")
    ckpt = row.get("ckpt_engine_s")
    best_nccl = min((v for k, v in row.items() if k.startswith("nccl_s")), default=None)
    out["speedup_vs_checkpoint_engine"] = ckpt / best_nccl if ckpt and best_nccl else None
    if out["speedup_vs_checkpoint_engine"] is None:
        out["notes"].append(f"checkpoint-engine did not run: {raw.get('ckpt_engine_s/' + big, 'not attempted')}")
    out["notes"] += [f"{k}: {v['error']}" for k, v in raw.items() if _error(v)]
    out["notes"] += [raw["timeout"]] if "timeout" in raw else []
    if "socket_GBps" in raw:  # --cpu: the CPU paths against a raw TCP stream on loopback
        out["socket_GBps"] = _num(raw["socket_GBps"])
        for path in ("gloo", "ucxx", "naive"):
            out[f"{path}_GBps"] = row.get(f"{path}_GBps")
            ok = out[f"{path}_GBps"] and out["socket_GBps"]
            out[f"{path}_frac_of_socket"] = out[f"{path}_GBps"] / out["socket_GBps"] if ok else None
        out["notes"].append("--cpu: link_GBps is a plain gloo broadcast; the GPU headline keys are null here")
        for key in ("nccl_8b_GBps", "nccl_8b_frac_of_link", "naive_8b_GBps", *_ipc_headline({})):
            out[key] = None
    return out


def _ipc_headline(row: dict) -> dict:
    """The best bucket size's full CUDA IPC refit in ms/GB, beside a plain device copy of the same bytes."""
    ipc = {k.split("/")[1]: v for k, v in row.items() if k.startswith("ipc_s/")}
    bucket = min(ipc, key=ipc.get) if ipc else None
    gb, copy_s = row.get("bytes", 0) / GB, row.get("copy_s")
    receive_s = row.get(f"ipc_receive_s/{bucket}")
    unverified_s = min((v for k, v in row.items() if k.startswith("ipc_unverified_s/")), default=None)
    return {
        "ipc_ms_per_GB": ipc[bucket] * 1e3 / gb if bucket else None,
        "ipc_bucket_bytes": int(bucket) if bucket else None,
        "ipc_receive_ms_per_GB": receive_s * 1e3 / gb if receive_s else None,
        "copy_ms_per_GB": copy_s * 1e3 / gb if copy_s else None,
        "ipc_over_copy": ipc[bucket] / copy_s if bucket and copy_s else None,
        "ipc_unverified_ms_per_GB": unverified_s * 1e3 / gb if unverified_s else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="gloo and ucxx against a raw socket")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run that checks the script works")
    p.add_argument("--shapes", nargs="+", default=None, help=f"among {list(SHAPES)}; the last is the headline")
    p.add_argument("--bucket-bytes", nargs="+", type=int, default=[512 * 2**20, 2**30])
    p.add_argument("--num-buffers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--link-bytes", type=int, default=4 * 2**30)
    p.add_argument("--skip-checkpoint-engine", action="store_true")
    p.add_argument("--ipc-only", action="store_true", help="one GPU: only the CUDA IPC path")
    p.add_argument("--timeout-s", type=float, default=1800, help="the whole run's")
    p.add_argument("--transfer-timeout-s", type=float, default=300, help="each transfer's and barrier's deadline")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    command = "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    cpu = args.cpu or args.smoke
    if args.smoke:
        args.shapes, args.bucket_bytes, args.link_bytes, args.reps = ["smoke"], [16 * 1024], 2**20, 1
    elif cpu:
        args.shapes = args.shapes or ["qwen2-0.5b"]
        args.bucket_bytes, args.link_bytes = [args.bucket_bytes[0] // 8], args.link_bytes // 16
    args.shapes = args.shapes or ["qwen2-0.5b", "qwen2-1.5b", "llama-8b"]
    raw = run(cpu_worker if cpu else gpu_worker, args, args.timeout_s)
    if not cpu and not args.skip_checkpoint_engine and not args.ipc_only:
        raw.update(run(ckpt_worker, args, args.timeout_s / 2))
    result = summarize(raw, args, command)
    default = "/tmp/weightsync_smoke.json" if args.smoke else f"weightsync{'_cpu' if cpu else ''}.json"
    out = Path(args.out or (default if args.smoke else ROOT / "bench" / "results" / "weightsync" / default))
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("raw", "shapes")}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
