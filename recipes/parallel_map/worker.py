"""``WordCountWorker``: one rank of the map step."""

from __future__ import annotations

from hf_controller import Dispatch, Worker, register
from recipes.parallel_map.counts import WordCounts, count_files
from recipes.parallel_map.files import FileList


class WordCountWorker(Worker):
    """Counts the words, lines and bytes of the files it is given.

    The group call ``group.count_words(files)`` splits ``files`` into one balanced
    part per worker (``DP_COMPUTE_PROTO``), every worker counts its part in its
    own process, and the per-worker ``WordCounts`` are merged by
    ``WordCounts.concat`` on the way back: map on the workers, reduce in collect.
    """

    @register(Dispatch.DP_COMPUTE_PROTO)
    def count_words(self, files: FileList) -> WordCounts:
        """Counts over this worker's share of ``files`` (an empty share counts nothing)."""
        return count_files(files.paths)
