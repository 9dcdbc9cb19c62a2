import pytest

from bench.stats import paired_ratios, quantile, summarize


def test_quantile_interpolates_between_ranks():
    assert quantile([4, 1, 3, 2], 0.5) == 2.5
    assert quantile([10, 20], 0.1) == pytest.approx(11.0)
    assert quantile([7], 0.9) == 7


def test_quantile_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_summarize_reports_median_and_spread():
    s = summarize([100.0, 110.0, 90.0, 300.0, 105.0])
    assert s["median"] == 105.0
    assert s["min"] == 90.0 and s["max"] == 300.0
    assert s["p10"] < s["median"] < s["p90"]
    assert s["rel_spread_p10_p90"] == pytest.approx((s["p90"] - s["p10"]) / 105.0)


def test_paired_ratios_pair_by_position_and_take_the_median():
    r = paired_ratios([2.0, 3.0, 10.0], [1.0, 2.0, 4.0])
    assert r["per_pair"] == [2.0, 1.5, 2.5]
    assert r["median"] == 2.0


def test_paired_ratios_skip_missing_values():
    r = paired_ratios([None, 4.0], [1.0, 2.0])
    assert r["per_pair"] == [2.0]
    assert paired_ratios([], [])["median"] is None
