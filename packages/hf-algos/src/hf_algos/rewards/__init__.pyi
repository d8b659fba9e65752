# The one list of hf_algos.rewards's public names: type checkers read it as the package's stub,
# and lazy_loader.attach_stub (in __init__.py) imports each name from its module on first use.
from .circuit import RewardSetupError as RewardSetupError
from .gsm8k import compute_gsm8k_score as compute_gsm8k_score
from .gsm8k import extract_gsm8k_answer as extract_gsm8k_answer
from .manager import RewardManager as RewardManager
from .math_boxed import compute_math_score as compute_math_score
from .math_boxed import last_boxed_content as last_boxed_content
from .math_boxed import math_answers_equal as math_answers_equal
from .math_boxed import normalize_math_answer as normalize_math_answer
from .pool import RewardError as RewardError
from .reasoning_gym import ANSWER_FORMATS as ANSWER_FORMATS
from .reasoning_gym import compute_reasoning_gym_score as compute_reasoning_gym_score
from .reasoning_gym import extract_answer as extract_answer
from .registry import SCORING_FUNCTIONS as SCORING_FUNCTIONS
from .registry import BatchedScoringFunction as BatchedScoringFunction
from .registry import ScoreFn as ScoreFn
from .registry import get_scoring_function as get_scoring_function
from .registry import register_scoring_function as register_scoring_function
from .reward_model import RewardModelScorer as RewardModelScorer
from .signature import ACCEPTED_FORMS as ACCEPTED_FORMS
from .signature import ScoringCall as ScoringCall
from .signature import scoring_call as scoring_call
from .token_scores import last_token_index as last_token_index
from .token_scores import place_on_last_token as place_on_last_token
from .weighted import WeightedRewardFunctions as WeightedRewardFunctions
