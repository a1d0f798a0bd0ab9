"""``/docs``: Swagger UI served from the ``swagger-ui-bundle-v2`` package, so the API docs
work on a cluster without internet (FastAPI's own page loads Swagger UI from a CDN)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException
from swagger_ui_bundle import swagger_ui_path

from coordinator.ui.pages import STATIC_DIR, templates

# The files of the Swagger UI distribution the page uses, and our own start-up script (Swagger
# UI's shipped one points at a demo API on the internet).
DOCS_ASSETS = {
    "swagger-ui.css": ("text/css", swagger_ui_path / "swagger-ui.css"),
    "swagger-ui-bundle.js": ("text/javascript", swagger_ui_path / "swagger-ui-bundle.js"),
    "favicon-32x32.png": ("image/png", swagger_ui_path / "favicon-32x32.png"),
    "docs.js": ("text/javascript", STATIC_DIR / "docs.js"),
}
# Swagger UI styles its elements inline and shows images as data: URLs; everything else stays
# on this origin.
DOCS_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)


@router.get("/docs", response_class=HTMLResponse)
async def docs_page(request: Request) -> HTMLResponse:
    base = request.scope.get("root_path", "")
    page = templates.get_template("docs.html").render(
        base=base,
        title=request.app.title,
        openapi_url=base + (request.app.openapi_url or "/openapi.json"),
    )
    return HTMLResponse(page, headers={"Content-Security-Policy": DOCS_POLICY})


@router.get("/docs/assets/{name}")
async def docs_asset(name: str) -> FileResponse:
    asset = DOCS_ASSETS.get(name)
    if asset is None:
        raise HTTPException(404, f"no docs asset named '{name}'")
    media_type, path = asset
    return FileResponse(str(path), media_type=media_type, headers={"Cache-Control": "no-cache"})
