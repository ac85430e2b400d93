"""Input defects of the prediction API, against the validation functions: over-long JSON integers, booleans
as pixels or numbers, and form fields that Python's ``int`` would read but that are not plain decimals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from serving.config import ServingConfig
from serving.validation import RequestError, form_int, parse_json, parse_payload

SHAPE = (1, 28, 28)
CONFIG = ServingConfig(sigma=0.25, n=100, max_n=500, max_images=4, allow_client_seed=True)
IMAGE = json.dumps(np.full(SHAPE, 0.25).tolist())


def _refused(body: str) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_json(body.encode(), CONFIG, SHAPE)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("where", ["n", "seed", "pixel"])
@pytest.mark.parametrize("digits", [4301, 100_000])
def test_over_long_integers_are_a_400_not_a_crash(where, digits):
    """Python refuses to convert integer strings beyond 4300 digits with a ValueError (the 500 of old)."""
    number = "7" * digits
    body = {"n": f'{{"images": [{IMAGE}], "n": {number}}}',
            "seed": f'{{"images": [{IMAGE}], "seed": {number}}}',
            "pixel": f'{{"images": [{IMAGE.replace("0.25", number, 1)}]}}'}[where]
    error = _refused(body)
    assert f"{digits} digits" in error.message and "\n" not in error.message


def test_integers_of_normal_length_still_parse():
    request = parse_json(f'{{"images": [{IMAGE.replace("0.25", "1", 1)}], "n": 200, "seed": 9}}'.encode(),
                         CONFIG, SHAPE)
    assert (request.n, request.seed, float(request.images[0, 0, 0, 0])) == (200, 9, 1.0)
    long_pixel = "1" + "0" * 39  # 40 digits: parsed, then refused as a value above 1
    assert "pixel values must lie in [0, 1]" in _refused(f'{{"images": [{IMAGE.replace("0.25", long_pixel, 1)}]}}'
                                                          ).message


@pytest.mark.parametrize("literal", ["true", "false"])
def test_booleans_are_never_pixels(literal):
    """NumPy reads [true, 0.5] as [1.0, 0.5]: the server must not."""
    mixed = IMAGE.replace("0.25", literal, 1)
    assert np.asarray(json.loads(mixed)).dtype == np.float64  # what a plain conversion would accept
    assert "true/false" in _refused(f'{{"images": [{mixed}]}}').message
    all_booleans = json.dumps(np.full(SHAPE, literal == "true").tolist())
    assert "true/false" in _refused(f'{{"images": [{all_booleans}]}}').message


@pytest.mark.parametrize("field, value", [("n", True), ("n", False), ("seed", True), ("n", 100.0), ("seed", 1.5)])
def test_booleans_and_floats_are_never_numbers(field, value):
    with pytest.raises(RequestError, match=f"'{field}' must be an integer"):
        parse_payload({"images": [np.zeros(SHAPE).tolist()], field: value}, CONFIG, SHAPE)


@pytest.mark.parametrize("text", ["1_000", "+5", "-5", " 5", "5 ", "5\n", "\t5", "٣", "１２", "0x10", "1e3", "5.0",
                                  "", "9" * 41])
def test_form_integers_are_plain_decimals(text):
    """Each of these is accepted by Python's int() (except the empty and the hexadecimal) but is no plain decimal."""
    with pytest.raises(RequestError, match="plain decimal integer") as info:
        form_int(text, "n")
    assert info.value.status == 400


def test_form_integers_accept_plain_digits():
    assert form_int("1000", "n") == 1000 and form_int("007", "n") == 7 and form_int(None, "n") is None
    assert form_int("9" * 40, "seed") == int("9" * 40)  # length alone is fine; check_seed bounds the value
