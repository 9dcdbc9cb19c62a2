"""Order statistics for step times and trial ratios: medians and spreads, no distribution assumed."""
import statistics


def quantile(values, q):
    """Linear interpolation between closest ranks (numpy's default), q in [0, 1]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values):
    """Median and spread of a sample: p10/p90 and min/max, plus the p10-p90 width relative to the median."""
    values = list(values)
    median = statistics.median(values)
    p10, p90 = quantile(values, 0.10), quantile(values, 0.90)
    return {
        "n": len(values),
        "median": median,
        "p10": p10,
        "p90": p90,
        "min": min(values),
        "max": max(values),
        "rel_spread_p10_p90": (p90 - p10) / median if median else None,
    }


def paired_ratios(numerators, denominators):
    """Ratio per pair (A_i / B_i) and the median of those ratios; unpaired leftovers are ignored."""
    ratios = [a / b for a, b in zip(numerators, denominators) if a is not None and b]
    return {
        "per_pair": ratios,
        "median": statistics.median(ratios) if ratios else None,
        "min": min(ratios) if ratios else None,
        "max": max(ratios) if ratios else None,
    }
