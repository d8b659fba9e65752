"""The override grammar (``hf_algos.config.overrides``): every form parsed, its errors, and
what each form does to a plain OmegaConf tree."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from hf_algos.config.overrides import Override, apply_override, parse_override, parse_overrides
from hf_controller import ConfigurationError


@pytest.mark.parametrize(
    ("text", "action", "key", "value"),
    [
        ("rollout.n=4", "set", "rollout.n", 4),
        ("+rollout.engine_kwargs.x=1", "add", "rollout.engine_kwargs.x", 1),
        ("++trainer.save_freq=3", "force", "trainer.save_freq", 3),
        ("~trainer.save_freq", "drop", "trainer.save_freq", None),
        ("~trainer.save_freq=", "drop", "trainer.save_freq", None),
        ("lr=1e-6", "set", "lr", 1e-6),
        ("lr=.5", "set", "lr", 0.5),
        ("flag=true", "set", "flag", True),
        ("flag=False", "set", "flag", False),
        ("mode=off", "set", "mode", "off"),  # YAML 1.2's words: off / yes are words
        ("mode=yes", "set", "mode", "yes"),
        ("key=null", "set", "key", None),
        ("key=", "set", "key", ""),
        ("key= 5 ", "set", "key", 5),
        ("key=010", "set", "key", "010"),  # no octal
        ("key=12:30", "set", "key", "12:30"),  # no sexagesimal
        ("key=2024-01-01", "set", "key", "2024-01-01"),  # no date
        ("key=a: b", "set", "key", "a: b"),  # words, not a YAML mapping
        ("key=x y", "set", "key", "x y"),
        ("key='a b, c'", "set", "key", "a b, c"),
        ('key="question text"', "set", "key", "question text"),
        ("key='3'", "set", "key", "3"),
        ("key=''", "set", "key", ""),
        ("key=[a,b]", "set", "key", ["a", "b"]),
        ("key=[console, jsonl]", "set", "key", ["console", "jsonl"]),
        ("key=['console','wandb']", "set", "key", ["console", "wandb"]),
        ("key=[1,[2,3]]", "set", "key", [1, [2, 3]]),
        ("key=[]", "set", "key", []),
        ("key={}", "set", "key", {}),
        ("key={k: v, n: 2}", "set", "key", {"k": "v", "n": 2}),
        ("key={b: {c: 1e-6}}", "set", "key", {"b": {"c": 1e-6}}),
        ("path=/models/qwen-0.5b", "set", "path", "/models/qwen-0.5b"),
        ("key=${vars.model}", "set", "key", "${vars.model}"),
        ("key=${oc.env:HOME,/tmp}/x", "set", "key", "${oc.env:HOME,/tmp}/x"),
        ("key=[${vars.a}, b]", "set", "key", ["${vars.a}", "b"]),
        ("a.0=x", "set", "a.0", "x"),
    ],
)
def test_each_form_parses(text: str, action: str, key: str, value: Any) -> None:
    assert parse_override(text) == Override(text, action, key, value)  # type: ignore[arg-type]


def test_an_unbracketed_comma_list_is_a_list_only_for_the_named_keys() -> None:
    files = parse_override("data.train_files=a.parquet,b.parquet", comma_lists=["data.train_files"])
    assert files.value == ["a.parquet", "b.parquet"]
    with pytest.raises(ConfigurationError, match=r"Ambiguous value for argument 'x=a,b'.*\[a,b\]"):
        parse_override("x=a,b", comma_lists=["data.train_files"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("novalue", "override 'novalue' does not parse: expected key=value"),
        ("=3", "override '=3' names no key"),
        ("a..b=1", "'a..b' is not a dotted key"),
        ("+=1", "names no key"),
        ("~", "'' is not a dotted key"),
        ("~a=1", "~key takes no value"),
        ("a b=1", "'a b' is not a dotted key"),
        ("x=[1", "override 'x=\\[1' does not parse: expected ',' or ']'"),
        ("x={a: 1", "override 'x={a: 1' does not parse"),
        ("x=~/data", "'~' must be quoted"),
        ("x=a#b", "'#' must be quoted"),
        ("x=a=b", "'=' must be quoted"),
        ("x=f(1)", "'\\(' must be quoted"),
        ("x='open", "is not closed"),
        ("x=${vars.a", "is not closed"),
        ("x=a,b", "Ambiguous value for argument 'x=a,b'"),
        ("x=1,2", "Ambiguous value"),
    ],
)
def test_malformed_overrides_are_refused_naming_them(text: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        parse_override(text)


def test_every_override_parses_before_any_applies() -> None:
    with pytest.raises(ConfigurationError, match="'x=\\[1' does not parse"):
        parse_overrides(["a=1", "x=[1"])
    assert [o.action for o in parse_overrides(["a=1", "+b=2", "++c=3", "~d"])] == [
        "set",
        "add",
        "force",
        "drop",
    ]


def applied(*texts: str, replace: bool = False) -> dict[str, Any]:
    """A small free tree with ``texts`` applied, as plain data."""
    tree = OmegaConf.create({"a": 1, "m": {"x": 1, "y": 2}, "n": None})
    for override in parse_overrides(texts):
        apply_override(tree, override, replace=replace)
    plain = OmegaConf.to_container(tree)
    assert isinstance(plain, dict)
    return plain  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["a=2"], {"a": 2}),
        (["+b=2"], {"b": 2}),
        (["+n=3"], {"n": 3}),  # + fills a key that holds nothing
        (["+m={z: 3}"], {"m": {"x": 1, "y": 2, "z": 3}}),  # + merges a mapping in
        (["++a=5", "++m.z=3"], {"a": 5, "m": {"x": 1, "y": 2, "z": 3}}),
        (["m={z: 3}"], {"m": {"x": 1, "y": 2, "z": 3}}),  # = merges into a mapping
        (["~m.x"], {"m": {"y": 2}}),
        (["~m"], {"m": "<gone>"}),
    ],
)
def test_each_form_applies(texts: list[str], expected: dict[str, Any]) -> None:
    result = applied(*texts)
    for key, value in expected.items():
        assert result.get(key, "<gone>") == value


def test_replace_makes_a_mapping_value_replace_the_mapping() -> None:
    assert applied("m={z: 3}", replace=True)["m"] == {"z": 3}
    assert applied("m={}", replace=True)["m"] == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("m.z=3", r"Could not override 'm.z': it is not there; .*use \+m.z=3"),
        ("+a=3", r"An item is already at 'a'\. Either remove \+ prefix: 'a=3'.*'\+\+a=3'"),
        ("~nope", r"Could not delete from config\. 'nope' does not exist\."),
        ("~m.nope.deeper", r"'m\.nope\.deeper' does not exist"),
    ],
)
def test_misused_forms_are_refused_naming_the_fix(text: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        applied(text)
