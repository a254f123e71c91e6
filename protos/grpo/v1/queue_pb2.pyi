from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "max_tokens", "ignore_eos", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    max_tokens: int
    ignore_eos: bool
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., seed: _Optional[int] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("name", "answer", "prompt", "metadata_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    answer: str
    prompt: str
    metadata_json: str
    def __init__(self, name: _Optional[str] = ..., answer: _Optional[str] = ..., prompt: _Optional[str] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class PromptWork(_message.Message):
    __slots__ = ("run_id", "step", "prompt_index", "prompt_ids", "num_samples", "sampling", "policy_version", "task", "eval")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    prompt_index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    num_samples: int
    sampling: SamplingParams
    policy_version: int
    task: TaskSpec
    eval: bool
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., prompt_index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., num_samples: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., policy_version: _Optional[int] = ..., task: _Optional[_Union[TaskSpec, _Mapping]] = ..., eval: _Optional[bool] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("trajectory_id", "response_ids", "logprobs", "reward", "finish_reason", "text", "reward_components", "reward_errors", "token_versions", "loss_mask", "turns", "tool_calls", "tool_errors", "env_s", "episode_end", "messages_json")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENV_S_FIELD_NUMBER: _ClassVar[int]
    EPISODE_END_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    response_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    finish_reason: str
    text: str
    reward_components: _containers.ScalarMap[str, float]
    reward_errors: int
    token_versions: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[bool]
    turns: int
    tool_calls: int
    tool_errors: int
    env_s: float
    episode_end: str
    messages_json: str
    def __init__(self, trajectory_id: _Optional[str] = ..., response_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., finish_reason: _Optional[str] = ..., text: _Optional[str] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., reward_errors: _Optional[int] = ..., token_versions: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[bool]] = ..., turns: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., env_s: _Optional[float] = ..., episode_end: _Optional[str] = ..., messages_json: _Optional[str] = ...) -> None: ...

class TrajectoryGroup(_message.Message):
    __slots__ = ("run_id", "step", "prompt_index", "prompt_ids", "policy_version", "trajectories", "worker_id", "generation_s", "error", "eval", "peak_mem_GiB")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEM_GIB_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    prompt_index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    policy_version: int
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    worker_id: str
    generation_s: float
    error: str
    eval: bool
    peak_mem_GiB: float
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., prompt_index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., policy_version: _Optional[int] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., worker_id: _Optional[str] = ..., generation_s: _Optional[float] = ..., error: _Optional[str] = ..., eval: _Optional[bool] = ..., peak_mem_GiB: _Optional[float] = ...) -> None: ...
