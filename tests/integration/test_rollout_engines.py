"""Both engines against an independent HF forward pass: sampled-token logprobs, in-place weight loads."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from protos.grpo.v1 import queue_pb2
from services.common.config import RolloutSection


@torch.no_grad()
def _reference_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(response))
    return logp[positions, torch.tensor(response)]


def _max_diff(engine, model, prompts, temperature: float = 1.0) -> float:
    """Over one batched call of all prompts: the engine's logprob of each sampled token against an independent
    forward pass, under the distribution it was sampled from (logits / temperature)."""
    from services.rollout.engine import Request

    sampling = queue_pb2.SamplingParams(temperature=temperature, top_p=1.0, max_tokens=8, ignore_eos=True, seed=7)
    diffs = []
    for prompt, samples in zip(prompts, engine.generate([Request(p, 4, sampling) for p in prompts])):
        assert len(samples) == 4
        for s in samples:
            assert len(s.token_ids) == len(s.logprobs) == 8
            got = torch.tensor(s.logprobs)
            diffs.append((got - _reference_logprobs(model, prompt, s.token_ids, temperature)).abs().max().item())
    return max(diffs)


ENGINES = {
    "hf": RolloutSection(engine="hf"),
    "vllm": RolloutSection(engine="vllm"),
    # Plain Linear weights: the refit copies into the live tensors instead of vLLM's layerwise reload and re-pack.
    "vllm_plain": RolloutSection(engine="vllm", cpu_onednn=False),
}


@pytest.mark.parametrize("engine_name", list(ENGINES))
def test_engine_logprobs_match_hf_before_and_after_a_weight_load(engine_name, tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    from services.rollout.engines import make_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    engine = make_engine(ENGINES[engine_name], str(tiny_model), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    # The last one spans more than a KV block (128 tokens on CPU): generated again after the load, it must not
    # reuse the cached keys and values of the old weights (vLLM's prefix cache).
    prompts = [[2, 3, 4, 5], [30, 31, 54], [(7 * i) % 60 + 2 for i in range(200)]]
    assert _max_diff(engine, model, prompts) < 1e-4
    # Below temperature 1 the logprobs are those of the sharper distribution the tokens were drawn from.
    assert _max_diff(engine, model, prompts, temperature=0.7) < 1e-4

    g = torch.Generator().manual_seed(1)
    new = {n: torch.randn(t.shape, generator=g) * 0.05 for n, t in load_file(tiny_model / "model.safetensors").items()}
    engine.load_weights(sorted(new.items()))
    model.load_state_dict(new)
    assert _max_diff(engine, model, prompts) < 1e-4
    held = engine.read_weights()
    assert torch.equal(held["model.norm.weight"], new["model.norm.weight"])
    if engine_name == "vllm_plain":  # every tensor reads back, fused q/k/v and gate/up rows included
        assert set(held) == set(new)
        assert all(torch.equal(held[k], new[k]) for k in new)


@pytest.fixture(scope="module")
def tied_tiny_model(tiny_model, tmp_path_factory):
    """The tiny model with its lm_head tied to the embedding, as SmolLM2's and Qwen2.5-0.5B's are."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("models") / "tied"
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return out


def test_a_tied_lm_head_gives_the_loaded_weights_logits(tied_tiny_model, monkeypatch):
    """vLLM-cpu computes the logits with a packed copy of the lm_head's weight. A tied model's checkpoint format
    names only the embedding (our trainer sends lm_head.weight as well), and a reload that re-packed only the named
    layers left the logits the old weights' while the embedding moved on (the sampled tokens' logprobs 0.03 off on
    SmolLM2 after an embedding change of 2e-3)."""
    from transformers import AutoModelForCausalLM

    from services.rollout.engines import make_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = make_engine(ENGINES["vllm"], str(tied_tiny_model), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tied_tiny_model, dtype=torch.float32).eval()
    sent = load_file(tied_tiny_model / "model.safetensors")
    assert "lm_head.weight" not in sent and model.lm_head.weight is model.model.embed_tokens.weight
    g = torch.Generator().manual_seed(1)
    new = {n: t + torch.randn(t.shape, generator=g) * 0.05 for n, t in sent.items()}
    engine.load_weights(sorted(new.items()))
    model.load_state_dict(new, strict=False)
    assert _max_diff(engine, model, [[2, 3, 4, 5], [30, 31, 54]]) < 1e-4


def test_a_weight_load_between_decode_steps_gives_each_token_its_version_and_logprob(tiny_model, monkeypatch):
    """Asynchronous GRPO's in-flight update: new weights loaded after the third decode step of a running call. The
    first three tokens of every sample are the old version's, the rest the new one's, and each token's logprob is
    its version's given the prompt and the tokens before it (the running requests' keys and values recomputed)."""
    from transformers import AutoModelForCausalLM

    from services.rollout.engine import Request
    from services.rollout.engines import make_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = make_engine(ENGINES["vllm"], str(tiny_model), seed=0)
    old = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    new = {n: torch.randn(t.shape, generator=g) * 0.05 for n, t in load_file(tiny_model / "model.safetensors").items()}
    updated = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    updated.load_state_dict(new)
    calls = []

    def between_steps() -> int:
        calls.append(len(calls))
        if len(calls) == 4:  # once before the first step, then after each: this is after the third
            engine.load_weights(sorted(new.items()))
        return int(len(calls) >= 4)

    prompts = [[2, 3, 4, 5], [30, 31, 54]]
    sampling = queue_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8, ignore_eos=True, seed=7)
    outs = engine.generate([Request(p, 4, sampling) for p in prompts], between_steps)
    for prompt, samples in zip(prompts, outs):
        assert len(samples) == 4
        for s in samples:
            assert s.versions == [0, 0, 0, 1, 1, 1, 1, 1]
            got = torch.tensor(s.logprobs)
            assert (got[:3] - _reference_logprobs(old, prompt, s.token_ids)[:3]).abs().max() < 1e-4
            assert (got[3:] - _reference_logprobs(updated, prompt, s.token_ids)[3:]).abs().max() < 1e-4
    # The same engine, called as a synchronous step calls it, is the new version's throughout.
    assert _max_diff(engine, updated, prompts) < 1e-4


def test_a_refit_that_arrives_during_a_generation_is_loaded_between_its_steps(tiny_model, monkeypatch):
    """The worker's side of an in-flight update: the RPC thread's verified load waits while the worker generates,
    the generating thread loads it at its next step boundary, the RPC returns its result, and the group built
    from the call is as old as its oldest token and says which token came from which version."""
    import threading
    import time

    from services.common.config import load_config
    from services.common.rewards import RewardRunner
    from services.common.tokenizer import Vocab
    from services.rollout.engines import make_engine
    from services.rollout.servicer import EngineState
    from services.rollout.worker import build_group, generate

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = make_engine(ENGINES["vllm"], str(tiny_model), seed=0)
    state = EngineState(engine, "w", "vllm", inflight=True)
    g = torch.Generator().manual_seed(1)
    new = {n: torch.randn(t.shape, generator=g) * 0.05 for n, t in load_file(tiny_model / "model.safetensors").items()}
    hook, calls = state.between_steps, []

    def held_at_the_third_call() -> int:  # the refit is sure to arrive mid-generation, after two decode steps
        calls.append(1)
        deadline = time.monotonic() + 60
        while len(calls) == 3 and not state._waiting and time.monotonic() < deadline:
            time.sleep(0.001)
        return hook()

    state.between_steps = held_at_the_third_call
    sampling = queue_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8, ignore_eos=True, seed=7)
    work = queue_pb2.PromptWork(run_id="r", step=1, prompt_ids=[2, 3, 4, 5], num_samples=2, sampling=sampling)
    out = []
    generating = threading.Thread(target=lambda: out.append(generate(state, [work])))
    generating.start()
    while len(calls) < 3 and generating.is_alive():
        time.sleep(0.001)

    def load() -> str:
        engine.load_weights(sorted(new.items()))
        state.policy_version = 1
        return "loaded"

    assert state.apply(load) == "loaded"
    generating.join(60)
    [samples], started_with = out[0]
    assert started_with == 0 and state.pause_s > 0
    assert [s.versions for s in samples] == [[0, 0, 1, 1, 1, 1, 1, 1]] * 2

    cfg = load_config(None, [])
    rewards = RewardRunner(cfg.task.reward_weights(), cfg.task.reward_timeout_s)
    group = build_group(work, samples, started_with, state, Vocab.from_model_dir(str(tiny_model)), rewards)
    assert group.policy_version == 0
    assert [list(t.token_versions) for t in group.trajectories] == [[0, 0, 1, 1, 1, 1, 1, 1]] * 2


def test_seeded_requests_whose_prompts_exceed_one_engine_step_generate_as_if_alone(tiny_model, monkeypatch):
    """A multi-turn batch sends one seeded request per sample: 20 prompts of 250 tokens are more than one engine
    step's token budget (4096 on CPU). vLLM-cpu split a prompt over steps and then died rewinding the CPU generator
    ("CPU Generator does not use offset"); each seeded sample must come out as it does alone."""
    from services.rollout.engine import Request
    from services.rollout.engines import make_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = make_engine(ENGINES["vllm"], str(tiny_model), seed=0)

    def request(k: int) -> Request:
        sampling = queue_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8, ignore_eos=True, seed=100 + k)
        return Request([(7 * i + k) % 60 + 2 for i in range(250)], 1, sampling)

    together = engine.generate([request(k) for k in range(20)])
    for k in (0, 17, 19):  # the last ones are those whose prefills no longer fit the first step
        assert together[k][0].token_ids == engine.generate([request(k)])[0][0].token_ids


@pytest.mark.parametrize("stepwise", [False, True], ids=["generate", "inflight_steps"])
def test_a_refused_request_leaves_the_engine_working_and_a_failed_step_says_the_engine_is_dead(
    stepwise, tiny_model, monkeypatch
):
    """A request vLLM refuses up front (longer than max_model_len) is that request's error and the next call runs;
    a failure inside an engine step leaves in-process vLLM in a state whose next call hangs (seen: a worker stuck
    until the batch timeout), so it raises EngineDead, which the worker exits on."""
    from services.rollout.engine import EngineDead, Request
    from services.rollout.engines import make_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = make_engine(RolloutSection(engine="vllm", max_model_len=64), str(tiny_model), seed=0)
    sampling = queue_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4, ignore_eos=True)
    good, too_long = Request([2, 3, 4], 1, sampling), Request([5] * 80, 1, sampling)
    between_steps = (lambda: 0) if stepwise else None  # the in-flight updates' loop, one engine step at a time
    with pytest.raises(Exception) as refused:
        engine.generate([good, too_long], between_steps)
    assert not isinstance(refused.value, EngineDead)
    assert len(engine.generate([good], between_steps)[0][0].token_ids) == 4

    def broken_step(*args, **kwargs):
        raise RuntimeError("injected: the model runner failed")

    executor = engine.llm.llm_engine.engine_core.engine_core.model_executor
    monkeypatch.setattr(executor, "execute_model", broken_step)
    with pytest.raises(EngineDead, match="injected"):
        engine.generate([good], between_steps)
