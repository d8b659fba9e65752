# The one list of hf_algos.data's public names: type checkers read it as the package's stub,
# and lazy_loader.attach_stub (in __init__.py) imports each name from its module on first use.
from .collate import collate_to_dataproto as collate_to_dataproto
from .files import DataError as DataError
from .files import RowSource as RowSource
from .files import read_rows as read_rows
from .files import write_rows as write_rows
from .loader import StatefulDataLoader as StatefulDataLoader
from .preference import PreferenceDataset as PreferenceDataset
from .preference import PreferenceDatasetConfig as PreferenceDatasetConfig
from .preference import collate_preference_pairs as collate_preference_pairs
from .preference_pairs import build_preference_pairs as build_preference_pairs
from .preference_pairs import make_preference_batch as make_preference_batch
from .reasoning_gym import ReasoningGymSpec as ReasoningGymSpec
from .reasoning_gym import reasoning_gym_rows as reasoning_gym_rows
from .rl_dataset import RLDataset as RLDataset
from .rl_dataset import RLDatasetConfig as RLDatasetConfig
from .sft import SFTDataset as SFTDataset
from .tokenizer import CHAR_CHAT_TEMPLATE as CHAR_CHAT_TEMPLATE
from .tokenizer import build_char_tokenizer as build_char_tokenizer
