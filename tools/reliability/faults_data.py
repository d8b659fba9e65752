"""Bad data: each case writes a broken dataset file and builds the training data exactly as
the RL trainers do (``hf_algos.data.tokenizer.load_tokenizer`` from a local tokenizer
directory, then ``hf_algos.data.rl_dataset.rl_loader`` from a validated ``DataSection``),
before any worker would start.

The error must name the file, the row (jsonl line / parquet row) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults import FaultCase, FaultResult, first_line, stopwatch


def _good(index: int) -> dict[str, Any]:
    return {
        "prompt": f"{index}{index}1=",
        "data_source": "sort_digits",
        "reward_model": {"ground_truth": f"1{index}{index}"},
        "extra_info": {"index": index},
    }


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _build_training_data(scratch: Path, data_file: Path, **data_options: Any) -> None:
    """What ``PPOTrainer.__init__`` does with its data section before it starts workers."""
    from hf_algos.config.actor import ActorSection
    from hf_algos.config.data import DataSection
    from hf_algos.data import build_char_tokenizer
    from hf_algos.data.rl_dataset import rl_loader
    from hf_algos.data.tokenizer import load_tokenizer
    from hf_engines import EngineConfig
    from hf_engines.config import ModelConfig

    tokenizer_dir = scratch / "tokenizer"
    if not tokenizer_dir.is_dir():
        build_char_tokenizer(tokenizer_dir)
    data = DataSection(
        train_files=(str(data_file),),
        tokenizer_path=str(tokenizer_dir),
        train_batch_size=2,
        **data_options,
    )
    actor = ActorSection(engine=EngineConfig(model=ModelConfig(hf_config={"model_type": "llama"})))
    tokenizer = load_tokenizer(data, actor)
    rl_loader(data, tokenizer)


def _expect_error(
    scratch: Path,
    write: Callable[[Path], Path],
    must_name: tuple[str, ...],
    **data_options: Any,
) -> FaultResult:
    """Write the bad file, build the data, and check the error names everything in ``must_name``."""
    data_file = write(scratch)
    import hf_algos.data.rl_dataset  # noqa: F401  (import time is start-up, not detection)

    with stopwatch() as elapsed:
        try:
            _build_training_data(scratch, data_file, **data_options)
        except ValueError as error:
            seconds, message = elapsed(), str(error)
        else:
            raise AssertionError(f"building the data from {data_file} raised nothing")
    for part in must_name:
        if part not in message:
            raise AssertionError(f"the error does not name {part!r}: {message}")
    shown = message.replace(str(scratch) + "/", "")  # the table shows the file's own name
    return FaultResult(
        "named error", seconds, "nothing (before any worker started)", first_line(shown)
    )


def _bad_row(change: Callable[[dict[str, Any]], Any], suffix: str = "jsonl") -> Callable[..., Path]:
    """A writer of three rows whose second is broken by ``change``."""

    def write(scratch: Path) -> Path:
        rows = [_good(i) for i in range(3)]
        change(rows[1])
        path = scratch / f"train.{suffix}"
        _jsonl(path, rows)
        return path

    return write


def _missing_field(scratch: Path) -> FaultResult:
    write = _bad_row(lambda row: row.pop("data_source"))
    return _expect_error(scratch, write, ("train.jsonl, line 2", "'data_source'", "is missing"))


def _empty_prompt(scratch: Path) -> FaultResult:
    write = _bad_row(lambda row: row.update(prompt=""))
    return _expect_error(scratch, write, ("train.jsonl, line 2", "'prompt'", "empty string"))


def _non_string_prompt(scratch: Path) -> FaultResult:
    write = _bad_row(lambda row: row.update(prompt={"text": "12="}))
    return _expect_error(scratch, write, ("train.jsonl, line 2", "'prompt'", "has type dict"))


def _wrong_ground_truth(scratch: Path) -> FaultResult:
    write = _bad_row(lambda row: row.update(reward_model={"ground_truth": {"answer": 3}}))
    names = ("train.jsonl, line 2", "'reward_model.ground_truth'", "has type dict")
    return _expect_error(scratch, write, names)


def _invalid_jsonl(scratch: Path) -> FaultResult:
    def write(scratch: Path) -> Path:
        path = scratch / "train.jsonl"
        path.write_text(json.dumps(_good(0)) + "\n" + '{"prompt": "12=", "data_source": \n')
        return path

    return _expect_error(scratch, write, ("train.jsonl, line 2", "not valid JSON"))


def _not_utf8(scratch: Path) -> FaultResult:
    def write(scratch: Path) -> Path:
        path = scratch / "train.jsonl"
        bad = json.dumps(_good(1)).encode().replace(b'"prompt": "', b'"prompt": "caf\xe9 ')
        path.write_bytes(json.dumps(_good(0)).encode() + b"\n" + bad + b"\n")
        return path

    names = ("train.jsonl, line 2", "not UTF-8 text", "byte 0xe9 at byte offset", "re-encode")
    return _expect_error(scratch, write, names)


def _invalid_parquet(scratch: Path) -> FaultResult:
    def write(scratch: Path) -> Path:
        path = scratch / "train.parquet"
        _jsonl(path, [_good(0), _good(1)])  # JSON lines under a parquet name
        return path

    return _expect_error(scratch, write, ("train.parquet", "not a readable parquet file"))


def _all_overlong(scratch: Path) -> FaultResult:
    def write(scratch: Path) -> Path:
        path = scratch / "train.jsonl"
        _jsonl(path, [{**_good(i), "prompt": "7" * (20 + i)} for i in range(3)])
        return path

    names = ("every one of the 3 prompts", "max_prompt_length=8", "shortest 22, longest 24")
    return _expect_error(scratch, write, names, max_prompt_length=8, overlong_prompts="drop")


def _one_overlong(scratch: Path) -> FaultResult:
    write = _bad_row(lambda row: row.update(prompt="9" * 40))
    names = ("train.jsonl, line 2", "'prompt'", "42 tokens long", "max_prompt_length=16")
    return _expect_error(scratch, write, names, max_prompt_length=16)


FAULTS = [
    FaultCase("bad data: missing field", _missing_field),
    FaultCase("bad data: empty prompt", _empty_prompt),
    FaultCase("bad data: non-string prompt", _non_string_prompt),
    FaultCase("bad data: wrong-typed ground truth", _wrong_ground_truth),
    FaultCase("bad data: invalid jsonl", _invalid_jsonl),
    FaultCase("bad data: invalid parquet", _invalid_parquet),
    FaultCase("bad data: non-UTF-8 file", _not_utf8),
    FaultCase("bad data: overlong prompt (overlong_prompts=error)", _one_overlong),
    FaultCase("bad data: every prompt overlong (overlong_prompts=drop)", _all_overlong),
]
