"""The rollout worker's episodes: the tools and environment processes, the renderer, and the engine calls of a
batch of work items in lockstep."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from protos.grpo.v1 import queue_pb2
from services.common.child import Functions
from services.common.config import EpisodeSection
from services.common.config.episode import SKYRL
from services.common.tasks.render import _load_tokenizer
from services.common.tokenizer import Vocab

from ..engine import EngineDead, Request
from .environment import Environment
from .episode import MessageRenderer
from .loop import EpisodeResult, Limits, Turn, run_episodes
from .tools import Tool, ToolRunner, parser

if TYPE_CHECKING:
    from ..servicer import EngineState


def sample_seed(seed: int, sample_index: int, turn: int) -> int:
    """A seeded prompt's samples are generated one request each: each sample and turn gets a seed of its own
    (0 stays 0: the engine's own randomness)."""
    if not seed:
        return 0
    return (seed * 1_000_003 + sample_index * 10_007 + turn) % 2**63 or 1


class EpisodeRunner:
    """Runs every sample of the claimed work items as an episode; the engine generates each round's turns of all of
    them in one call."""

    def __init__(self, cfg: EpisodeSection, model_path: str, vocab: Vocab):
        self.cfg, self.vocab = cfg, vocab
        self.renderer = MessageRenderer(_load_tokenizer(model_path))
        tools = [Tool.from_path(p) for p in cfg.tools]
        self.env = Environment(
            ToolRunner(tools, cfg.timeout_s) if tools else None,
            parser(cfg.tool_parser) if tools else None,
            Functions({"respond": cfg.environment_path()}, cfg.timeout_s, "environment") if cfg.environment else None,
        )

    def run(self, state: EngineState, works: list[queue_pb2.PromptWork]) -> tuple[list[list[EpisodeResult]], int]:
        """The episodes of each work item (one per sample) and the policy version that generated them: the engine is
        held for the whole batch, so a refit lands between batches, never inside an episode."""
        slots = [(w, i) for w in works for i in range(w.num_samples)]
        turns_taken = [0] * len(slots)

        def generate(asks: list[tuple[int, list[int], int]]) -> list[Turn | str]:
            requests = []
            for k, context, budget in asks:
                work, sample = slots[k]
                sampling = queue_pb2.SamplingParams()
                sampling.CopyFrom(work.sampling)
                sampling.max_tokens = budget
                sampling.seed = sample_seed(work.sampling.seed, sample, turns_taken[k])
                turns_taken[k] += 1
                requests.append(Request(context, 1, sampling))
            return self._turns(state, requests)

        with state.lock:
            version = state.policy_version
            results = run_episodes(
                [list(w.prompt_ids) for w, _ in slots],
                generate,
                self.env,
                self.renderer,
                [self.limits(w) for w, _ in slots],
                [self._task(w, i) for w, i in slots],
            )
        out, start = [], 0
        for w in works:
            out.append(results[start : start + w.num_samples])
            start += w.num_samples
        return out, version

    def _task(self, work: queue_pb2.PromptWork, sample: int) -> dict:
        """What an environment function is given besides the conversation."""
        task = {
            "prompt": work.task.prompt,
            "answer": work.task.answer,
            "metadata": json.loads(work.task.metadata_json or "{}"),
            "episode": f"{work.run_id}/{'eval' if work.eval else ''}{work.step}/{work.prompt_index}/{sample}",
        }
        if self.cfg.environment.startswith(SKYRL):
            task |= {
                "env_name": self.cfg.environment.removeprefix(SKYRL),
                "env_config": dict(self.cfg.env_config),
                "max_turns": self.cfg.max_turns,
            }
        return task

    def limits(self, work: queue_pb2.PromptWork) -> Limits:
        return Limits(self.cfg.max_turns, max(work.sampling.max_tokens, 1), self.cfg.max_tool_calls)

    def _turns(self, state: EngineState, requests: list[Request]) -> list[Turn | str]:
        try:
            samples = state.engine.generate(requests)
        except EngineDead:
            raise
        except Exception:  # one bad context fails the whole call: find it, keep the others
            samples = []
            for r in requests:
                try:
                    samples.append(state.engine.generate([r])[0])
                except Exception as e:
                    samples.append(f"engine refused the context: {type(e).__name__}: {e}")
        out: list[Turn | str] = []
        for s in samples:
            if isinstance(s, str):
                out.append(s)
                continue
            [sample] = s
            text = self.vocab.decode(sample.token_ids)
            out.append(Turn(sample.token_ids, sample.logprobs, text, sample.finish_reason))
        return out

    def close(self) -> None:
        self.env.close()
