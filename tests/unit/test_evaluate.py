"""Held-out metrics per data source: a validation file that mixes sources is reported under each source's key."""

from recipe.engine import SpecCounters
from recipe.evaluate import EvalResult, by_data_source


def test_a_mixed_held_out_set_is_scored_per_data_source():
    samples = [
        {"acc": True, "data_source": "tiny_sum"},
        {"acc": False, "data_source": "tiny_sum"},
        {"acc": True, "data_source": "word_problems"},
        {"acc": True, "data_source": "word_problems"},
        {"acc": True, "data_source": "word_problems"},
        {"acc": False, "data_source": "word_problems"},
    ]
    result = EvalResult(
        pass_at_1=4 / 6, num_problems=3, samples_per_problem=2, mean_response_tokens=0.0,
        response_lengths=[10, 20, 1, 2, 3, 6], spec=SpecCounters(), seconds=1.0, samples=samples,
    )  # fmt: skip
    assert by_data_source(result) == {"tiny_sum": (0.5, 15.0), "word_problems": (0.75, 3.0)}
