# The one list of hf_algos's public names: type checkers read it as the package's stub, and
# lazy_loader.attach_stub (in __init__.py) imports each name from its module on first use.
from .advantages import ADVANTAGE_ESTIMATORS as ADVANTAGE_ESTIMATORS
from .advantages import compute_advantage as compute_advantage
from .data import PreferenceDataset as PreferenceDataset
from .data import RLDataset as RLDataset
from .data import StatefulDataLoader as StatefulDataLoader
from .data import build_preference_pairs as build_preference_pairs
from .data import collate_to_dataproto as collate_to_dataproto
from .data import make_preference_batch as make_preference_batch
from .kl import AdaptiveKLController as AdaptiveKLController
from .kl import FixedKLController as FixedKLController
from .kl import apply_kl_penalty as apply_kl_penalty
from .kl import kl_penalty as kl_penalty
from .losses import LOSS_AGG_MODES as LOSS_AGG_MODES
from .losses import POLICY_LOSSES as POLICY_LOSSES
from .losses import aggregate_loss as aggregate_loss
from .losses import critic_loss as critic_loss
from .losses import dpo_loss as dpo_loss
from .losses import dpo_loss_fn as dpo_loss_fn
from .losses import ppo_actor_loss as ppo_actor_loss
from .rewards import SCORING_FUNCTIONS as SCORING_FUNCTIONS
from .rewards import RewardManager as RewardManager
from .rewards import RewardModelScorer as RewardModelScorer

__version__: str
