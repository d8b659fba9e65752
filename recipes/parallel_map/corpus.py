"""A synthetic text corpus, so the recipe runs on a fresh machine with no data.

Words are drawn from a fixed made-up vocabulary with Zipf-like frequencies (the
word of rank ``r`` is about ``1 / r**1.1`` as frequent as the most common one,
as in natural text), arranged in sentences of 6 to 17 words, one per line,
capitalised, with a comma and a full stop. The same arguments always give the
same bytes, so counts can be checked across runs and machines.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from recipes.parallel_map.files import FileList

VOCABULARY_SIZE = 20_000
ZIPF_EXPONENT = 1.1
MANIFEST = "MANIFEST.json"
SENTENCE_LENGTHS = tuple(range(6, 18))
# Common words with apostrophes, so the tokeniser's rule for them is exercised.
CONTRACTIONS = ("it's", "don't", "can't", "o'clock", "we're")
# Open consonant-vowel syllables ("kiraku", "tomesan"): text-like, clearly made up.
_ONSETS = ("k", "s", "t", "n", "h", "m", "y", "r", "w", "g", "d", "b", "p")
_VOWELS = ("a", "i", "u", "e", "o")
_CODAS = ("", "", "", "", "n")


def make_vocabulary(size: int, seed: int) -> list[str]:
    """``size`` distinct lower-case pseudo-words, most frequent first; fixed by ``seed``."""
    rng = random.Random(f"vocabulary-{seed}")
    words = set(CONTRACTIONS)
    ordered = list(CONTRACTIONS)
    while len(ordered) < size:
        syllables = rng.choice((1, 2, 2, 2, 3, 3, 3, 4))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if word not in words:
            words.add(word)
            ordered.append(word)
    # Interleave the contractions among the frequent words instead of ranks 1-5.
    head = ordered[len(CONTRACTIONS) : len(CONTRACTIONS) * 8]
    for index, contraction in enumerate(CONTRACTIONS):
        head.insert(index * 6 + 3, contraction)
    return head + ordered[len(CONTRACTIONS) * 8 :]


def zipf_cumulative_weights(size: int, exponent: float) -> list[float]:
    """Cumulative weights ``sum(1 / r**exponent for r <= rank)`` for ranks ``1 .. size``."""
    return list(itertools.accumulate(1.0 / rank**exponent for rank in range(1, size + 1)))


def write_corpus_file(
    path: Path, target_bytes: int, vocabulary: list[str], cum_weights: list[float], seed: str
) -> None:
    """Write sentences of random words to ``path`` until it holds about ``target_bytes``."""
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < target_bytes:
        # Drawn a thousand sentences at a time: one call per word would be several times slower.
        lengths = rng.choices(SENTENCE_LENGTHS, k=1000)
        words = rng.choices(vocabulary, cum_weights=cum_weights, k=sum(lengths))
        start = 0
        for length in lengths:
            middle, end = start + length // 2, start + length
            line = " ".join(words[start:middle]) + ", " + " ".join(words[middle:end]) + ".\n"
            lines.append(line[0].upper() + line[1:])
            size += len(line)  # the vocabulary is ASCII: characters are bytes
            start = end
            if size >= target_bytes:
                break
    path.write_text("".join(lines), encoding="ascii")


def generate_corpus(directory: str | Path, num_files: int, megabytes: float, seed: int) -> FileList:
    """Write ``num_files`` files totalling about ``megabytes`` MB into ``directory``.

    A corpus already there with the same arguments (recorded in ``MANIFEST.json``)
    is reused rather than written again. Returns the files in name order.
    """
    root = Path(directory)
    wanted = {"num_files": num_files, "megabytes": megabytes, "seed": seed}
    names = [f"part-{index:05d}.txt" for index in range(num_files)]
    manifest = root / MANIFEST
    complete = manifest.is_file() and all((root / name).is_file() for name in names)
    if complete and json.loads(manifest.read_text()) == wanted:
        return FileList(tuple(str((root / name).resolve()) for name in names))
    root.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)  # written last: a half-written corpus is never reused
    for stale in root.glob("part-*.txt"):
        stale.unlink()
    vocabulary = make_vocabulary(VOCABULARY_SIZE, seed)
    cum_weights = zipf_cumulative_weights(VOCABULARY_SIZE, ZIPF_EXPONENT)
    per_file = max(1, int(megabytes * 1e6 / num_files))
    for index, name in enumerate(names):
        write_corpus_file(root / name, per_file, vocabulary, cum_weights, f"{seed}-{index}")
    manifest.write_text(json.dumps(wanted))
    return FileList(tuple(str((root / name).resolve()) for name in names))
