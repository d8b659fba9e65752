"""``rollout.stop``: stop strings become the ids of the tokens that contain them."""

from __future__ import annotations

import pytest

from hf_algos.config.rollout import RolloutSection
from hf_algos.data import build_char_tokenizer
from hf_algos.trainers.roles.sampling import sampling_config, stop_token_ids
from hf_controller import ConfigurationError


def test_stop_strings_become_the_ids_of_tokens_holding_them() -> None:
    tokenizer = build_char_tokenizer(characters=[*"abc0123456789", "\n", "\n\n"])
    newline, double = tokenizer.convert_tokens_to_ids(["\n", "\n\n"])
    assert stop_token_ids(tokenizer, ("\n",)) == tuple(sorted((newline, double)))
    sampling = sampling_config(RolloutSection(stop=("\n", "b")), tokenizer, seed=3)
    assert set(sampling.stop_token_ids) == {newline, double, tokenizer.convert_tokens_to_ids("b")}
    assert sampling_config(RolloutSection(), tokenizer).stop_token_ids == ()


def test_a_stop_string_no_token_holds_is_refused() -> None:
    tokenizer = build_char_tokenizer(characters=[*"abc"])
    with pytest.raises(ConfigurationError, match=r"no token .* contains 'z'"):
        stop_token_ids(tokenizer, ("z",))


@pytest.mark.parametrize("stop", ["\n", ("",), (3,)])
def test_malformed_stop_lists_are_refused(stop: object) -> None:
    with pytest.raises(ConfigurationError, match=r"rollout\.stop="):
        RolloutSection(stop=stop)  # type: ignore[arg-type]
