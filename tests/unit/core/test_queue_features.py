"""Each queue feature owns its ``x-`` arguments (:mod:`leveret.core.queues.features`,
LavinMQ's ``Queue::Feature::*``): the keys it declares are the ones it checks, and no
two features claim the same key."""

from __future__ import annotations

import pytest

from leveret.core.errors import PreconditionFailed
from leveret.core.queue_config import Arguments
from leveret.core.queues.features import CONFIGURED, build

WHERE = " for queue 'q' in vhost '/'"
KEYED = [(feature.__name__.rpartition(".")[2], key) for feature in CONFIGURED for key in feature.KEYS]


def test_no_two_features_claim_a_key():
    keys = [key for _, key in KEYED]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("feature,key", KEYED)
def test_a_feature_refuses_an_invalid_value_of_each_of_its_keys(feature, key):
    owner = next(f for f in CONFIGURED if f.__name__.endswith("." + feature))
    arguments = {"x-" + key: {"not": "valid"}}
    with pytest.raises(PreconditionFailed) as info:
        owner.configure(Arguments(arguments, None, WHERE))
    assert f"'x-{key}'" in info.value.text
    with pytest.raises(PreconditionFailed) as whole:
        build(arguments, None, WHERE)
    assert whole.value.text == info.value.text


@pytest.mark.parametrize("feature,key", KEYED)
def test_other_features_ignore_a_key_they_do_not_own(feature, key):
    arguments = {"x-" + key: {"not": "valid"}}
    for other in CONFIGURED:
        if not other.__name__.endswith("." + feature):
            other.configure(Arguments(arguments, None, WHERE))  # does not raise
