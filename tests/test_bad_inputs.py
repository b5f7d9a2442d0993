"""Every bad input that got a clear error before the checks were shared still gets the same error."""

import json

import pytest
from bad_inputs import RECORD, probe_results

RECORDED = json.loads(RECORD.read_text())


@pytest.fixture(scope="module")
def results():
    return probe_results()


def test_the_record_covers_every_probe_and_every_probe_raised(results):
    assert set(RECORDED) == set(results)
    assert all(entry["error"] for entry in RECORDED.values())


@pytest.mark.parametrize("probe", sorted(RECORDED))
def test_bad_input_keeps_its_message(results, probe):
    error, message = results[probe]
    assert (error, message) == (RECORDED[probe]["error"], RECORDED[probe]["message"])
