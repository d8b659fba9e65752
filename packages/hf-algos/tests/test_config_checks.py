"""hf_algos.config.require_positive: the shared value check of the config sections."""

from __future__ import annotations

import pytest

from hf_algos.config.dpo import DPOSection
from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError


def test_require_positive_names_the_option_and_the_bound() -> None:
    require_positive("dpo.beta", 0.1)
    require_positive("data.num_proc", 0, allow_zero=True)
    with pytest.raises(ConfigurationError, match=r"dpo.beta=0 must be > 0"):
        require_positive("dpo.beta", 0)
    with pytest.raises(ConfigurationError, match=r"data.num_proc=-1 must be >= 0"):
        require_positive("data.num_proc", -1, allow_zero=True)


def test_sections_use_it() -> None:
    with pytest.raises(ConfigurationError, match=r"dpo.mini_batch_size=0 must be > 0"):
        DPOSection(mini_batch_size=0)
