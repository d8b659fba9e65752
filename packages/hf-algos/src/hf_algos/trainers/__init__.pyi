# The one list of hf_algos.trainers's public names: type checkers read it as the package's
# stub, and lazy_loader.attach_stub (in __init__.py) imports each name from its module on
# first use.
from .dpo import DPOTrainer as DPOTrainer
from .lifecycle.trainer import RestartsExhaustedError as RestartsExhaustedError
from .lifecycle.trainer import Trainer as Trainer
from .ppo.trainer import PPOTrainer as PPOTrainer
from .roles.groups import RoleGroups as RoleGroups
from .roles.groups import build_role_groups as build_role_groups
from .roles.protocols import ActorGroup as ActorGroup
from .roles.protocols import CriticGroup as CriticGroup
from .roles.protocols import ReferenceGroup as ReferenceGroup
from .roles.protocols import RewardModelGroup as RewardModelGroup
from .roles.protocols import RewardScorer as RewardScorer
from .roles.protocols import RolloutGroup as RolloutGroup
from .roles.self_healing import RolloutReplacement as RolloutReplacement
from .roles.sync_actor import SyncActorWorker as SyncActorWorker
from .sft import SFTTrainer as SFTTrainer
