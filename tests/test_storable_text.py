"""No 5xx on any string: text Postgres cannot store (NUL, an unpaired surrogate) in any string
field of any request is a 400 naming the field, refused at validation.

The fields are found in the OpenAPI document, so a field added to a request model is walked
without touching this test; each operation has one valid example request here, and an
operation or a field the example does not hold fails the test until it is added."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from coordinator.app import create_app
from tests.fixtures.coordinator import settings_for_tests

Location = tuple[str | int, ...]

OPENAPI = create_app(settings_for_tests(), "postgresql+asyncpg://unused/unused").openapi()

# A valid request of every operation that takes a body, with every optional field present.
EXAMPLE_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/groups/{group_id}/offsets/commit"): {
        "member_id": "m-1",
        "member_epoch": 1,
        "partitions": [{"topic": "orders", "partition": 0, "offset": 5, "metadata": "m"}],
    },
    ("post", "/v1/groups/{group_id}/heartbeat"): {
        "member_id": "m-1",
        "member_epoch": 0,
        "instance_id": "worker-1",
        "client_id": "client",
        "subscribed_topics": ["orders"],
        "subscribed_topic_regex": "orders.*",
        "assignor": "range",
        "allow_individual_commit": True,
        "session_timeout_ms": 3_000,
        "owned": [{"topic": "orders", "partition": 0, "ranges": [[0, 9]]}],
        "stuck": [
            {"topic": "orders", "partition": 0, "key_hash": 5, "offset": 3, "running_s": 1.5}
        ],
        "endpoint": "http://worker-1:7070",
        "standbys": [{"topic": "orders", "partition": 1, "ranges": [[0, 9]]}],
    },
    ("post", "/v1/admin/groups/{group_id}/offsets/reset"): {
        "topic": "orders",
        "partitions": [0],
        "to_datetime": "2026-01-01T00:00:00Z",
    },
    ("post", "/v1/groups/{group_id}/offsets/out-of-range-reset"): {
        "member_id": "m-1",
        "member_epoch": 1,
        "partitions": [{"topic": "orders", "partition": 0, "offset": 5}],
    },
    ("put", "/v1/admin/topics/{topic}/config"): {"accept_range_fetch": True},
    ("put", "/v1/admin/config"): {"accept_individual_commit": True},
}
EXAMPLE_PARAMETERS = {"group_id": "storable", "topic": "orders", "member_id": "m-1"}

# NUL is refused by Postgres in text; an unpaired surrogate, sent as a JSON escape, has no
# UTF-8 form for the driver to send.
UNSTORABLE_JSON = {"NUL": '"a\\u0000b"', "lone surrogate": '"a\\ud800b"'}


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = OPENAPI["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def string_locations(schema: dict[str, Any], at: Location = ()) -> Iterator[Location]:
    """Where in an instance of ``schema`` a string can sit; array items at index 0."""
    schema = _resolve(schema)
    if schema.get("type") == "string":
        yield at
    for alternative in (
        *schema.get("anyOf", ()),
        *schema.get("oneOf", ()),
        *schema.get("allOf", ()),
    ):
        yield from string_locations(alternative, at)
    for name, field in schema.get("properties", {}).items():
        yield from string_locations(field, (*at, name))
    if isinstance(schema.get("items"), dict):
        yield from string_locations(schema["items"], (*at, 0))
    for index, item in enumerate(schema.get("prefixItems", ())):
        yield from string_locations(item, (*at, index))


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in OPENAPI["paths"].items():
        for method, operation in methods.items():
            yield method, path, operation


def body_cases() -> list[Any]:
    cases = []
    for method, path, operation in operations():
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            continue
        for at in dict.fromkeys(string_locations(body["schema"])):
            name = f"{method.upper()} {path} {'.'.join(map(str, at))}"
            cases.append(pytest.param(method, path, at, id=name))
    return cases


def parameter_cases() -> list[tuple[str, str, str, str]]:
    return [
        (method, path, parameter["in"], parameter["name"])
        for method, path, operation in operations()
        for parameter in operation.get("parameters", ())
        if any(True for _ in string_locations(parameter["schema"]))
    ]


def with_marker(body: dict[str, Any], at: Location) -> dict[str, Any]:
    """``body`` with a marker string at ``at``, which must already hold a value."""
    changed = copy.deepcopy(body)
    container: Any = changed
    for step in at[:-1]:
        container = container[step]
    last = at[-1]
    held = last in container if isinstance(container, dict) else int(last) < len(container)
    assert held, f"the example request lacks {'.'.join(map(str, at))}: add it"
    container[last] = "\x01MARKER\x01"
    return changed


def concrete(path: str, **overrides: str) -> str:
    values = {**EXAMPLE_PARAMETERS, **overrides}
    return path.format(**{name: quote(value, safe="") for name, value in values.items()})


def test_the_walk_finds_the_free_text_fields() -> None:
    found = {(path, ".".join(map(str, at))) for _, path, at in (c.values for c in body_cases())}
    assert ("/v1/groups/{group_id}/offsets/commit", "partitions.0.metadata") in found
    assert ("/v1/groups/{group_id}/heartbeat", "subscribed_topic_regex") in found
    assert ("/v1/groups/{group_id}/heartbeat", "owned.0.topic") in found
    assert any(name == "member_id" for _, _, _, name in parameter_cases())


@pytest.mark.parametrize(("method", "path"), sorted(EXAMPLE_BODIES))
async def test_every_example_is_a_valid_request(
    api: httpx.AsyncClient, method: str, path: str
) -> None:
    reply = await api.request(method, concrete(path), json=EXAMPLE_BODIES[(method, path)])
    assert reply.status_code != 400, reply.text
    assert reply.status_code < 500, reply.text


@pytest.mark.parametrize("value", sorted(UNSTORABLE_JSON))
@pytest.mark.parametrize(("method", "path", "at"), body_cases())
async def test_unstorable_text_in_any_body_field_is_a_400_naming_it(
    api: httpx.AsyncClient, method: str, path: str, at: Location, value: str
) -> None:
    example = EXAMPLE_BODIES.get((method, path))
    assert example is not None, f"add an example request for {method.upper()} {path}"
    marked = json.dumps(with_marker(example, at))
    content = marked.replace(json.dumps("\x01MARKER\x01"), UNSTORABLE_JSON[value])
    reply = await api.request(
        method, concrete(path), content=content, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400, reply.text
    problem = reply.json()
    assert problem["error"] == "INVALID_REQUEST"
    assert reply.headers["content-type"] == "application/problem+json"
    # Either the field is named, or the JSON parser refused the escape for the whole body.
    field = ".".join(map(str, ("body", *at)))
    assert {error["loc"] for error in problem["errors"]} & {field, "body"}, problem


@pytest.mark.parametrize(("method", "path", "where", "name"), parameter_cases())
async def test_nul_in_any_path_or_query_parameter_is_a_400_naming_it(
    api: httpx.AsyncClient, method: str, path: str, where: str, name: str
) -> None:
    body = EXAMPLE_BODIES.get((method, path))
    if where == "path":
        url, params = concrete(path, **{name: "a\x00b"}), {}
    else:
        url, params = concrete(path), {name: "a\x00b"}
    reply = await api.request(method, url, params=params, json=body)
    assert reply.status_code == 400, reply.text
    assert any(error["loc"].startswith(f"{where}.{name}") for error in reply.json()["errors"])
