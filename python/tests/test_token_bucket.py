"""The token bucket comes from the library (mb_token_bucket): the Python binding keys its
loaded layers by the same power of two that the cache keys tuned tiles by."""
import pytest

import moeblaze
from moeblaze import _capi as C


@pytest.mark.parametrize("tokens,bucket", [(0, 1), (1, 1), (2, 2), (3, 4), (4096, 4096), (4097, 8192),
                                           (2 ** 62, 2 ** 62)])
def test_token_bucket_is_the_next_power_of_two(tokens, bucket):
    assert C.token_bucket(tokens) == bucket


@pytest.mark.parametrize("tokens", [-1, 2 ** 62 + 1])
def test_token_bucket_refuses_what_has_no_bucket(tokens):
    with pytest.raises(moeblaze.InvalidArgument) as e:
        C.token_bucket(tokens)
    assert e.value.argument == "tokens"
