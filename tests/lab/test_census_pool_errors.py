"""The census names a failed worker call in one line, with the cause where the exception's first line is a
preamble: torch's weights-only unpickler says "Weights only load failed." first and the global it refused lines
later."""

import dataclasses
import pickle

import pytest
import torch

from d3ray.lab.census.pool import _cause_line
from d3ray.safe_load import load_data


@dataclasses.dataclass
class Foreign:
    value: int


def test_a_refused_global_is_named_in_the_line(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"x": Foreign(3)}, path)
    with pytest.raises(pickle.UnpicklingError) as caught:
        load_data(path)
    line = _cause_line(str(caught.value))
    assert line.startswith("Weights only load failed.")
    assert "Foreign" in line and "\n" not in line


def test_a_one_line_error_stays_as_it_is():
    assert _cause_line("boom") == "boom"
    assert _cause_line("  \n") == ""
    assert _cause_line("first\nsecond") == "first"  # no line naming a cause: the first alone
