"""``/docs`` works without internet: the page and every asset it references come from the
coordinator itself, over loopback."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx

from tests.ui.conftest import LiveConsole


class References(HTMLParser):
    """Every URL a page makes the browser fetch: scripts, stylesheets, icons, images, and
    the OpenAPI document the start-up script reads from ``data-openapi-url``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name in ("src", "href", "data-openapi-url"):
                self.urls.append(value)


async def test_the_docs_page_and_everything_it_references_come_from_loopback(
    live_console: LiveConsole,
) -> None:
    async with httpx.AsyncClient(base_url=live_console.url) as loopback:
        page = await loopback.get("/docs")
        assert page.status_code == 200
        references = References()
        references.feed(page.text)
        assert len(references.urls) >= 4, references.urls
        origin = urlsplit(live_console.url).netloc
        for reference in references.urls:
            url = urljoin(f"{live_console.url}/docs", reference)
            assert urlsplit(url).netloc == origin, f"{reference} is not served by the coordinator"
            asset = await loopback.get(url)
            assert asset.status_code == 200, url
            assert asset.content, url
        bundle = await loopback.get("/docs/assets/swagger-ui-bundle.js")
        assert "SwaggerUIBundle" in bundle.text
        schema = await loopback.get("/openapi.json")
        assert schema.json()["info"]["title"] == "Keyrange coordinator"


async def test_the_docs_start_up_script_asks_no_validator_on_the_internet(
    live_console: LiveConsole,
) -> None:
    script = (await live_console.api.get("/docs/assets/docs.js")).text
    assert "validatorUrl: null" in script
    assert "http" not in script


async def test_redoc_is_not_served_since_its_assets_would_come_from_a_cdn(
    live_console: LiveConsole,
) -> None:
    assert (await live_console.api.get("/redoc")).status_code == 404
    assert (await live_console.api.get("/docs/assets/index.html")).status_code == 404
