"""Calls to the admin routes. A failure becomes one line that names the error (the API's
error name, such as GROUP_NOT_EMPTY) and the coordinator asked, so a wrong ``--url`` or
``KEYRANGE_URL`` shows at once; never a stack trace."""

from __future__ import annotations

from typing import Any

import httpx

from coordinator.admin_cli.progress import Progress

# Where in the request a validation error sits: the CLI user typed an argument, not a path.
_REQUEST_PARTS = {"path", "query", "body", "header"}


class AdminError(Exception):
    """One line for the user, printed after ``keyrange: ``."""


class AdminApi:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def call(self, method: str, path: str, doing: str, **kwargs: Any) -> Any:
        """The reply's JSON body; ``doing`` is what the waiting line on a terminal says."""
        try:
            with Progress(f"{doing} at {self.url}"):
                response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AdminError(f"cannot reach the coordinator at {self.url}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success and body is not None:
            return body
        if isinstance(body, dict) and "error" in body:
            message = f"{body['error']}: {problem_detail(body)}"
        else:
            message = f"HTTP {response.status_code}"
        raise AdminError(f"{self.url} answered {message}")


def problem_detail(body: dict[str, Any]) -> str:
    """The problem's detail, with a validation error's field named as the argument it came
    from (``group_id``, not ``path.group_id``)."""
    errors = body.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        parts = str(errors[0].get("loc", "")).split(".")
        field = ".".join(parts[1:] if parts[0] in _REQUEST_PARTS else parts)
        message = str(errors[0].get("msg", ""))
        return f"{field}: {message}" if field else message
    return str(body.get("detail"))
