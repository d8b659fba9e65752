"""How a scoring function is called: by keyword, with the fields its signature names.

Checked once, at registration, so a function whose parameters do not say which field they
want is refused there (with the accepted forms listed) instead of silently scoring the
wrong arguments. Accepted forms:

* verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``;
* HybridFlow's ``score(solution, ground_truth, extra_info=None)``;
* any subset of those names (the response text is required) plus parameters with
  defaults, and ``**kwargs`` (it receives the named fields it does not list);
* batched, TRL's ``fn(completions, **kwargs) -> list[float]`` (recognised by its
  ``completions`` parameter, or said with ``batched=True`` at registration or a
  ``fn.batched = True`` attribute): ``completions``, ``prompts``, ``ground_truth``,
  ``data_source`` and ``extra_info`` are lists with one entry per sample. As in TRL, any
  other parameter names a dataset column (``accuracy_reward(completions, solution,
  **kwargs)`` gets the rows' ``solution``), ``**kwargs`` gets every column, and for chat
  prompts each completion is one assistant message ``[{"role": "assistant", "content": ...}]``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from hf_controller import ConfigurationError

ACCEPTED_FORMS = (
    "compute_score(data_source, solution_str, ground_truth, extra_info=None)  # verl",
    "score(solution, ground_truth, extra_info=None)  # HybridFlow",
    "fn(completions, **kwargs) -> list[float]  # TRL, batched (fn.batched = True)",
)
"""The call forms a scoring function may take (shown in every refusal)."""

SAMPLE_FIELDS: Mapping[str, str] = {
    "solution_str": "solution",
    "solution": "solution",
    "ground_truth": "ground_truth",
    "data_source": "data_source",
    "extra_info": "extra_info",
}
"""Per-sample parameter name -> the field it receives (``solution``: the response text)."""

BATCHED_FIELDS: Mapping[str, str] = {
    "completions": "completion",
    "prompts": "prompt",
    "ground_truth": "ground_truth",
    "data_source": "data_source",
    "extra_info": "extra_info",
}
"""Batched (TRL) parameter name -> the field whose per-sample list it receives
(``completion``: the response text, or as TRL gives it for chat prompts, one assistant
message ``[{"role": "assistant", "content": text}]``)."""

COLUMN_FIELD = "columns."
"""Prefix of the field of a batched function's parameter that names a dataset column
(``columns.solution``): any other parameter without a default, as TRL passes columns."""
TEXT_FIELDS = ("solution", "completion")
"""The fields that carry the response."""

_KWARGS_FIELDS = {"ground_truth", "data_source", "extra_info"}
"""Fields a ``**kwargs`` parameter receives when it does not name them (never the text)."""


class ScoringSignatureError(ConfigurationError, TypeError):
    """A scoring function whose parameters do not say which field each one wants: a
    ``TypeError`` (a call that cannot be made) and a user error, so the ``hybridflow``
    command prints it alone and exits 2."""


@dataclass(frozen=True)
class ScoringCall:
    """A scoring function with the keyword arguments it takes (see the module docstring)."""

    fn: Callable[..., Any]
    """The user's function."""
    batched: bool
    """One call per list of samples (TRL form) rather than one per sample."""
    params: tuple[tuple[str, str], ...]
    """``(parameter name, field)`` pairs: the fields passed, under the names they go by."""
    var_kwargs: bool
    """The function takes ``**kwargs``: it also gets the named fields it does not list."""

    @property
    def name(self) -> str:
        """The function's qualified name, for messages."""
        return describe_function(self.fn)

    def needs(self, field_name: str) -> bool:
        """Whether a call passes ``field_name`` (``"prompt"``: the decoded prompt)."""
        return any(f == field_name for _, f in self.params) or (
            self.var_kwargs and self.batched and field_name == "prompt"
        )

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns its parameters name (each row must have them)."""
        return tuple(f[len(COLUMN_FIELD) :] for _, f in self.params if f.startswith(COLUMN_FIELD))

    @property
    def all_columns(self) -> bool:
        """A batched ``**kwargs`` function: it gets every dataset column, as in TRL."""
        return self.batched and self.var_kwargs

    def kwargs(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of one call from ``sample`` (field -> value, or -> list of
        values when batched; dataset columns under ``sample["columns"]``)."""
        names = BATCHED_FIELDS if self.batched else SAMPLE_FIELDS
        columns: Mapping[str, Any] = sample.get("columns") or {}
        out = {
            param: columns.get(field[len(COLUMN_FIELD) :])
            if field.startswith(COLUMN_FIELD)
            else sample.get(field)
            for param, field in self.params
        }
        if self.var_kwargs:
            listed = {field for _, field in self.params}
            for param, field in names.items():
                wanted = field in _KWARGS_FIELDS or (self.batched and field == "prompt")
                if wanted and field not in listed and param not in out and field in sample:
                    out[param] = sample[field]
            if self.all_columns:
                out.update({k: v for k, v in columns.items() if k not in out})
        return out


def describe_function(fn: object) -> str:
    """``module.qualname`` of ``fn`` (a partial shows its function)."""
    inner = getattr(fn, "func", fn)
    module = getattr(inner, "__module__", None) or "?"
    name = getattr(inner, "__qualname__", None) or repr(inner)
    return f"{module}.{name}"


def scoring_call(fn: Callable[..., Any], batched: bool = False) -> ScoringCall:
    """How ``fn`` is called; raises ``TypeError`` naming the problem and the accepted forms
    when its parameters do not say which field each one wants."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        _refuse(fn, f"its signature cannot be read ({error})")
    if not batched and "completions" in signature.parameters:
        _refuse(
            fn,
            "it takes completions, as a TRL batched function, but batched=False was given: "
            "drop batched=False (or set fn.batched = True)",
        )
    names = BATCHED_FIELDS if batched else SAMPLE_FIELDS
    params: list[tuple[str, str]] = []
    var_kwargs = False
    for param in signature.parameters.values():
        if param.kind is param.VAR_KEYWORD:
            var_kwargs = True
        elif param.kind is param.VAR_POSITIONAL:
            continue  # receives nothing: every field goes by keyword
        elif param.kind is param.POSITIONAL_ONLY:
            if param.default is param.empty:
                _refuse(fn, f"its parameter {param.name!r} is positional-only")
        elif param.name in names:
            params.append((param.name, names[param.name]))
        elif batched and param.default is param.empty:  # a dataset column, as TRL passes
            params.append((param.name, f"{COLUMN_FIELD}{param.name}"))
        elif param.default is param.empty:
            _refuse(fn, f"its required parameter {param.name!r} names no field")
    text_params = [p for p, f in params if f in TEXT_FIELDS]
    if not text_params:
        wanted = "completions" if batched else "solution_str (or solution)"
        _refuse(fn, f"it takes no {wanted} parameter for the response text")
    if len(text_params) > 1:
        _refuse(fn, f"it takes the response text twice ({text_params})")
    return ScoringCall(fn=fn, batched=batched, params=tuple(params), var_kwargs=var_kwargs)


def _refuse(fn: object, reason: str) -> NoReturn:
    forms = "\n  ".join(ACCEPTED_FORMS)
    raise ScoringSignatureError(
        f"scoring function {describe_function(fn)} cannot be called by keyword: {reason}. "
        f"Scoring functions are called with the fields their parameters name; accepted "
        f"forms:\n  {forms}\n(extra parameters need defaults)"
    )
