"""Small self-contained tasks that the packaged configs train on, and the files they name.

The letter tasks (:mod:`hf_algos.examples.letter_tasks`, :mod:`.reverse_letters`, ...) make
their model, tokenizer and data on the spot; :mod:`hf_algos.examples.assets` gives the
packaged configs' ``${reverse_letters.*:...}`` resolvers, which name those files, and the
explicit step that makes them.
"""

from __future__ import annotations

from hf_algos.examples.assets import (
    AssetRequests,
    make_assets,
    register_resolvers,
    requested_assets,
)

__all__ = ["AssetRequests", "make_assets", "register_resolvers", "requested_assets"]
