"""Prompt sources (the toy task, data files, reasoning-gym), their seeded order, and their rendering into token ids.

Imports no torch: datasets, reasoning_gym and transformers are imported only by the functions that need them.
One module each: data.py (Prompt, TaskData, TaskError), toy.py, files.py, gym.py, order.py (PromptOrder), render.py
(PromptRenderer), and sources.py (SOURCES, load_task, check_task). Import from here:
`from services.common.tasks import load_task, PromptRenderer`.
"""

from .data import Prompt, TaskData, TaskError
from .order import PromptOrder
from .render import PromptRenderer
from .sources import SOURCES, check_task, load_task
from .toy import SYMBOL_CLASSES, builtin_prompts

__all__ = [
    "SOURCES",
    "SYMBOL_CLASSES",
    "Prompt",
    "PromptOrder",
    "PromptRenderer",
    "TaskData",
    "TaskError",
    "builtin_prompts",
    "check_task",
    "load_task",
]
