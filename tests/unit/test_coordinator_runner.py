"""The coordinator's Runner refuses a step count its status cannot carry, before anything changes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from protos.grpo.v1 import coordinator_pb2
from services.coordinator.runner import MAX_STEP, Runner
from services.coordinator.state import RunState


@pytest.mark.parametrize("num_steps", [MAX_STEP - 1, 2**64 - 1])
def test_a_step_count_past_the_status_limit_is_refused_and_the_run_stays_as_it_was(num_steps):
    state = RunState("r", num_steps=2, state=coordinator_pb2.RUN_STATE_DONE, step=2)
    runner = Runner(SimpleNamespace(state=state))  # start() refuses before it touches the loop
    with pytest.raises(ValueError, match=f"num_steps must be in 1..{MAX_STEP - 2} at step 2"):
        runner.start(num_steps)
    assert (state.state, state.num_steps) == (coordinator_pb2.RUN_STATE_DONE, 2)
    status = state.to_proto()  # still serializes
    assert (status.step, status.num_steps) == (2, 2)
