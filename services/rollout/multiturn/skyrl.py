"""skyrl-gym's environments (`task.episode.environment = "skyrl:<id>"`, e.g. skyrl:gsm8k_multi_turn) as an
environment function: SkyRL's `BaseTextEnv` (init(prompt), step(action) -> observations, reward, done) run in the
worker's environment process.

A SkyRL environment keeps state per episode, so this process keeps one live instance per episode id. One it does not
hold (its process was replaced after a timeout, or it was dropped to bound memory) is rebuilt by replaying the
episode's earlier model turns through a fresh instance: the environments are deterministic functions of the turns.
The task row maps onto SkyRL's dataset fields: `answer` is `reward_spec.ground_truth`, `metadata` is `extra_info`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

MAX_LIVE = 4096
"""Live instances kept (oldest dropped first): episodes cut by a limit never tell the environment they ended."""

_live: OrderedDict[str, tuple[Any, int]] = OrderedDict()
"""episode id -> (the environment, model turns it has stepped)."""


def _make(task: dict) -> Any:
    import skyrl_gym

    name, config = task["env_name"], task.get("env_config") or {}
    extras = {
        "reward_spec": {"method": "rule", "ground_truth": task.get("answer", "")},
        "extra_info": dict(task.get("metadata") or {}),
        **({"max_turns": task["max_turns"]} if "max_turns" in task else {}),
    }
    if name not in skyrl_gym.envs.registration.registry:
        known = ", ".join(sorted(skyrl_gym.envs.registration.registry))
        raise ValueError(f"skyrl-gym has no environment {name!r}; it has: {known}")
    return skyrl_gym.make(name, env_config=config, extras=extras)


def respond(messages: list[dict], task: dict) -> dict:
    """One SkyRL step on the model's last turn: {"messages": its observations, "reward", "done"}."""
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    key = str(task["episode"])
    env, stepped = _live.pop(key, (None, 0))
    if env is None or stepped != len(turns) - 1:
        env = _make(task)
        env.init([m for m in messages[:1]])
        for earlier in turns[:-1]:  # replay: the instance was lost
            env.step(earlier)
    out = env.step(turns[-1])
    if out["done"]:
        env.close()
    else:
        _live[key] = (env, len(turns))
        while len(_live) > MAX_LIVE:
            _live.popitem(last=False)[1][0].close()
    return {"messages": list(out["observations"]), "reward": float(out["reward"]), "done": bool(out["done"])}
