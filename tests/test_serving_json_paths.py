"""The server's two JSON decoders give one result: orjson where ``fast_payload`` accepts the body, the standard
library's strict decoding otherwise. For every body, handwritten corner cases and generated ones, ``parse_json``
must return exactly what the strict path returns (the same request, pixels bit for bit) or refuse with the same
status and message."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.config import ServingConfig
from serving.validation import (
    _JSON_STRING,
    MAX_JSON_DEPTH,
    RequestError,
    fast_payload,
    json_depth,
    parse_json,
    parse_json_strict,
)

SHAPE = (1, 4, 4)
CONFIG = ServingConfig(sigma=0.25, n=100, max_n=500, max_images=4, allow_client_seed=True)
PIXELS = np.linspace(0.0, 1.0, 16).reshape(SHAPE)
IMAGE = json.dumps(PIXELS.tolist())


def _outcome(parse, *args):
    try:
        request = parse(*args)
    except RequestError as error:
        return ("refused", error.status, error.message)
    return ("parsed", request.images.dtype, request.images.shape, request.images.numpy().tobytes(), request.n,
            request.seed, request.radius, request.adaptive)


def _both(body: bytes):
    """(parse_json's outcome, the strict path's outcome), for a UTF-8 body within the depth limit."""
    assert json_depth(body) <= MAX_JSON_DEPTH
    return _outcome(parse_json, body, CONFIG, SHAPE), _outcome(parse_json_strict, body.decode(), CONFIG, SHAPE)


def _taken(body: bytes) -> bool:
    return fast_payload(body, _JSON_STRING.sub(b'""', body)) is not None


FAST = [  # bodies orjson decodes (fast_payload accepts them): what a client normally sends
    f'{{"images": [{IMAGE}]}}',
    f'{{"images": [{IMAGE}, {IMAGE}], "n": 200, "seed": 7}}',
    f'{{ "n" : 300 ,\n\t"images":[{IMAGE}], "radius": 0.25}}',
    f'{{"images": [{IMAGE}], "adaptive": true, "n": 500}}',
    f'{{"images": [{IMAGE}], "adaptive": false, "radius": null, "seed": null, "n": null}}',
    f'{{"images": [{IMAGE.replace("0.0", "0", 1).replace("1.0", "1E0", 1)}]}}',  # integer and exponent pixels
    f'{{"images": [{IMAGE.replace("0.0", "-0.0", 1)}]}}',
    f'{{"images": [{IMAGE.replace("0.0", "0.100000000000000005", 1)}]}}',  # 18 digits: more than a double holds
    f'{{"images": [{IMAGE.replace("0.0", "1.5", 1)}]}}',  # parsed, then refused: a value above 1
    f'{{"images": [[{IMAGE}]]}}',  # parsed, then refused: the shape
    '{"images": [[[1, 2], [3]]]}',  # ragged: NumPy fails, the strict conversion says why
    '{"images": []}',
    '{"images": 5}',
    "{}",
    f'{{"images": [{IMAGE}], "colour": 1}}',  # unknown field
    f'{{"images": [{IMAGE}], "n": 1.5}}',
    f'{{"images": [{IMAGE}], "n": true}}',  # a boolean as n: a top-level value, refused by check_n
    f'{{"images": [{IMAGE}], "seed": 123456789012345678}}',  # 18 digits
    f'{{"images": [{IMAGE.replace(", ", " ,  ").replace("[", "[ ")}]  ,\r\n "n" :\t200{" " * 100_000}}}',  # spaces
    f'{{"images": [{IMAGE.replace("0.0", "123456789012345678e-18", 1)}], "seed": 1234567890}}',  # 18 + 10 digits
]
STRICT = [  # bodies fast_payload leaves to the standard library, each for a reason of its own
    f'{{"images": [{IMAGE}], "n": 100, "n": 200}}',  # a duplicate key
    f'{{"images": [{IMAGE}], "n": 100, "\\u006e": 200}}',  # a duplicate key spelled with an escape
    f'{{"images": [{IMAGE}], "x": {{"n": 1}}}}',  # an object inside the object
    f'{{"images": [{IMAGE.replace("0.0", "true", 1)}]}}',  # a boolean among the pixels
    f'{{"images": [{IMAGE.replace("0.0", "false", 1)}], "adaptive": true}}',
    f'{{"images": [{IMAGE.replace("0.0", "null", 1)}]}}',
    f'{{"images": [{IMAGE.replace("0.0", chr(34) + "0.5" + chr(34), 1)}]}}',  # a string among the pixels
    f'{{"images": [{IMAGE}], "n": "100"}}',  # a string value
    f'{{"images": [{IMAGE}], "n": [true]}}',  # a literal that is not a top-level value
    f'{{"images": [{IMAGE.replace("0.0", "NaN", 1)}]}}',
    f'{{"images": [{IMAGE.replace("0.0", "-Infinity", 1)}]}}',
    f'{{"images": [{IMAGE.replace("0.0", "1e400", 1)}]}}',  # a double's overflow: orjson refuses, json gives inf
    f'{{"images": [{IMAGE}], "seed": 18446744073709551616}}',  # beyond 64 bits: orjson would give a float
    f'{{"images": [{IMAGE}], "seed": 1234567890123456789}}',  # 19 digits
    f'{{"images": [{IMAGE.replace("0.0", "0.1234567890123456789", 1)}]}}',  # 19 digits after the point
    f'{{"images": [{IMAGE}], "n": 100,}}',  # invalid JSON
    f'[{IMAGE}]',  # not an object
    '{"images": [[[[0.5]]]], "n": 01}',
]


@pytest.mark.parametrize("body", FAST)
def test_bodies_clients_send_take_the_fast_path_with_the_strict_result(body):
    body = body.encode()
    assert _taken(body)
    fast, strict = _both(body)
    assert fast == strict


@pytest.mark.parametrize("body", STRICT)
def test_unusual_bodies_take_the_strict_path(body):
    body = body.encode()
    assert not _taken(body)
    fast, strict = _both(body)
    assert fast == strict
    assert fast[0] == "refused" or '"seed"' in body.decode() or "0.1234567890123456789" in body.decode()


def test_the_fast_path_gives_the_strict_pixels_bit_for_bit():
    rng = np.random.default_rng(5)
    images = [rng.random(SHAPE).tolist() for _ in range(4)]
    images[1] = np.round(rng.random(SHAPE), 3).tolist()  # short decimals, as clients round them
    images[2] = (rng.random(SHAPE) > 0.5).astype(int).tolist()  # integers 0 and 1
    body = json.dumps({"images": images, "n": 300}).encode()
    assert _taken(body)
    request = parse_json(body, CONFIG, SHAPE)
    expected = torch.from_numpy(np.asarray(images, dtype=np.float64).astype(np.float32))
    assert torch.equal(request.images, expected)
    assert _both(body)[0] == _both(body)[1]


_CELLS = st.one_of(st.floats(0.0, 1.0), st.integers(0, 1), st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(-10**25, 10**25), st.booleans(), st.none(), st.text(max_size=3))
_FIELD_VALUES = st.one_of(st.integers(-10**22, 10**22), st.floats(allow_nan=False, allow_infinity=False),
                          st.booleans(), st.none(), st.text(max_size=4), st.just([1]), st.just({"a": 1}))


@st.composite
def _bodies(draw) -> bytes:
    """Request-like JSON bodies: images of mostly valid pixels with occasional odd cells, known and unknown fields
    (sometimes repeated, sometimes with escaped names), random whitespace, numbers written in several forms."""
    images = []
    for _ in range(draw(st.integers(0, 2))):
        cells = draw(st.lists(st.floats(0.0, 1.0), min_size=16, max_size=16))
        for index in draw(st.lists(st.integers(0, 15), max_size=2)):
            cells[index] = draw(_CELLS)
        images.append(np.array(cells, dtype=object).reshape(SHAPE).tolist())
    fields = [("images", images)]
    for name in draw(st.lists(st.sampled_from(["n", "seed", "radius", "adaptive", "n", "x"]), max_size=3)):
        value = draw(st.one_of(st.integers(1, 600), _FIELD_VALUES))
        fields.append((name, value))
    spacing = draw(st.sampled_from(["", " ", "\n\t "]))
    escaped = draw(st.booleans())
    parts = []
    for name, value in draw(st.permutations(fields)):
        key = json.dumps(name)
        if escaped and name == "n":
            key = '"\\u006e"'
        number_form = draw(st.sampled_from(["repr", "exponent"]))
        text = json.dumps(value)
        if number_form == "exponent" and isinstance(value, float) and np.isfinite(value):
            text = f"{value:.17e}"
        parts.append(f"{key}{spacing}:{spacing}{text}")
    return ("{" + ("," + spacing).join(parts) + "}").encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies())
def test_generated_bodies_get_the_same_answer_from_both_paths(body):
    fast, strict = _both(body)
    assert fast == strict


def test_orjson_reads_every_number_as_the_standard_library_does():
    """The fast path's premise for numbers: on 20,000 random literals of several forms (shortest round-trip reprs
    of random doubles, long decimal fractions, exponents down to subnormals and up to 1e308, integers below 19
    digits), orjson gives the same Python value, type and bit pattern as json."""
    import orjson

    rng = np.random.default_rng(11)
    doubles = rng.integers(0, 2**63, size=5000, dtype=np.uint64).view(np.float64)
    literals = [repr(float(x)) for x in doubles if np.isfinite(x)]
    literals += ["0." + "".join(map(str, rng.integers(0, 10, size=int(rng.integers(1, 18))))) for _ in range(5000)]
    literals += [f"{rng.integers(0, 10**9)}.{rng.integers(0, 10**9)}e{rng.integers(-330, 300)}" for _ in range(5000)]
    literals += [str(int(rng.integers(-10**17, 10**17))) for _ in range(4000)]
    literals += ["1e-400", "4.9e-324", "2.2250738585072014e-308", "1.7976931348623157e308", "-0", "-0.0", "0.1", "1"]
    text = "[" + ",".join(literals) + "]"
    fast, strict = orjson.loads(text), json.loads(text)
    assert len(fast) == len(strict) == len(literals)
    for literal, a, b in zip(literals, fast, strict, strict=True):
        assert type(a) is type(b) and np.array(a).tobytes() == np.array(b).tobytes(), literal
