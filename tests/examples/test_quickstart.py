"""The README's quickstart runs as written against a real broker and coordinator."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


async def test_quickstart_processes_every_record_with_two_members(
    kafka_bootstrap: str, coordinator_url: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.quickstart",
        "--bootstrap",
        kafka_bootstrap,
        "--coordinator",
        coordinator_url,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()[-2000:]
    match = re.search(r"processed (\d+) records of one partition", stdout.decode())
    assert match is not None, stdout.decode()
    assert int(match.group(1)) >= 200


def test_readme_quotes_the_quickstart() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "examples.quickstart" in readme
    assert "KeyrangeConsumer(" in readme
