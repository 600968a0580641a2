"""The web console's files, served by the management HTTP server: ``GET /`` is the
page, ``/console/...`` its script and style (plain files: no build step). The page talks
to the API under ``/api`` with the login session of :mod:`.sessions`."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

CONSOLE_PREFIX = "/console"
FILES = Path(__file__).with_name("console")


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(FILES / "index.html", headers={"Cache-Control": "no-cache"})


def console_routes() -> list[web.AbstractRouteDef]:
    """``/`` and the static files under :data:`CONSOLE_PREFIX`."""
    return [web.get("/", _index), web.static(CONSOLE_PREFIX, FILES)]
