import types

import pytest
import torch

from services.weightsync.transport import TRANSPORTS, make_transport, resolve


def test_factory_names_the_choices():
    group = types.SimpleNamespace(backend="smoke-signals")
    with pytest.raises(ValueError) as e:
        make_transport(group, None)
    assert all(t in str(e.value) for t in TRANSPORTS)


def test_auto_is_gloo_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert resolve("auto") == "gloo"
    assert resolve("ucxx") == "ucxx"
