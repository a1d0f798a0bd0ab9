"""Everything ``coordinator/ui`` serves, for the application to include in one line."""

from __future__ import annotations

from fastapi import APIRouter

from coordinator.ui import console, docs

router = APIRouter(include_in_schema=False)
router.include_router(console.router)
router.include_router(docs.router)
