"""Keywords of each source by TF-IDF over the agent's sources: deterministic, no model involved.

A word scores by how often it occurs in the source (relative to the source's length) times how rare it is among the
agent's sources (smoothed inverse document frequency), so a word every source uses still counts, less. Ties break
alphabetically, so the same sources always give the same keywords.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from switchboard.core.memory.store import terms

__all__ = ["KEYWORDS_PER_SOURCE", "STOPWORDS", "keywords"]

KEYWORDS_PER_SOURCE = 8

_STOPWORDS = """
    a about above after again against all also am an and any are aren as at be because been before being below
    between both but by can could did do does doing done down during each either else etc even ever every few for
    from further get gets got had has have having he her here hers herself him himself his how however i if in into
    is isn it its itself just let like made make many may me might more most much must my myself need no nor not now
    of off often on once one only or other our ours ourselves out over own page pages per same shall she should since
    so some such than that the their theirs them themselves then there these they this those through thus to too
    under until up upon us use used using very via was we were what when where whether which while who whom whose
    why will with within without would yes yet you your yours yourself yourselves
"""

STOPWORDS = frozenset(_STOPWORDS.split())
"""English function words, never keywords."""


def _words(text: str) -> list[str]:
    return [w for w in terms(text) if len(w) > 2 and not w.isdigit() and w not in STOPWORDS and not w[0].isdigit()]


def keywords(texts: Mapping[str, str], count: int = KEYWORDS_PER_SOURCE) -> dict[str, list[str]]:
    """The ``count`` best TF-IDF keywords of each text of ``texts`` (by key), best first, among all of ``texts``."""
    words = {key: _words(text) for key, text in texts.items()}
    frequency: Counter[str] = Counter()
    for found in words.values():
        frequency.update(set(found))
    total = len(texts)
    out: dict[str, list[str]] = {}
    for key, found in words.items():
        counts = Counter(found)
        length = len(found) or 1
        scored = [
            (counts[word] / length * (math.log((1 + total) / (1 + frequency[word])) + 1.0), word) for word in counts
        ]
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        out[key] = [word for _, word in scored[:count]]
    return out
