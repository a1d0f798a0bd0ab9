"""The README's quickstart runs as written against a real broker and coordinator."""

from __future__ import annotations

import ast
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
    output = stdout.decode()
    match = re.search(r"processed (\d+) records of one partition: (\{.*\})", output)
    assert match is not None, output
    assert int(match.group(1)) >= 200
    per_member = ast.literal_eval(match.group(2))
    assert set(per_member) == {"alice", "bob"}, output  # both shared the partition
    assert all(count > 0 for count in per_member.values()), output
    shares = re.findall(
        r"^(alice|bob) owns key hashes .* \((\d+)% of the key space\)$", output, re.M
    )
    assert sorted(name for name, _ in shares) == ["alice", "bob"], output
    assert sum(int(percent) for _, percent in shares) == 100, output


def test_readme_quotes_the_quickstart() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "examples.quickstart" in readme
    assert "KeyrangeConsumer(" in readme
