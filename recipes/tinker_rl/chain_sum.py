"""reasoning-gym ``chain_sum`` as a tinker-cookbook RL dataset (``RLDatasetBuilder``).

The same task and grading as the packaged ``smollm2_chain_sum`` GRPO config: problems such
as "State the final answer to the following arithmetic problem: 4 - 1 =" from
``reasoning_gym.create_dataset("chain_sum", ...)``, a reply scored 1.0 when the task's own
``score_answer`` accepts the last number in it (``hf_algos.rewards.reasoning_gym``'s
``last_number`` extraction), else 0.0. The training set and the held-out test set are drawn
with different seeds (1 and 2, as the packaged config's train and val files).

One problem is one cookbook *group* of ``group_size`` single-turn episodes (a GRPO group:
the cookbook centres rewards on the group mean), ``batch_size`` groups make a training step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import chz
import reasoning_gym
from tinker_cookbook import renderers
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from hf_algos.rewards.reasoning_gym import extract_answer

SMOLLM_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""What SmolLM2's own chat template inserts when a conversation has no system message; the
prefix makes the cookbook's ChatML renderer produce the prompt hybridflow's trainer sends."""


class ChainSumEnv(ProblemEnv):
    """One chain_sum problem, answered once; reward 1.0 for a correct last number."""

    def __init__(
        self,
        entry: dict[str, Any],
        task: Any,
        renderer: renderers.Renderer,
        convo_prefix: list[renderers.Message] | None = None,
    ) -> None:
        # format_coef 0: the reward is correctness alone, as in the GRPO config.
        super().__init__(renderer, convo_prefix, format_coef=0.0)
        self.entry = entry
        self.task = task

    def get_question(self) -> str:
        """The problem's text, sent as the user message."""
        return str(self.entry["question"])

    def check_answer(self, sample_str: str) -> bool:
        """Whether reasoning-gym's ``score_answer`` accepts the reply's last number."""
        return chain_sum_score(self.task, self.entry, sample_str) >= 1.0

    def check_format(self, sample_str: str) -> bool:
        """A reply with some number in it is well formed."""
        return extract_answer(sample_str, "last_number") is not None

    def get_reference_answer(self) -> str:
        """The task's answer (for the cookbook's logs)."""
        return str(self.entry["answer"])


def chain_sum_score(task: Any, entry: dict[str, Any], reply: str) -> float:
    """``task.score_answer`` of the last number in ``reply`` (0.0 when it has none)."""
    answer = extract_answer(reply, "last_number")
    return 0.0 if answer is None else float(task.score_answer(answer, entry))


class ChainSumDataset(RLDataset):
    """Problems of one reasoning-gym dataset, ``batch_size`` groups per batch."""

    def __init__(
        self,
        task: Any,
        batch_size: int,
        group_size: int,
        renderer: renderers.Renderer,
        convo_prefix: list[renderers.Message] | None,
    ) -> None:
        self.task = task
        self.entries = [task[i] for i in range(len(task))]
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.convo_prefix = convo_prefix

    def __len__(self) -> int:
        """The number of batches (the cookbook's steps per epoch)."""
        return math.ceil(len(self.entries) / self.batch_size)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """The groups of batch ``index``: one per problem, ``group_size`` episodes each."""
        rows = self.entries[index * self.batch_size : (index + 1) * self.batch_size]
        return [
            ProblemGroupBuilder(
                env_thunk=partial(ChainSumEnv, entry, self.task, self.renderer, self.convo_prefix),
                num_envs=self.group_size,
                dataset_name="chain_sum",
            )
            for entry in rows
        ]


@chz.chz
class ChainSumDatasetBuilder(RLDatasetBuilder):
    """Train and held-out test datasets of chain_sum problems (the cookbook calls it once)."""

    tokenizer: str
    """Tokenizer name for ``tinker_cookbook.tokenizer_utils.get_tokenizer``: a registered
    name or a local Hugging Face directory (no hub access)."""
    renderer_name: str = "qwen3_instruct"
    """The cookbook renderer: plain ChatML (``<|im_start|>role ... <|im_end|>``), SmolLM2's
    format, stopping on ``<|im_end|>``."""
    system_prompt: str | None = SMOLLM_SYSTEM_PROMPT
    """System message before every problem (None: none)."""
    terms: int = 2
    """Terms per problem (reasoning-gym min_terms = max_terms)."""
    digits: int = 1
    """Digits per term (min_digits = max_digits)."""
    batch_size: int = 8
    """Problems (groups) per training step."""
    group_size: int = 8
    """Answers sampled per training problem."""
    n_train: int = 2000
    """Training problems (steps per epoch: n_train / batch_size)."""
    n_test: int = 48
    """Held-out problems, each answered ``test_group_size`` times at every evaluation."""
    test_group_size: int = 1
    """Answers sampled per held-out problem."""
    train_seed: int = 1
    """reasoning-gym seed of the training problems."""
    test_seed: int = 2
    """reasoning-gym seed of the held-out problems (different from ``train_seed``)."""

    async def __call__(self) -> tuple[RLDataset, RLDataset]:
        """The training dataset and the held-out test dataset."""
        if self.train_seed == self.test_seed:
            raise ValueError(
                f"train_seed and test_seed are both {self.train_seed}: the test set would be "
                "the training problems; give them different seeds"
            )
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.tokenizer))
        prefix: list[renderers.Message] | None = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else None
        )
        train = ChainSumDataset(
            self._task(self.n_train, self.train_seed),
            self.batch_size,
            self.group_size,
            renderer,
            prefix,
        )
        test = ChainSumDataset(
            self._task(self.n_test, self.test_seed),
            self.n_test,
            self.test_group_size,
            renderer,
            prefix,
        )
        return train, test

    def _task(self, size: int, seed: int) -> Any:
        """The reasoning-gym chain_sum dataset of ``size`` problems drawn with ``seed``."""
        return reasoning_gym.create_dataset(
            "chain_sum",
            size=size,
            seed=seed,
            min_terms=self.terms,
            max_terms=self.terms,
            min_digits=self.digits,
            max_digits=self.digits,
        )
