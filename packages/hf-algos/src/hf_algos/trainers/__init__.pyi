# The one list of hf_algos.trainers's public names: type checkers read it as the package's
# stub, and lazy_loader.attach_stub (in __init__.py) imports each name from its module on
# first use.
from .base import RestartsExhaustedError as RestartsExhaustedError
from .base import Trainer as Trainer
from .dpo import DPOTrainer as DPOTrainer
from .groups import ActorGroup as ActorGroup
from .groups import CriticGroup as CriticGroup
from .groups import ReferenceGroup as ReferenceGroup
from .groups import RewardModelGroup as RewardModelGroup
from .groups import RewardScorer as RewardScorer
from .groups import RolloutGroup as RolloutGroup
from .ppo import PPOTrainer as PPOTrainer
from .roles import RoleGroups as RoleGroups
from .roles import build_role_groups as build_role_groups
from .rollout_replacement import RolloutReplacement as RolloutReplacement
from .sft import SFTTrainer as SFTTrainer
from .sync_actor import SyncActorWorker as SyncActorWorker
