"""Multi-turn episodes: the model's turns as sampled and the environment's messages as the chat template renders
them, kept as token ids (episode.py); tools the model calls and the parsers that read its calls (tools.py)."""
