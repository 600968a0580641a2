"""Binding ``properties_key`` as RabbitMQ's rabbit_mgmt_format packs it, and the list
query parameters (``sort``, ``columns``, paging) on plain rows, without a server."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from leveret.management.listing import shape
from leveret.management.resources import args_hash, properties_key, unpack_properties


@pytest.mark.parametrize(("key", "args", "packed"), [
    ("", {}, "~"),
    ("q1", {}, "q1"),
    ("a b~c", {}, "a+b%7Ec"),  # form-quoted, and ~ quoted as %7E (RabbitMQ's test cases)
    ("eu.*", {}, "eu.%2A"),
    ("a/b", {}, "a%2Fb"),
])
def test_properties_key_without_arguments(key, args, packed):
    assert properties_key(key, args) == packed
    assert unpack_properties(packed) == (key, None)


def test_properties_key_with_arguments_appends_a_stable_hash():
    packed = properties_key("k", {"x": 1, "y": "z"})
    key, _, digest = packed.partition("~")
    assert key == "k" and len(digest) == 6 and "=" not in digest
    assert digest == args_hash({"y": "z", "x": 1})  # order of keys does not matter
    assert digest != args_hash({"x": 2, "y": "z"})
    assert properties_key("", {"x": 1}).startswith("~")
    assert unpack_properties(packed) == ("k", digest)
    assert unpack_properties("a~b~c") is None


def _answer(query: str, rows: list[dict], pageable: bool = True):
    return shape(dict(parse_qsl(query)), rows, pageable)


ROWS = [{"name": "b", "n": {"v": 2}}, {"name": "a", "n": {"v": 3}}, {"name": "c"}]


def test_sort_by_a_dotted_path_puts_missing_values_first():
    assert [r["name"] for r in _answer("sort=n.v", ROWS)] == ["c", "b", "a"]
    assert [r["name"] for r in _answer("sort=n.v&sort_reverse=true", ROWS)] == ["a", "b", "c"]


def test_columns_keep_nested_fields():
    assert _answer("columns=name,n.v", ROWS) == [{"name": "b", "n": {"v": 2}}, {"name": "a", "n": {"v": 3}},
                                                 {"name": "c"}]


def test_an_empty_list_pages_to_one_empty_page():
    assert _answer("page=1", []) == {"filtered_count": 0, "item_count": 0, "items": [], "page": 1,
                                     "page_count": 0, "page_size": 100, "total_count": 0}


def test_paging_is_ignored_where_rabbitmq_does_not_page():
    assert _answer("page=2&page_size=1", ROWS, pageable=False) == ROWS
