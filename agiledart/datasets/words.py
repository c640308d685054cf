"""``words``: lines of text ``{"ts", "line"}`` over a fixed vocabulary, Zipf-distributed.

Word ranks follow a Zipf law (weight ``1 / rank**1.1``) like natural text, so a word
count has a few heavy hitters and a long tail; lines hold 4 to 14 words.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["VOCABULARY", "WordsMaker"]

Record = dict[str, Any]
Timestamps = np.ndarray[Any, np.dtype[np.int64]]

_TEXT = """
    the of and to in a is that for it as was with be by on not he this are or his from at
    which but have an they you were her she there been one all we their has would when if
    so no will more can out up who said what about into than them only other its time new
    some could these two may first then do any like my now over such our man me even most
    made after also did many before must through back years where much your way well down
    should because each just those people how too little state good very make world still
    own see men work long get here between both life being under never day same another
    know while last might us great old year off come since against go came right used take
    three stream edge peer sensor city river bridge signal data window route taxi cloud
"""
VOCABULARY = tuple(_TEXT.split())


class WordsMaker:
    def __init__(self, rng: np.random.Generator) -> None:
        w = 1.0 / np.arange(1, len(VOCABULARY) + 1) ** 1.1
        self.p = w / w.sum()
        self.vocab = list(VOCABULARY)

    def chunk(self, rng: np.random.Generator, first: int, ts: Timestamps) -> list[Record]:
        n = len(ts)
        lengths = rng.integers(4, 15, n)
        words = rng.choice(len(self.vocab), size=int(lengths.sum()), p=self.p).tolist()
        vocab = self.vocab
        out: list[Record] = []
        pos = 0
        for t, k in zip(ts.tolist(), lengths.tolist(), strict=True):
            out.append({"ts": t, "line": " ".join([vocab[w] for w in words[pos : pos + k]])})
            pos += k
        return out
