"""Multi-turn episodes (task.episode): the model's turns as sampled and the environment's messages as the chat
template renders them, kept as token ids (episode.py); the lockstep episode loop (loop.py) and the worker's driver
of it (runner.py); what answers a turn (environment.py: tool calls, an environment function); the tool-call parsers
and the tool process (tools.py); built-in tools and environments (envs.py); skyrl-gym's environments (skyrl.py)."""
