"""The real trainer under torchrun (2 gloo ranks) over real gRPC, checked against plain transformers."""

import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
import pytest
import torch

from protos.grpo.v1 import rollout_pb2, rollout_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from services.common.grpcio import channel, wait_healthy
from services.common.ports import free_port

REPO = Path(__file__).resolve().parents[2]
LR, WEIGHT_DECAY, MAX_GRAD_NORM, CLIP_EPS, KL_BETA = 1e-3, 0.01, 1.0, 0.2, 0.1
METRIC_KEYS = {
    "loss",
    "grad_norm",
    "kl",
    "num_tokens",
    "timing/logprobs_s",
    "timing/policy_training_s",
    "mismatch/mult_prob_error",
    "peak_mem_GiB",
}


def _overrides(model_dir: Path, port: int) -> list[str]:
    # Weightsync runs only during the publish test, on ports reserved now because the trainer reads them at start.
    return [
        f"model.path={model_dir}",
        f"trainer.grpc_port={port}",
        "trainer.num_ranks=2",
        f"trainer.lr={LR}",
        f"trainer.weight_decay={WEIGHT_DECAY}",
        f"trainer.max_grad_norm={MAX_GRAD_NORM}",
        f"trainer.loss.clip_eps={CLIP_EPS}",
        f"trainer.loss.kl_beta={KL_BETA}",
        "trainer.max_tokens_per_microbatch=16",
        f"weightsync.grpc_port={free_port()}",
        f"weightsync.store_port={free_port()}",
        "weightsync.timeout_s=30",
    ]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_model):
    tmp, model_dir, port = tmp_path_factory.mktemp("trainer"), tiny_model, free_port()
    overrides = [*_overrides(model_dir, port), f"trainer.checkpoint_root={tmp}"]
    log_path = tmp / "trainer.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "services.trainer.main", *overrides]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    _wait_serving(address, 120, proc, log_path)
    children = psutil.Process(proc.pid).children(recursive=True)
    with channel(address) as ch:
        yield {
            "proc": proc,
            "children": children,
            "ch": ch,
            "stub": trainer_pb2_grpc.TrainerStub(ch),
            "model_dir": model_dir,
            "tmp": tmp,
            "log": log_path,
            "overrides": overrides,
        }
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    for p in children:
        if p.is_running():
            p.kill()


def _wait_serving(address: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None:
            assert proc.poll() is None, f"exited:\n{log.read_text()[-3000:]}"
        try:
            return wait_healthy(address, 2)
        except (TimeoutError, grpc.RpcError):
            assert time.monotonic() < deadline, f"nothing serving at {address}"


def _seqs(vocab: int) -> list[trainer_pb2.Sequence]:
    # 16 + 8 + 8 + 8 tokens with 16 per micro-batch: rank 0 runs two micro-batches, rank 1 one.
    rng = random.Random(0)
    shapes = [(6, 10, 1.0), (3, 5, -0.5), (4, 4, 0.25), (2, 6, -1.0)]
    return [
        trainer_pb2.Sequence(
            prompt_ids=[rng.randrange(vocab) for _ in range(p)],
            response_ids=[rng.randrange(vocab) for _ in range(r)],
            rollout_logprobs=[-rng.uniform(3.5, 5.0) for _ in range(r)],
            advantage=a,
        )
        for p, r, a in shapes
    ]


def _hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _hf_logprobs(model, s: trainer_pb2.Sequence, temperature: float = 1.0) -> torch.Tensor:
    """Response-token logprobs of one sequence, run alone and unpacked, under softmax(logits / temperature)."""
    ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
    logp_TV = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].float() / temperature, dim=-1)
    p = len(s.prompt_ids)
    return torch.stack([logp_TV[p + j - 1, t] for j, t in enumerate(s.response_ids)])


def test_compute_logprobs_equal_plain_transformers(trainer):
    model = _hf(trainer["model_dir"])
    seqs = _seqs(model.config.vocab_size)
    # Four sequences split over both ranks, then one sequence: rank 1 has nothing and runs a dummy pass.
    for batch in (seqs, seqs[2:3]):
        reply = trainer["stub"].ComputeLogprobs(trainer_pb2.LogprobsRequest(sequences=batch), timeout=60)
        assert reply.policy_version == 0
        with torch.no_grad():
            for s, got in zip(batch, reply.logprobs, strict=True):
                assert (torch.tensor(got.values) - _hf_logprobs(model, s)).abs().max() < 1e-5
    # Sampled at temperature 0.7, tokens are scored under the sharper distribution they were drawn from.
    reply = trainer["stub"].ComputeLogprobs(trainer_pb2.LogprobsRequest(sequences=seqs, temperature=0.7), timeout=60)
    with torch.no_grad():
        for s, got in zip(seqs, reply.logprobs, strict=True):
            assert (torch.tensor(got.values) - _hf_logprobs(model, s, 0.7)).abs().max() < 1e-5
            assert (torch.tensor(got.values) - _hf_logprobs(model, s)).abs().max() > 1e-3


def _reference_loss(model, seqs, ref_logps: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped GRPO loss plus k3 KL, one unpacked sequence at a time."""
    num_tokens = sum(len(s.response_ids) for s in seqs)
    total, kl_sum, mismatch = 0.0, 0.0, 0.0
    for s, ref in zip(seqs, ref_logps):
        logp = _hf_logprobs(model, s)
        old = logp.detach()  # one optimizer step per batch: the old policy is the current one
        ratio = torch.exp(logp - old)
        a = s.advantage
        pg = -torch.where(
            torch.tensor(a) >= 0,
            torch.minimum(ratio, torch.tensor(1 + CLIP_EPS)) * a,
            torch.maximum(ratio, torch.tensor(1 - CLIP_EPS)) * a,
        )
        k3 = torch.exp(ref - logp) - (ref - logp) - 1
        total = total + (pg + KL_BETA * k3).sum()
        kl_sum += k3.sum().item()
        mismatch += sum(math.exp(abs(x - y)) for x, y in zip(old.tolist(), s.rollout_logprobs))
    loss = total / num_tokens
    return loss, {"loss": loss.item(), "kl": kl_sum / num_tokens, "mismatch/mult_prob_error": mismatch / num_tokens}


def _reference_steps(model, seqs, num_steps: int) -> list[tuple[dict[str, torch.Tensor], dict[str, float]]]:
    """The same GRPO steps unsharded in one process, with clipping and AdamW written out by hand."""
    with torch.no_grad():
        ref_logps = [_hf_logprobs(model, s) for s in seqs]  # the frozen reference is the initial model
    params = dict(model.named_parameters())
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    out = []
    for step in range(1, num_steps + 1):
        model.zero_grad(set_to_none=True)
        loss, metrics = _reference_loss(model, seqs, ref_logps)
        loss.backward()
        grad_norm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in params.values()))
        coef = min(1.0, MAX_GRAD_NORM / (grad_norm + 1e-6))
        with torch.no_grad():
            for k, p in params.items():
                g = p.grad * coef
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
                p.mul_(1 - LR * WEIGHT_DECAY)
                p.sub_(LR * (m[k] / (1 - b1**step)) / ((v[k] / (1 - b2**step)).sqrt() + eps))
        out.append(({k: p.detach().clone() for k, p in params.items()}, {**metrics, "grad_norm": grad_norm}))
    return out


def test_train_steps_match_unsharded_reference(trainer):
    from safetensors.torch import load_file

    model = _hf(trainer["model_dir"])
    seqs = _seqs(model.config.vocab_size)
    # Two steps: the second has a KL term with a nonzero gradient and AdamW moments from the first.
    expected = _reference_steps(model, seqs, num_steps=2)
    for version, (expected_params, expected_metrics) in enumerate(expected, start=1):
        reply = trainer["stub"].Train(trainer_pb2.TrainRequest(step=version - 1, sequences=seqs), timeout=120)
        assert reply.policy_version == version
        assert set(reply.metrics) >= METRIC_KEYS
        assert reply.metrics["num_tokens"] == sum(len(s.prompt_ids) + len(s.response_ids) for s in seqs)
        assert reply.metrics["timing/policy_training_s"] > 0 and reply.metrics["timing/logprobs_s"] > 0
        for key, value in expected_metrics.items():
            assert reply.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        out = trainer["tmp"] / f"after_step_{version}"
        trainer["stub"].Save(trainer_pb2.SaveRequest(path=str(out)), timeout=60)
        got = load_file(out / "model.safetensors")
        assert set(got) == set(expected_params)
        worst = max((got[k] - expected_params[k]).abs().max().item() for k in expected_params)
        assert worst < 1e-4, f"step {version}: max |fsdp - reference| = {worst:.2e}"
    assert expected[1][1]["kl"] > 0


def test_malformed_requests_are_rejected_and_the_server_keeps_serving(trainer):
    stub = trainer["stub"]
    good = _seqs(78)
    short = trainer_pb2.Sequence()
    short.CopyFrom(good[1])
    del short.rollout_logprobs[-1]
    bad_token = trainer_pb2.Sequence(prompt_ids=[1, 2], response_ids=[3, 78], rollout_logprobs=[-1.0, -1.0])
    bad_mask, no_policy_token = trainer_pb2.Sequence(), trainer_pb2.Sequence()
    bad_mask.CopyFrom(good[0])
    bad_mask.loss_mask[:] = [True]
    no_policy_token.CopyFrom(good[0])
    no_policy_token.loss_mask[:] = [False] * len(good[0].response_ids)
    cases = [
        (stub.Train, trainer_pb2.TrainRequest(sequences=[good[0], short]), "sequence 1"),
        (stub.Train, trainer_pb2.TrainRequest(sequences=[good[1], bad_mask]), "1 loss_mask values"),
        (stub.Train, trainer_pb2.TrainRequest(sequences=[no_policy_token]), "marks no token as the policy's"),
        (stub.Train, trainer_pb2.TrainRequest(sequences=[]), "must not be empty"),
        (stub.ComputeLogprobs, trainer_pb2.LogprobsRequest(sequences=[bad_token]), "token id 78"),
        (stub.Save, trainer_pb2.SaveRequest(path=str(trainer["log"])), "not an empty folder"),
        (stub.Save, trainer_pb2.SaveRequest(path=str(trainer["model_dir"] / "out")), "outside"),
    ]
    for call, request, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        trainer["ch"].unary_unary("/grpo.v1.Trainer/Train")(b"\xff\xff", timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    reply = stub.ComputeLogprobs(trainer_pb2.LogprobsRequest(sequences=good[:1]), timeout=60)
    assert len(reply.logprobs[0].values) == len(good[0].response_ids)


def test_save_writes_an_hf_checkpoint_with_the_trainers_weights(trainer):
    from services.weightsync.kernels.checksum import tensor_checksum

    out = trainer["tmp"] / "saved"
    reply = trainer["stub"].Save(trainer_pb2.SaveRequest(path=str(out)), timeout=60)
    assert reply.policy_version >= 1 and Path(reply.path) == out
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {f.name for f in out.iterdir()}
    model = _hf(out)
    sd = model.state_dict()
    assert "lm_head.weight" in reply.checksums
    assert {k: tensor_checksum(v) for k, v in sd.items()} == dict(reply.checksums)
    seqs = _seqs(model.config.vocab_size)
    live = trainer["stub"].ComputeLogprobs(trainer_pb2.LogprobsRequest(sequences=seqs), timeout=60)
    with torch.no_grad():
        for s, got in zip(seqs, live.logprobs, strict=True):
            assert (torch.tensor(got.values) - _hf_logprobs(model, s)).abs().max() < 1e-5


def test_publish_weights_reaches_a_rollout_worker(trainer, services, redis_url):
    stub = trainer["stub"]
    # No weightsync yet: the trainer reports the refit as not done and keeps serving.
    with pytest.raises(grpc.RpcError) as err:
        stub.PublishWeights(trainer_pb2.PublishWeightsRequest(timeout_s=5), timeout=30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    rollout_port = free_port()
    _, path = services.config(
        [*trainer["overrides"], f'redis.url="{redis_url}"', f"rollout.grpc_port={rollout_port}", 'rollout.engine="hf"']
    )
    ws_port = next(o.split("=")[1] for o in trainer["overrides"] if o.startswith("weightsync.grpc_port="))
    services.start("weightsync", ["-m", "services.weightsync.main", "--config", str(path)])
    wait_healthy(f"127.0.0.1:{ws_port}", 60)
    services.start("rollout-0", ["-m", "services.rollout.main", "--worker-index", "0", "--config", str(path)])
    _wait_serving(f"127.0.0.1:{rollout_port}", 180)

    reply = stub.PublishWeights(trainer_pb2.PublishWeightsRequest(), timeout=60)
    assert reply.policy_version >= 1 and reply.num_endpoints == 1
    assert set(reply.received_checksums.values()) == {reply.checksum}
    assert reply.num_readback_verified == 27  # the HF engine reads back every tensor, lm_head included
    assert reply.payload_bytes > 0 and reply.publish_s > 0
    with channel(f"127.0.0.1:{rollout_port}") as ch:
        info = rollout_pb2_grpc.RolloutStub(ch).Info(rollout_pb2.InfoRequest(), timeout=5)
    assert info.policy_version == reply.policy_version


def test_sigterm_stops_every_rank_cleanly(trainer):
    proc, children = trainer["proc"], trainer["children"]
    assert len(children) >= 2
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"leftover processes: {alive}"
    log = trainer["log"].read_text()
    assert "trainer[0] INFO stopped" in log and "trainer[1] INFO stopped" in log, log[-3000:]
