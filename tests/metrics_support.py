"""Reading a scrape back through Prometheus' own parser (prometheus_client, a test-only dependency)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _base(name: str) -> str:
    # The parser names counter samples `<family>_total` whether or not the exposition did
    # (Triton's counters have no suffix): compare names without it.
    return name.removesuffix("_total")


def parse_samples(text: str) -> Samples:
    """Every sample of a valid exposition (the parser raises on an invalid one)."""
    return {
        (_base(s.name), frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(_base(name), frozenset(labels.items()))]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == _base(name) and want <= ls)


def counter_samples(text: str) -> Samples:
    """The samples that must never decrease: counters and histogram buckets, sums and counts."""
    kept = {}
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "histogram"):
            for s in family.samples:
                kept[(_base(s.name), frozenset(s.labels.items()))] = s.value
    return kept
