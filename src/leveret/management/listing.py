"""RabbitMQ's list query parameters, one helper for every list endpoint.

``sort`` (a dotted path into each item, e.g. ``arguments.x-max-length``; items without
it come first), ``sort_reverse=true``, ``columns`` (comma-separated dotted paths: only
those fields are kept, nested as in the item) apply to every list. Endpoints RabbitMQ
pages (queues, exchanges, connections, channels) also take ``page`` (from 1),
``page_size`` (default 100, at most 500), ``name`` (a case-insensitive substring of the
item's name, or with ``use_regex=true`` a case-insensitive regular expression); with
``page`` the answer is ``{total_count, item_count, filtered_count, page, page_size,
page_count, items}``. Errors are RabbitMQ 3.10's 400 bodies (checked against a node).

Long lists (:func:`list_answer`: queues, connections, channels, consumers) are worked
in slices that give the event loop back (:mod:`.slicing`): only the rows of the page
asked for are built, sort keys are read straight from the objects for the fields
that allow it (``keys``: the queues' are :data:`.resources.QUEUE_KEYS`), and a list
without ``page`` is written out as it is made (chunked JSON), never held whole in one
turn of the loop.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from aiohttp import web

from .slicing import Slicer

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
#: A list without ``page`` longer than this is written out in chunks as it is made.
STREAM_ABOVE = 200
#: Rows made between two looks at the clock in a streamed list (a chunk is written
#: each time a slice is used up).
STREAM_CHUNK = 16
#: Rows written in one chunk at most (their JSON is made in one go: ~3 ms for 256).
STREAM_ROWS = 256
_MISSING = object()


def _error(error: str, reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": error, "reason": reason}), content_type="application/json"
    )


def dotted(item: Any, path: str) -> Any:
    """The value at ``path`` (``a.b.c``) in nested dicts, or ``_MISSING``."""
    for part in path.split("."):
        if not isinstance(item, dict) or part not in item:
            return _MISSING
        item = item[part]
    return item


def _sort_key(value: Any) -> tuple:
    """Mixed values in one order: missing, null, booleans, numbers, strings, others."""
    if value is _MISSING or value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, (int, float)):
        return (2, value)
    if isinstance(value, str):
        return (3, value)
    return (4, json.dumps(value, sort_keys=True, default=str))


def _columns(item: dict, paths: list[list[str]]) -> dict:
    """Only the fields at ``paths``; a path whose parent exists keeps the parent (so
    ``arguments.x`` on an item without ``x`` gives ``"arguments": {}``, as RabbitMQ)."""
    kept: dict = {}
    for parts in paths:
        source: Any = item
        target = kept
        for i, part in enumerate(parts):
            if not isinstance(source, dict) or part not in source:
                break
            source = source[part]
            if i == len(parts) - 1:
                target[part] = source
            else:
                target = target.setdefault(part, {})
                if not isinstance(source, dict):
                    break
    return kept


def _positive(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise _error("bad_request", "Pagination parameters are invalid") from None


def _name_filter(query: Mapping[str, str]) -> Any:
    name = query.get("name")
    if not name:
        return None
    if query.get("use_regex", "").lower() == "true":
        try:
            regex = re.compile(name, re.IGNORECASE)
        except re.error:
            raise _error("bad_request", "Pagination parameters are invalid") from None
        return lambda value: regex.search(value) is not None
    lowered = name.lower()
    return lambda value: lowered in value.lower()


def list_response(request: web.Request, items: Iterable[dict], pageable: bool = False) -> web.Response:
    """The JSON answer for a list of ``items`` (already in the endpoint's default
    order) after the request's ``sort``, ``sort_reverse``, ``columns`` and, when
    ``pageable``, ``page``/``page_size``/``name``/``use_regex`` (see the module doc)."""
    return web.json_response(shape(request.query, items, pageable))


def shape(query: Mapping[str, str], items: Iterable[dict], pageable: bool = False) -> Any:
    """What :func:`list_response` answers for the query parameters ``query``
    (HTTPBadRequest with RabbitMQ's body for bad paging)."""
    rows = list(items)
    sort = query.get("sort")
    reverse = query.get("sort_reverse", "").lower() == "true"
    if sort:
        rows.sort(key=lambda row: _sort_key(dotted(row, sort)), reverse=reverse)
    elif reverse:
        rows.reverse()
    paging = _page(query) if pageable else None
    answer: Any = rows
    if paging is not None:
        page, size = paging
        matches = _name_filter(query)
        filtered = [r for r in rows if matches(str(r.get("name", "")))] if matches else rows
        page_count = _page_count(page, size, len(filtered))
        answer = _paged(
            filtered[(page - 1) * size : page * size], len(filtered), page, page_count, size, len(rows)
        )
    columns = query.get("columns")
    if columns:
        paths = [c.split(".") for c in columns.split(",") if c]
        if isinstance(answer, dict):
            answer["items"] = [_columns(r, paths) for r in answer["items"]]
        else:
            answer = [_columns(r, paths) for r in answer]
    return answer


def _page(query: Mapping[str, str]) -> tuple[int, int] | None:
    """``(page, page_size)`` when ``page`` is given (RabbitMQ's 400s otherwise)."""
    page = _positive(query, "page")
    if page is None:
        return None
    size = _positive(query, "page_size")
    if page < 1 or (size is not None and not 1 <= size <= MAX_PAGE_SIZE):
        shown = "undefined" if size is None else size
        raise _error(
            "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page}, page size {shown}",
        )
    return page, size or DEFAULT_PAGE_SIZE


def _page_count(page: int, size: int, count: int) -> int:
    """Pages of ``size`` for ``count`` items (RabbitMQ's 400 if ``page`` is past the last)."""
    page_count = math.ceil(count / size)
    if count and page > page_count:
        raise _error("page_out_of_range", f"Page out of range, page: {page} page size: {size}, len: {count}")
    return page_count


def _paged(shown: list, filtered: int, page: int, page_count: int, size: int, total: int) -> dict:
    """RabbitMQ's answer for a page: ``shown`` items of ``filtered`` that match, of ``total``."""
    return {
        "filtered_count": filtered,
        "item_count": len(shown),
        "items": shown,
        "page": page,
        "page_count": page_count,
        "page_size": size,
        "total_count": total,
    }


def _row_name(row: dict | None) -> str:
    return str(row.get("name", "")) if row is not None else ""


async def list_answer(
    request: web.Request,
    items: Sequence[Any],
    row: Callable[[Any], dict | None],
    pageable: bool = False,
    name_of: Callable[[Any], str] | None = None,
    keys: Mapping[str, Callable[[Any], Any]] | None = None,
) -> web.Response:
    """What :func:`list_response` answers for the rows of ``items`` (handles in the
    endpoint's default order; ``row`` makes an item's row, None when it is gone since),
    made in slices (see the module doc). ``name_of``: an item's name, cheaply (for
    ``name``); ``keys``: for a ``sort`` path, the value the row would have there,
    read from the item (other paths build every row first)."""
    query = request.query
    slicer = Slicer()
    paging = _page(query) if pageable else None
    matches = _name_filter(query) if paging is not None else None
    sort = query.get("sort")
    reverse = query.get("sort_reverse", "").lower() == "true"
    columns = query.get("columns")
    paths = [c.split(".") for c in columns.split(",") if c] if columns else None
    cheap = (keys or {}).get(sort) if sort else None
    if sort and cheap is None:  # every row is needed for its key
        rows = [r for r in await slicer.map(row, items) if r is not None]
        items, row, name_of = rows, _same, _row_name
        path = sort
        cheap = lambda r: dotted(r, path)  # noqa: E731
    total_count = len(items)
    if matches is not None:
        named = name_of or (lambda item: _row_name(row(item)))
        items = await slicer.filter(lambda item: matches(named(item)), items)
    ordered: Iterator[Any]
    if sort and cheap is not None:
        read = cheap
        ordered = await slicer.sorted(items, lambda item: _sort_key(read(item)), reverse)
    else:
        ordered = reversed(items) if reverse else iter(items)
    if paging is not None:
        page, size = paging
        page_count = _page_count(page, size, len(items))
        low, high = (page - 1) * size, min(page * size, len(items))
        if sort:
            await slicer.take(ordered, low)  # the pages before
            chosen = await slicer.take(ordered, size)
        else:  # in the default order: read the page's items only
            count = len(items)
            indices = range(count - 1 - low, count - 1 - high, -1) if reverse else range(low, high)
            chosen = [items[i] for i in indices]
        shown = [r for r in map(row, chosen) if r is not None]
        if paths:
            shown = [_columns(r, paths) for r in shown]
        return web.json_response(_paged(shown, len(items), page, page_count, size, total_count))
    if len(items) <= STREAM_ABOVE:
        rows = [r for r in map(row, ordered) if r is not None]
        return web.json_response([_columns(r, paths) for r in rows] if paths else rows)
    return web.Response(body=_streamed(ordered, row, paths, slicer), content_type="application/json")


def _same(item: Any) -> Any:
    return item


async def _streamed(
    ordered: Iterator[Any], row: Callable[[Any], dict | None], paths: list[list[str]] | None, slicer: Slicer
) -> AsyncIterator[bytes]:
    """The JSON array of the rows of ``ordered``, a chunk per slice of work
    (the same bytes ``json.dumps`` gives for the whole list)."""
    yield b"["
    separator = ""
    exhausted = False
    dumps = json.dumps
    while not exhausted:
        # each row is made and turned into JSON at once, so no row outlives the next:
        # rows held across garbage collections would be promoted to the oldest
        # generation and bring on full collections (~1 s with 100,000 queues)
        texts: list[str] = []
        while not slicer.due() and len(texts) < STREAM_ROWS:
            batch = list(islice(ordered, STREAM_CHUNK))
            if not batch:
                exhausted = True
                break
            for item in batch:
                made = row(item)
                if made is not None:
                    texts.append(dumps(_columns(made, paths) if paths else made))
        if texts:
            yield (separator + ", ".join(texts)).encode()
            separator = ", "
        await slicer.pause()
    yield b"]"
